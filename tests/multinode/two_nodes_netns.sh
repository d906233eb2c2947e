#!/usr/bin/env bash
# two_nodes_netns.sh — `booster run` across two nodes for real: two network namespaces joined by a
# veth pair (10.203.0.1 and 10.203.0.2), one launcher per namespace with --nnodes 2 --node_rank k
# --master_addr 10.203.0.1, 2 ranks each (Gloo over the veth, GLOO_SOCKET_IFNAME set per node), and
# the same job as 4 local ranks on this machine. Every rank's trained parameters must be bitwise
# equal between the two jobs (the same Gloo ring over 4 ranks, the same data per global rank).
#
#   bash tests/multinode/two_nodes_netns.sh BUILD_DIR [CONFIG_OVERRIDE...]
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
for r in 0 1 2 3; do
  if ! cmp -s "$out/nodes/rank$r.pt" "$out/local/rank$r.pt"; then
    echo "two_nodes_netns: FAILED: rank $r's parameters differ between 2 nodes x 2 ranks and 4 local ranks" >&2
    exit 1
  fi
done
echo "two_nodes_netns: ranks 0-3 bitwise equal: $config"
port=$((port + 1))
done
echo "two_nodes_netns: PASSED: 2 nodes x 2 ranks over a veth equal 4 local ranks bitwise"
