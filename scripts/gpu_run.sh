#!/usr/bin/env bash
# gpu_run.sh — the GPU check, run on the GPU machine from a bundle made by scripts/gpu_check.sh,
# which copies this file to BUNDLE/run.sh:
#
#   bash BUNDLE/run.sh [--out DIR]      DIR: default $OUT if set, else BUNDLE/results
#
# Needs: an NVIDIA GPU, `${BOOSTER_PYTHON:-python3}` with PyTorch 2.11 (cu130): its torch/lib,
# <site-packages>/nvidia/cu13/lib and nvidia/nccl/lib give LibTorch, the CUDA runtime and NCCL
# (LD_LIBRARY_PATH = BUNDLE/lib:those, for the bundle's programs only); BOOSTER_PLUGIN_PATH =
# BUNDLE/plugins. No network, no build tools.
# Steps, each under its own `timeout` (all together at most GPU_CHECK_BUDGET_S = 450 s); a failing
# step never stops the next; a step whose program is not in the bundle is a FAIL naming it:
#   env         nvidia-smi (name, memory, driver), torch version, `ldd` of every bundle ELF file
#   cuda_kernel_tests  bin/booster_cuda_kernel_tests (gtest counts)
#   bench_cuda_kernels bin/bench_cuda_kernels --out FILE (its markdown table goes into the results)
#   gpu_tests   bin/booster_gpu_tests (gtest counts)
#   fashion_mnist  the main job, 1 epoch, one GPU, booster.device="cuda" (epoch line: samples/s, accuracy)
#   gpt         the GPT example for a bounded number of steps on the GPU (tokens/s, val_bpb)
#               (both with distributed.backend = GPU_CHECK_BACKEND, default "nccl", world size 1)
#   gpt_peer    peer/gpu_peer_gpt.py: the same GPT, data, AdamW, clipping and bf16 autocast in PyTorch
#               eager on cuda; its tokens/s over the same steps as gpt's last eval window, and
#               ours/PyTorch (see step_gpt_peer for what is measured)
#   torch_peer  peer/gpu_peer_fashion_mnist.py: the same CNN in PyTorch eager, 1 epoch on cuda
# With no GPU visible, env fails and the GPU-only steps are SKIPs. GPU_CHECK_SMOKE=1 (a test of this
# script on a machine without GPU) runs fashion_mnist, gpt, gpt_peer and torch_peer on the CPU for a
# few steps.
# Outputs in DIR (nothing else): gpu_check.txt (every measurement and test result, and the summary
# table) and gpu_check.log (the full output of every step). Prints the summary (step | status |
# seconds | key numbers); exit status 1 when a step failed, else 0.
# The step functions are called indirectly (run_step NAME LIMIT FUNCTION):
# shellcheck disable=SC2317
set -uo pipefail
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
out="${OUT:-$here/results}"
while (($#)); do
  case "$1" in
    --out) out="${2:?--out needs a directory}"; shift 2 ;;
    --out=*) out="${1#--out=}"; shift ;;
    *) echo "run.sh: unknown argument '$1' (usage: bash run.sh [--out DIR])" >&2; exit 2 ;;
  esac
done
mkdir -p "$out" || exit 2
txt="$out/gpu_check.txt"
log="$out/gpu_check.log"
: >"$txt"
: >"$log"
work=$(mktemp -d "${TMPDIR:-/tmp}/gpu_check.XXXXXX")
trap 'rm -rf "$work"' EXIT
PY="${BOOSTER_PYTHON:-python3}"
BUDGET_S="${GPU_CHECK_BUDGET_S:-450}"
smoke="${GPU_CHECK_SMOKE:-0}"
# The examples' configs say backend = "gloo" (CPU); on the GPU they run on NCCL, the CUDA default.
backend="${GPU_CHECK_BACKEND:-nccl}"
t_start=$SECONDS

say() { echo "$*" | tee -a "$txt"; }
say "Booster C++ GPU check — $(date -u +%Y-%m-%dT%H:%M:%SZ) on $(uname -n), bundle $here"
[[ -f "$here/MANIFEST" ]] && sed -n '2,3p' "$here/MANIFEST" | tee -a "$txt"
((smoke)) && say "GPU_CHECK_SMOKE=1: the examples and the peer run a few steps on the CPU (a test of run.sh itself)"

