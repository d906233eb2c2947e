#!/usr/bin/env bash
# two_nodes_netns.sh — `booster run` across two nodes for real: two network namespaces joined by a
# veth pair (10.203.0.1 and 10.203.0.2), one launcher per namespace with --nnodes 2 --node_rank k
# --master_addr 10.203.0.1, 2 ranks each (Gloo over the veth, GLOO_SOCKET_IFNAME set per node), and
# the same job as 4 local ranks on this machine. Every rank's trained parameters must be bitwise
# equal between the two jobs (the same Gloo ring over 4 ranks, the same data per global rank).
#
#   bash tests/multinode/two_nodes_netns.sh BUILD_DIR [CONFIG_OVERRIDE...]
#
# Then, when Debian's openssh-server is installed (scripts/install_deps.sh installs it), the same job
# a third time through `booster run --hostfile` run in the first namespace: an sshd on port 2222 in
# each namespace (keys, config and pid files in a temporary directory; each sshd sets the node's
# GLOO_SOCKET_IFNAME with SetEnv) starts one launcher per node through real ssh; its ranks must be
# bitwise equal to the 4 local ranks too.
#
# Needs root and iproute2's `ip netns` (creates and always deletes the namespaces and the veth);
# otherwise it prints why and exits 77, which ctest reports as skipped. Without overrides it runs
# torch_ddp and then low_level_zero (ZeRO-2, fp32: reduce-scatter and all-gather over the veth);
# with them, one job with those config overrides (e.g. 'booster.plugin="torch_fsdp"').
set -euo pipefail
build=${1:?usage: two_nodes_netns.sh BUILD_DIR [CONFIG_OVERRIDE...]}
shift
if (($#)); then
  configs=("$*")
else
  configs=('booster.plugin="torch_ddp"'
           'booster.plugin="low_level_zero" plugin.stage=2 plugin.precision="fp32"')
fi
booster="$build/bin/booster"
worker="$build/bin/dist_worker"
skip() { echo "two_nodes_netns: SKIPPED: $*"; exit 77; }
[[ $(id -u) == 0 ]] || skip "needs root to create network namespaces (run as root, or with sudo)"
command -v ip >/dev/null || skip "iproute2's ip is not installed (apt-get install iproute2)"
[[ -x $booster && -x $worker ]] || { echo "two_nodes_netns: build $booster and $worker first" >&2; exit 2; }

tag=$$
ns_a="booster_a_$tag" ns_b="booster_b_$tag" veth_a="bva$tag" veth_b="bvb$tag"
veth_a=${veth_a:0:15} veth_b=${veth_b:0:15}
out=$(mktemp -d /tmp/booster_netns.XXXXXX)
cleanup() {
  ip netns pids "$ns_a" 2>/dev/null | xargs -r kill -9 2>/dev/null || true
  ip netns pids "$ns_b" 2>/dev/null | xargs -r kill -9 2>/dev/null || true
  ip netns del "$ns_a" 2>/dev/null || true
  ip netns del "$ns_b" 2>/dev/null || true
  rm -rf "$out"
}
trap cleanup EXIT
ip netns add "$ns_a" 2>/dev/null || skip "ip netns add failed (no network namespaces in this environment)"
ip netns add "$ns_b"
ip link add "$veth_a" type veth peer name "$veth_b" || skip "cannot create a veth pair here"
ip link set "$veth_a" netns "$ns_a"
ip link set "$veth_b" netns "$ns_b"
ip -n "$ns_a" addr add 10.203.0.1/24 dev "$veth_a"
ip -n "$ns_b" addr add 10.203.0.2/24 dev "$veth_b"
for ns in "$ns_a" "$ns_b"; do ip -n "$ns" link set lo up; done
ip -n "$ns_a" link set "$veth_a" up
ip -n "$ns_b" link set "$veth_b" up

# sshd in each namespace, when installed: node k is reached as 10.203.0.(k+1) on port 2222.
ssh_cmd=""
if [[ -x /usr/sbin/sshd ]] && command -v ssh-keygen >/dev/null; then
  mkdir -p "$out/ssh" /run/sshd
  ssh-keygen -q -t ed25519 -N '' -f "$out/ssh/host_key"
  ssh-keygen -q -t ed25519 -N '' -f "$out/ssh/id"
  cp "$out/ssh/id.pub" "$out/ssh/authorized_keys"
  for k in 0 1; do
    ns=$ns_a ifname=$veth_a
    ((k == 1)) && ns=$ns_b ifname=$veth_b
    cat >"$out/ssh/sshd_$k.conf" <<CONF
Port 2222
ListenAddress 10.203.0.$((k + 1))
HostKey $out/ssh/host_key
AuthorizedKeysFile $out/ssh/authorized_keys
PermitRootLogin prohibit-password
PasswordAuthentication no
KbdInteractiveAuthentication no
UsePAM no
StrictModes no
PidFile $out/ssh/sshd_$k.pid
SetEnv GLOO_SOCKET_IFNAME=$ifname
CONF
    ip netns exec "$ns" /usr/sbin/sshd -f "$out/ssh/sshd_$k.conf" -E "$out/ssh/sshd_$k.log"
  done
  printf '# the two namespaces\n10.203.0.1\n10.203.0.2\n' >"$out/hostfile"
  ssh_cmd="ssh -i $out/ssh/id -o BatchMode=yes -o StrictHostKeyChecking=no -o UserKnownHostsFile=/dev/null -o LogLevel=ERROR"
else
  echo "two_nodes_netns: openssh-server is not installed: the --hostfile job is skipped (apt-get install openssh-server)"
fi

# same_as_local DIR WHAT: every rank's parameters in $out/DIR equal the 4 local ranks' bitwise.
same_as_local() {
  for r in 0 1 2 3; do
    if ! cmp -s "$out/$1/rank$r.pt" "$out/local/rank$r.pt"; then
      echo "two_nodes_netns: FAILED: rank $r's parameters differ between $2 and 4 local ranks" >&2
      exit 1
    fi
  done
}

port=29611
for config in "${configs[@]}"; do
job=(scenario=train steps=3 batch=4 optimizer=adamw)
for kv in $config; do job+=("set=$kv"); done
rm -rf "$out/nodes" "$out/local"
mkdir -p "$out/nodes" "$out/local"
echo "two_nodes_netns: 2 nodes x 2 ranks over $veth_a <-> $veth_b: $config"
ip netns exec "$ns_a" env GLOO_SOCKET_IFNAME="$veth_a" timeout 300 "$booster" run --nnodes 2 --node_rank 0 \
  --nproc_per_node 2 --master_addr 10.203.0.1 --master_port $port "$worker" "${job[@]}" out="$out/nodes" \
  >"$out/node0.log" 2>&1 &
node0=$!
ip netns exec "$ns_b" env GLOO_SOCKET_IFNAME="$veth_b" timeout 300 "$booster" run --nnodes 2 --node_rank 1 \
  --nproc_per_node 2 --master_addr 10.203.0.1 --master_port $port "$worker" "${job[@]}" out="$out/nodes" \
  >"$out/node1.log" 2>&1 &
node1=$!
status=0
wait $node0 || status=$?
wait $node1 || status=$((status ? status : $?))
if ((status != 0)); then
  echo "two_nodes_netns: the two-node job failed (exit $status)" >&2
  tail -n 20 "$out/node0.log" "$out/node1.log" >&2
  exit 1
fi
echo "two_nodes_netns: the same job as 4 local ranks"
timeout 300 "$booster" run --nproc_per_node 4 "$worker" "${job[@]}" out="$out/local" >"$out/local.log" 2>&1 || {
  echo "two_nodes_netns: the local job failed" >&2; tail -n 20 "$out/local.log" >&2; exit 1; }
same_as_local nodes "2 nodes x 2 ranks"
echo "two_nodes_netns: ranks 0-3 bitwise equal: $config"
port=$((port + 1))
if [[ -n $ssh_cmd ]]; then
  rm -rf "$out/hostfile_job" && mkdir -p "$out/hostfile_job"
  echo "two_nodes_netns: the same job through booster run --hostfile (sshd in each namespace)"
  ip netns exec "$ns_a" timeout 300 "$booster" run --hostfile "$out/hostfile" --nproc_per_node 2 \
    --master_port $port --ssh_port 2222 --ssh_command "$ssh_cmd" "$worker" "${job[@]}" out="$out/hostfile_job" \
    >"$out/hostfile.log" 2>&1 || {
    echo "two_nodes_netns: the --hostfile job failed" >&2; tail -n 20 "$out/hostfile.log" "$out"/ssh/sshd_*.log >&2; exit 1; }
  same_as_local hostfile_job "the --hostfile job"
  echo "two_nodes_netns: --hostfile over ssh: ranks 0-3 bitwise equal: $config"
  port=$((port + 1))
fi
done
if [[ -n $ssh_cmd ]]; then
  # A failing rank on node 1: the job ends with exit 1 and leaves no rank in either namespace (node
  # 0's remote launcher stops when its ssh connection closes).
  echo "two_nodes_netns: --hostfile, rank 3 exits 3 while the others sleep"
  start=$SECONDS
  code=0
  ip netns exec "$ns_a" timeout 120 "$booster" run --hostfile "$out/hostfile" --nproc_per_node 2 \
    --master_port $port --ssh_port 2222 --ssh_command "$ssh_cmd" /bin/sh -c \
    'if [ "$RANK" = 3 ]; then sleep 2; exit 3; fi; exec sleep 100' >"$out/failing.log" 2>&1 || code=$?
  if ((code != 1)); then
    echo "two_nodes_netns: FAILED: the --hostfile job with a failing rank exited $code, not 1" >&2
    cat "$out/failing.log" >&2; exit 1
  fi
  grep -q "node 1 (10.203.0.2)" "$out/failing.log" || {
    echo "two_nodes_netns: FAILED: the launcher did not name the failing node" >&2; cat "$out/failing.log" >&2; exit 1; }
  for ((i = 0; i < 100; ++i)); do
    left=$(for ns in "$ns_a" "$ns_b"; do ip netns pids "$ns"; done | xargs -r ps -o comm= -p | grep -c -v sshd || true)
    ((left == 0)) && break
    sleep 0.1
  done
  if ((left != 0)); then
    echo "two_nodes_netns: FAILED: $left processes of the failed --hostfile job are still running" >&2; exit 1
  fi
  sed 's/^/    > /' "$out/failing.log"
  echo "two_nodes_netns: --hostfile: the failing rank stopped both nodes in $((SECONDS - start)) s, nothing left"
  # The same failure once, under --max_restarts 1: both nodes start again (next port) and succeed.
  echo "two_nodes_netns: --hostfile --max_restarts 1, rank 3 exits 3 in the first attempt"
  ip netns exec "$ns_a" timeout 120 "$booster" run --hostfile "$out/hostfile" --nproc_per_node 2 --max_restarts 1 \
    --ssh_port 2222 --ssh_command "$ssh_cmd" /bin/sh -c \
    'if [ "$TORCHELASTIC_RESTART_COUNT" = 0 ]; then if [ "$RANK" = 3 ]; then sleep 2; exit 3; fi; exec sleep 100; fi
     echo "ok rank $RANK attempt $TORCHELASTIC_RESTART_COUNT of $TORCHELASTIC_MAX_RESTARTS"' >"$out/restart.log" 2>&1 || {
    echo "two_nodes_netns: FAILED: the --hostfile job with --max_restarts 1 did not succeed" >&2; cat "$out/restart.log" >&2; exit 1; }
  for r in 0 1 2 3; do
    grep -q "^\[rank $r\]: ok rank $r attempt 1 of 1" "$out/restart.log" || {
      echo "two_nodes_netns: FAILED: rank $r did not run in the restarted attempt" >&2; cat "$out/restart.log" >&2; exit 1; }
  done
  sed 's/^/    > /' "$out/restart.log"
  echo "two_nodes_netns: --hostfile --max_restarts: every node restarted, ranks 0-3 ran attempt 1"
fi
echo "two_nodes_netns: PASSED: 2 nodes x 2 ranks over a veth equal 4 local ranks bitwise${ssh_cmd:+ (also started through ssh with --hostfile)}"