# Where the GPU machine's torch keeps LibTorch, the CUDA runtime and NCCL.
torch_dir=$(timeout 60 "$PY" -c 'import torch, os; print(os.path.dirname(torch.__file__))' 2>>"$log")
site=""
[[ -n "$torch_dir" ]] && site=$(dirname "$torch_dir")
libpath="$here/lib"
[[ -n "$site" ]] && libpath+=":$torch_dir/lib:$site/nvidia/cu13/lib:$site/nvidia/nccl/lib"
libpath+="${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
# The bundle's programs (not Python: the bundle's libz must not replace the system's under it).
bx() { env LD_LIBRARY_PATH="$libpath" BOOSTER_PLUGIN_PATH="$here/plugins" "$@"; }

names=() statuses=() secs=() keys=()
step_status="" step_key="" step_out=""
# run_step NAME LIMIT_S FUNCTION: FUNCTION sets step_status (PASS/FAIL/SKIP) and step_key; its output
# (and that of the programs it runs) goes to the log, and to $step_out for the function to read.
run_step() {
  local name=$1 limit=$2 fn=$3 left t0
  left=$((BUDGET_S - (SECONDS - t_start) - 5))
  ((limit > left)) && limit=$left
  step_status=FAIL step_key="" step_out="$work/$name.out" step_limit=$limit tail_on_fail=1
  : >"$step_out"
  echo "===== $name (timeout ${limit}s) =====" | tee -a "$txt" >>"$log"
  t0=$SECONDS
  if ((limit < 10)); then
    step_key="not run: the run's ${BUDGET_S}s budget is spent"
  else
    "$fn" >>"$step_out" 2>&1
  fi
  cat "$step_out" >>"$log"
  if [[ "$step_status" == FAIL && -s "$step_out" ]] && ((tail_on_fail)); then  # why, in the results file too
    { echo "last lines of its output:"; tail -n 5 "$step_out" | cut -c1-400; } >>"$txt"
  fi
  names+=("$name") statuses+=("$step_status") secs+=("$((SECONDS - t0))") keys+=("$step_key")
  say "-> $name: $step_status ($((SECONDS - t0)) s) $step_key"
}
# tm CMD...: the step's program under its timeout (SIGTERM, then SIGKILL 10 s later); a timeout is
# reported in step_key by check_rc.
tm() { timeout -k 10 "$step_limit" "$@"; }
tmb() { tm env LD_LIBRARY_PATH="$libpath" BOOSTER_PLUGIN_PATH="$here/plugins" "$@"; }  # a bundle program
check_rc() {  # check_rc RC WHAT: the status from an exit status (step_key says why it failed)
  if (($1 == 0)); then step_status=PASS
  elif (($1 == 124 || $1 == 137)); then step_status=FAIL; note "$2 timed out after ${step_limit}s"
  else step_status=FAIL; note "$2 exited with $1"; fi
}
note() { step_key="${step_key:+$step_key; }$*"; }     # appends to the step's key numbers
lead() { step_key="$*${step_key:+; $step_key}"; }     # puts the measured numbers first
need() {  # need FILE: FAIL naming it when the bundle lacks it
  [[ -f "$here/$1" ]] || { step_status=FAIL step_key="$1 is not in the bundle (target not built)"; return 1; }
  [[ -x "$here/$1" ]] || chmod u+x "$here/$1" 2>/dev/null  # a copy that lost its mode bits
  [[ -x "$here/$1" ]] || { step_status=FAIL step_key="$1 is not executable"; return 1; }
}
no_gpu() {  # the GPU-only steps are SKIPs when env found no GPU (except the examples in smoke mode)
  ((have_gpu)) && return 1
  [[ "${1:-}" == smoke_ok ]] && ((smoke)) && return 1
  step_status=SKIP step_key="no CUDA GPU visible (see env)"
  return 0
}
gtest_counts() {  # "passed P failed F skipped S of N" from a gtest output
  awk '/^\[==========\] [0-9]+ tests? from .* ran/ {n = $2} /^\[  PASSED  \]/ {p = $4}
       /^\[  FAILED  \] [0-9]+ tests?,/ {f = $4} /^\[  SKIPPED \] [0-9]+ tests?,/ {s = $4}
       END {if (n == "") print "no gtest summary"; else printf "passed %d failed %d skipped %d of %d\n", p, f, s, n}' "$1"
}

have_gpu=0
step_env() {
  local smi py bad=() f
  local n=0
  tail_on_fail=0  # its findings go to the results file below
  timeout 30 nvidia-smi
  smi=$(timeout 30 nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader 2>&1) || smi=""
  py=$(timeout 60 "$PY" -c 'import torch; c = torch.cuda.is_available()
print(torch.__version__, "cuda", torch.version.cuda, "available", c, torch.cuda.get_device_name(0) if c else "")' 2>&1 | tail -n 1)
  echo "LD_LIBRARY_PATH for the bundle: $libpath"
  for f in "$here"/bin/* "$here"/plugins/* "$here"/lib/*; do
    [[ -f "$f" ]] || continue
    n=$((n + 1))
    echo "--- ldd ${f#"$here"/}"
    bx ldd "$f" 2>&1 | tee "$work/ldd" || bad+=("${f#"$here"/} (ldd failed)")
    grep -q "not found" "$work/ldd" && bad+=("${f#"$here"/}: $(grep "not found" "$work/ldd" | awk '{print $1}' | paste -sd, -)")
  done
  [[ "$smi" == *[0-9]* || "$py" == *"available True"* ]] && have_gpu=1
  printf 'nvidia-smi (name, memory, driver): %s\ntorch (%s): %s\nldd: %d bundle files, %d with unresolved libraries %s\n' \
    "${smi:-none}" "$PY" "$py" "$n" "${#bad[@]}" "${bad[*]}" | tee -a "$txt"
  step_key="${smi:-no nvidia-smi}"
  if [[ -n "$torch_dir" ]]; then note "torch ${py%% *}"; else note "no torch in $PY (set BOOSTER_PYTHON)"; fi
  ((${#bad[@]})) && note "unresolved libraries: ${bad[*]}"
  ((have_gpu)) || note "no CUDA GPU visible"
  [[ -n "$torch_dir" ]] && ((have_gpu && ${#bad[@]} == 0)) && step_status=PASS
}
step_gtest() {  # step_gtest BINARY
  need "bin/$1" || return
  tmb "$here/bin/$1" --gtest_color=no; check_rc $? "$1"
  lead "$(gtest_counts "$step_out")"
  grep -E '^\[ +(OK|FAILED|SKIPPED) +\] [^ ]+\.[^ ]+ \([0-9]+ ms\)' "$step_out" >>"$txt"
}
step_cuda_kernel_tests() { step_gtest booster_cuda_kernel_tests; }
step_gpu_tests() { step_gtest booster_gpu_tests; }
step_bench() {
  need bin/bench_cuda_kernels || return
  no_gpu && return
  tmb "$here/bin/bench_cuda_kernels" --out "$work/bench.md"; check_rc $? bench_cuda_kernels
  if [[ -s "$work/bench.md" ]]; then
    cat "$work/bench.md" >>"$txt"
    lead "$(grep -c '^|' "$work/bench.md") table lines in gpu_check.txt"
  else step_status=FAIL; note "no table written to --out"; fi
}
fm_sps=""
step_fashion_mnist() {
  need bin/fashion_mnist || return
  no_gpu smoke_ok && return
  local args=(--set 'booster.device="cuda"' --set "distributed.backend=\"$backend\"")
  ((smoke)) && args=(--set train.max_steps_per_epoch=30 --set train.test_subset=1000
                     --set train.lr_scheduler.warmup_steps=10)
  tmb "$here/bin/fashion_mnist" --config "$here/configs/ddp.toml" --data_dir "$here/data/fashion-mnist" \
    --output_dir "$work/fashion_mnist" --set train.epochs=1 "${args[@]}"
  check_rc $? fashion_mnist
  grep -E 'booster: plugin ' "$step_out" | head -n 1 >>"$txt"
  local line; line=$(grep -E 'epoch [0-9]+/[0-9]+ +train_loss' "$step_out" | tail -n 1)
  echo "$line" >>"$txt"
  fm_sps=$(sed -n 's/.*samples\/s \([0-9.]*\).*/\1/p' <<<"$line")
  [[ -n "$line" ]] || { step_status=FAIL; note "no epoch line"; return; }
  lead "samples/s $fm_sps test_accuracy $(sed -n 's/.*test_accuracy \([0-9.]*\).*/\1/p' <<<"$line")"
}
# The gpt step's steps and eval window (smoke: 6 and 3). Its eval lines report tokens/s over each
# window of gpt_eval steps (the summed step times of those steps, evaluation excluded); the last
# window (steps 201-300 when all 300 ran) is the steady-state rate gpt_peer is compared with.
gpt_steps=300 gpt_eval=100
((smoke)) && gpt_steps=6 gpt_eval=3
gpt_win_tok="" gpt_win_last=""
step_gpt() {
  need bin/gpt || return
  no_gpu smoke_ok && return
  local args=(--set 'booster.device="cuda"' --set "distributed.backend=\"$backend\"" --set train.eval_windows=64
              --set train.final_eval_windows=256 --set train.sample_length=100)
  ((smoke)) && args=(--set train.eval_windows=4 --set train.final_eval_windows=8 --set train.sample_length=10)
  args+=(--set "train.max_steps=$gpt_steps" --set "train.eval_interval=$gpt_eval")
  tmb "$here/bin/gpt" --config "$here/configs/gpt_ddp.toml" --output_dir "$work/gpt" \
    --set "train.corpus=\"$here/data/gpt/kjv.txt\"" --set 'train.val_books="Ruth"' --set train.max_minutes=0.75 \
    --set train.log_interval=50 --set train.save_model=false "${args[@]}"
  check_rc $? gpt
  grep -E '(booster: plugin |gpt: [0-9]+ parameters|eval step|training stopped|final val_loss)' "$step_out" >>"$txt"
  local tok bpb
  tok=$(sed -n 's/.*(\([0-9.]*\) training tokens\/s).*/\1/p' "$step_out" | tail -n 1)
  bpb=$(sed -n 's/.*final val_loss.* val_bpb \([0-9.]*\).*/\1/p' "$step_out" | tail -n 1)
  [[ -n "$tok" ]] || { step_status=FAIL; note "no 'training tokens/s' line"; return; }
  lead "tokens/s $tok final val_bpb ${bpb:-?}"
  local win
  win=$(sed -n 's/.*eval step \([0-9]*\) .* tokens\/s \([0-9.]*\) .*/\1 \2/p' "$step_out" | tail -n 1)
  if [[ -n "$win" ]]; then
    read -r gpt_win_last gpt_win_tok <<<"$win"
    note "steps $((gpt_win_last - gpt_eval + 1))-$gpt_win_last tokens/s $gpt_win_tok"
  fi
}
# gpt_peer: what is measured. Both sides sum the wall time of each training step (host sampling of
# the random windows, the blocking copies to the device, forward, loss, backward, loss.item(),
# clipping, AdamW, zero_grad, LR step; no extra synchronize) over the same step numbers: gpt's last
# eval window (steps 201-300 when gpt ran all 300), the peer running those steps after as many
# warm-up steps; tokens/s = 16 x 128 tokens x steps / that time. When gpt logged no eval window the
# peer runs gpt's step count and its all-steps rate (first step included, as gpt's "training
# tokens/s") is compared with gpt's. ours/PyTorch > 1: ours is faster.
step_gpt_peer() {
  [[ -f "$here/peer/gpu_peer_gpt.py" ]] || { step_key="peer/gpu_peer_gpt.py is not in the bundle"; return; }
  no_gpu smoke_ok && return
  local warm=$((gpt_steps - gpt_eval)) n=$gpt_eval ours=$gpt_win_tok stopped
  if [[ -n "$gpt_win_last" ]]; then
    warm=$((gpt_win_last - gpt_eval))
  else  # gpt stopped before its first eval window: all of its steps, first one included
    stopped=$(sed -n 's/.*training stopped after \([0-9]*\) steps.*(\([0-9.]*\) training tokens\/s).*/\1 \2/p' \
      "$work/gpt.out" 2>/dev/null | tail -n 1)
    [[ -n "$stopped" ]] && { read -r n ours <<<"$stopped"; warm=0; }
    ((n > 0)) || n=$gpt_eval
  fi
  local args=(--device cuda)
  ((smoke)) && args=(--device cpu)
  tm "$PY" "$here/peer/gpu_peer_gpt.py" --config "$here/configs/gpt_ddp.toml" --corpus "$here/data/gpt/kjv.txt" \
    --val_books Ruth --warmup_steps "$warm" --steps "$n" --max_steps "$gpt_steps" "${args[@]}"
  check_rc $? gpu_peer_gpt.py
  local line tok
  line=$(grep -E '^peer: gpt steps [0-9]+-[0-9]+: [0-9.]+ training tokens/s' "$step_out" | tail -n 1)
  grep -E '^peer: ' "$step_out" >>"$txt"
  tok=$(sed -n 's/^peer: gpt steps [0-9]*-[0-9]*: \([0-9.]*\) training tokens\/s.*/\1/p' <<<"$line")
  [[ -n "$tok" ]] || { step_status=FAIL; note "no 'peer: gpt ... training tokens/s' line"; return; }
  lead "tokens/s $tok (steps $((warm + 1))-$((warm + n)))"
  if [[ -n "$ours" && "$tok" != 0 ]]; then
    note "ours/PyTorch $(awk -v a="$ours" -v b="$tok" 'BEGIN {printf "%.2f", a / b}') (gpt $ours tokens/s)"
  else
    note "no gpt tokens/s to compare with"
  fi
}
peer_sps=""
step_torch_peer() {
  [[ -f "$here/peer/gpu_peer_fashion_mnist.py" ]] || { step_key="peer/gpu_peer_fashion_mnist.py is not in the bundle"; return; }
  no_gpu smoke_ok && return
  local args=(--device cuda)
  ((smoke)) && args=(--device cpu --max_steps 30 --test_subset 1000 --warmup_steps 10)
  tm "$PY" "$here/peer/gpu_peer_fashion_mnist.py" --data_dir "$here/data/fashion-mnist" --epochs 1 "${args[@]}"
  check_rc $? gpu_peer_fashion_mnist.py
  grep -E '^peer: ' "$step_out" >>"$txt"
  local line; line=$(grep -E '^epoch [0-9]+/[0-9]+ +train_loss' "$step_out" | tail -n 1)
  echo "$line" >>"$txt"
  peer_sps=$(sed -n 's/.*samples\/s \([0-9.]*\).*/\1/p' <<<"$line")
  [[ -n "$line" ]] || { step_status=FAIL; note "no epoch line"; return; }
  lead "samples/s $peer_sps test_accuracy $(sed -n 's/.*test_accuracy \([0-9.]*\).*/\1/p' <<<"$line")"
  if [[ -n "$fm_sps" && "${peer_sps:-0}" != 0 ]]; then
    note "ours/PyTorch $(awk -v a="$fm_sps" -v b="$peer_sps" 'BEGIN {printf "%.2f", a / b}')"
  fi
}

run_step env 60 step_env
run_step cuda_kernel_tests 60 step_cuda_kernel_tests
run_step bench_cuda_kernels 90 step_bench
run_step gpu_tests 150 step_gpu_tests
run_step fashion_mnist 90 step_fashion_mnist
run_step gpt 75 step_gpt
run_step gpt_peer 75 step_gpt_peer
run_step torch_peer 75 step_torch_peer

failed=0
{
  echo
  echo "===== summary ($((SECONDS - t_start)) s) ====="
  printf '%-18s | %-6s | %7s | %s\n' step status seconds "key numbers"
  for i in "${!names[@]}"; do
    printf '%-18s | %-6s | %7s | %s\n' "${names[$i]}" "${statuses[$i]}" "${secs[$i]}" "${keys[$i]}"
    [[ "${statuses[$i]}" == FAIL ]] && failed=1
  done
} >"$work/summary"
tee -a "$txt" <"$work/summary"
cat "$work/summary" >>"$log"
echo "results: $txt, log: $log"
exit "$failed"
