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
# Steps, each under its own `timeout` (all together at most GPU_CHECK_BUDGET_S = 540 s); a failing
# step never stops the next; a step whose program is not in the bundle is a FAIL naming it:
#   env         nvidia-smi (name, memory, driver), torch version, `ldd` of every bundle ELF file
#   cuda_kernel_tests  bin/booster_cuda_kernel_tests (gtest counts)
#   gpu_tests   bin/booster_gpu_tests (gtest counts; at most GPU_TESTS_LIMIT_S = 300 s; GTEST_FILTER picks tests)
#   fashion_mnist  the main job, 1 epoch, one GPU, booster.device="cuda", train.optimizer="hybrid_adam",
#               twice (the faster run counts), then once with LibTorch's AdamW (samples/s, accuracy)
#   torch_peer  peer/gpu_peer_fashion_mnist.py: the same CNN in PyTorch eager, 1 epoch on cuda, twice;
#               ours/PyTorch from the faster run of each
#   gpt         the GPT example for a bounded number of steps on the GPU (tokens/s, val_bpb), as
#               fashion_mnist: twice with hybrid_adam, once with LibTorch's AdamW
#               (both examples with distributed.backend = GPU_CHECK_BACKEND, default "nccl", world size 1)
#   gpt_peer    peer/gpu_peer_gpt.py: the same GPT, data, AdamW, clipping and bf16 autocast in PyTorch
#               eager on cuda; its tokens/s over the same steps as gpt's last eval window (twice, the
#               faster run counts), and ours/PyTorch (see step_gpt_peer for what is measured); once
#               more with PyTorch's fused AdamW, for reference
#   gpt_fsdp, gpt_fsdp_peer  the GPT example under torch_fsdp (configs/gpt_fsdp.toml, world size 1) and
#               PyTorch's fully_shard on the same model (peer/gpu_peer_gpt.py --fully_shard), one run each
#   bench_cuda_kernels bin/bench_cuda_kernels --out FILE (its markdown table goes into the results)
#   profile     Kineto traces of a few steps of each example and peer, summarised (step_profile)
# With no GPU visible, env fails and the GPU-only steps are SKIPs. GPU_CHECK_SMOKE=1 (a test of this
# script on a machine without GPU) runs fashion_mnist, gpt, gpt_peer, torch_peer and profile on the
# CPU for a few steps, each example and peer once.
# Outputs in DIR (nothing else): gpu_check.txt (every measurement and test result, and the summary
# table), gpu_check.log (the full output of every step) and the profile step's trace_*.json.gz. Prints the summary (step | status |
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
BUDGET_S="${GPU_CHECK_BUDGET_S:-540}"
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
# The examples against their PyTorch peers: each side runs twice (runs) and its faster run counts
# (the ratio moved by up to 1.5x between single runs of earlier checks: start-up and clock noise on a
# job of seconds). Ours trains with train.optimizer = "hybrid_adam" (booster::optim::HybridAdam, the
# optimizer a ColossalAI user picks for the GPU: AdamW's arithmetic, one multi-tensor launch per
# group); one more run with LibTorch's torch::optim::AdamW shows what that choice is worth.
runs=2
((smoke)) && runs=1
max_of() { printf '%s\n' "$@" | awk 'NF && $1 > m {m = $1} END {print m + 0}'; }
fm_sps=""
fm_run() {  # fm_run OPTIMIZER: one epoch of ours; prints its samples/s (empty when none)
  local args=(--set 'booster.device="cuda"' --set "distributed.backend=\"$backend\"" --set "train.optimizer=\"$1\"")
  ((smoke)) && args=(--set train.max_steps_per_epoch=30 --set train.test_subset=1000
                     --set train.lr_scheduler.warmup_steps=10 --set "train.optimizer=\"$1\"")
  tmb "$here/bin/fashion_mnist" --config "$here/configs/ddp.toml" --data_dir "$here/data/fashion-mnist" \
    --output_dir "$work/fashion_mnist_$1" --set train.epochs=1 "${args[@]}" >"$work/fm.out" 2>&1
  local rc=$?
  cat "$work/fm.out"
  ((rc == 0)) || { check_rc $rc "fashion_mnist ($1)"; return; }
  grep -E 'booster: plugin ' "$work/fm.out" | head -n 1 >>"$txt"
  local line; line=$(grep -E 'epoch [0-9]+/[0-9]+ +train_loss' "$work/fm.out" | tail -n 1)
  echo "optimizer $1: $line" >>"$txt"
  sed -n 's/.*samples\/s \([0-9.]*\).*/\1/p' <<<"$line" >"$work/fm.sps"
  fm_acc=$(sed -n 's/.*test_accuracy \([0-9.]*\).*/\1/p' <<<"$line")
}
step_fashion_mnist() {
  need bin/fashion_mnist || return
  no_gpu smoke_ok && return
  local all=() i sps
  step_status=PASS
  for ((i = 0; i < runs; ++i)); do
    : >"$work/fm.sps"; fm_run hybrid_adam; sps=$(cat "$work/fm.sps")
    [[ -n "$sps" ]] || { step_status=FAIL; note "no epoch line (hybrid_adam)"; return; }
    all+=("$sps")
  done
  fm_sps=$(max_of "${all[@]}")
  lead "samples/s $fm_sps test_accuracy ${fm_acc:-?} (best of ${all[*]})"
  if ((!smoke)); then
    : >"$work/fm.sps"; fm_run adamw; sps=$(cat "$work/fm.sps")
    [[ -n "$sps" ]] && note "with LibTorch's AdamW: $sps samples/s"
  fi
}
# The gpt step's steps and eval window (smoke: 6 and 3). Its eval lines report tokens/s over each
# window of gpt_eval steps (the summed step times of those steps, evaluation excluded); the last
# window (steps 201-300 when all 300 ran) is the steady-state rate gpt_peer is compared with.
gpt_steps=300 gpt_eval=100
((smoke)) && gpt_steps=6 gpt_eval=3
gpt_win_tok="" gpt_win_last=""
gpt_run() {  # gpt_run OPTIMIZER [CONFIG]: ours once (CONFIG default gpt_ddp.toml); sets gpt_tok (all steps), gpt_bpb, gpt_win (last window: "step tokens/s")
  local args=(--set 'booster.device="cuda"' --set "distributed.backend=\"$backend\"" --set train.eval_windows=64
              --set train.final_eval_windows=256 --set train.sample_length=100)
  ((smoke)) && args=(--set train.eval_windows=4 --set train.final_eval_windows=8 --set train.sample_length=10)
  args+=(--set "train.max_steps=$gpt_steps" --set "train.eval_interval=$gpt_eval" --set "train.optimizer=\"$1\"")
  tmb "$here/bin/gpt" --config "$here/configs/${2:-gpt_ddp.toml}" --output_dir "$work/gpt" \
    --set "train.corpus=\"$here/data/gpt/kjv.txt\"" --set 'train.val_books="Ruth"' --set train.max_minutes=0.75 \
    --set train.log_interval=50 --set train.save_model=false "${args[@]}" >"$work/gpt_run.out" 2>&1
  local rc=$?
  if [[ "$1" == hybrid_adam ]]; then cat "$work/gpt_run.out"; else cat "$work/gpt_run.out" >>"$log"; fi
  gpt_tok="" gpt_bpb="" gpt_win=""
  ((rc == 0)) || { check_rc $rc "gpt ($1)"; return; }
  { echo "optimizer $1:"; grep -E '(booster: plugin |gpt: [0-9]+ parameters|eval step|training stopped|final val_loss)' "$work/gpt_run.out"; } >>"$txt"
  gpt_tok=$(sed -n 's/.*(\([0-9.]*\) training tokens\/s).*/\1/p' "$work/gpt_run.out" | tail -n 1)
  gpt_bpb=$(sed -n 's/.*final val_loss.* val_bpb \([0-9.]*\).*/\1/p' "$work/gpt_run.out" | tail -n 1)
  gpt_win=$(sed -n 's/.*eval step \([0-9]*\) .* tokens\/s \([0-9.]*\) .*/\1 \2/p' "$work/gpt_run.out" | tail -n 1)
}
step_gpt() {
  need bin/gpt || return
  no_gpu smoke_ok && return
  local i wins=() toks=() last="" tok
  step_status=PASS
  for ((i = 0; i < runs; ++i)); do
    gpt_run hybrid_adam
    [[ -n "$gpt_tok" ]] || { step_status=FAIL; note "no 'training tokens/s' line (hybrid_adam)"; return; }
    toks+=("$gpt_tok")
    if [[ -n "$gpt_win" ]]; then read -r last tok <<<"$gpt_win"; wins+=("$tok"); fi
  done
  lead "tokens/s $(max_of "${toks[@]}") final val_bpb ${gpt_bpb:-?} (all steps, best of ${toks[*]})"
  if ((${#wins[@]} == runs)); then
    gpt_win_last=$last gpt_win_tok=$(max_of "${wins[@]}")
    note "steps $((gpt_win_last - gpt_eval + 1))-$gpt_win_last tokens/s $gpt_win_tok (best of ${wins[*]})"
  else
    gpt_win_tok=$(max_of "${toks[@]}")  # no eval window: gpt_peer compares all steps
  fi
  if ((!smoke)); then
    gpt_run adamw
    [[ -n "$gpt_win" ]] && note "with LibTorch's AdamW: ${gpt_win#* } tokens/s"
  fi
}
# gpt_peer: what is measured. Both sides sum the wall time of each training step (host sampling of
# the random windows, the blocking copies to the device, forward, loss, backward, loss.item(),
# clipping, AdamW, zero_grad, LR step; no extra synchronize) over the same step numbers: gpt's last
# eval window (steps 201-300 when gpt ran all 300), the peer running those steps after as many
# warm-up steps; tokens/s = 16 x 128 tokens x steps / that time. When gpt logged no eval window the
# peer runs gpt's step count and its all-steps rate (first step included, as gpt's "training
# tokens/s") is compared with gpt's. ours/PyTorch > 1: ours is faster.
# peer_gpt_run CONFIG WARM N ARG...: one run of peer/gpu_peer_gpt.py (ARG: --device, --adamw_impl,
# --fully_shard) over steps WARM+1..WARM+N; sets peer_tok to its tokens/s over them ("" when it failed:
# check_rc says why) and copies its 'peer:' lines into the results.
peer_tok=""
peer_gpt_run() {
  local config=$1 warm=$2 n=$3 rc
  shift 3
  peer_tok=""
  tm "$PY" "$here/peer/gpu_peer_gpt.py" --config "$here/configs/$config" --corpus "$here/data/gpt/kjv.txt" \
    --val_books Ruth --warmup_steps "$warm" --steps "$n" --max_steps "$gpt_steps" "$@" >"$work/peer_gpt.out" 2>&1
  rc=$?
  cat "$work/peer_gpt.out" >>"$log"
  ((rc == 0)) || { check_rc $rc "gpu_peer_gpt.py $*"; return; }
  grep -E '^peer: ' "$work/peer_gpt.out" >>"$txt"
  peer_tok=$(sed -n 's/^peer: gpt steps [0-9]*-[0-9]*: \([0-9.]*\) training tokens\/s.*/\1/p' "$work/peer_gpt.out" | tail -n 1)
}
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
  local args=(--device cuda) i toks=() tok fused
  ((smoke)) && args=(--device cpu)
  step_status=PASS
  for ((i = 0; i < runs; ++i)); do
    peer_gpt_run gpt_ddp.toml "$warm" "$n" --adamw_impl default "${args[@]}"
    [[ -n "$peer_tok" ]] || { step_status=FAIL; note "no 'peer: gpt ... training tokens/s' line"; return; }
    toks+=("$peer_tok")
  done
  tok=$(max_of "${toks[@]}")
  lead "tokens/s $tok (steps $((warm + 1))-$((warm + n)); best of ${toks[*]}; AdamW foreach, PyTorch's default on CUDA)"
  if [[ -n "$ours" && "$tok" != 0 ]]; then
    note "ours/PyTorch $(awk -v a="$ours" -v b="$tok" 'BEGIN {printf "%.2f", a / b}') (gpt $ours tokens/s)"
  else
    note "no gpt tokens/s to compare with"
  fi
  if ((!smoke)); then
    local status=$step_status key=$step_key  # the fused run is for reference: it does not fail the step
    peer_gpt_run gpt_ddp.toml "$warm" "$n" --adamw_impl fused "${args[@]}"
    fused=$peer_tok step_status=$status step_key=$key
    [[ -n "$fused" ]] && note "PyTorch with fused AdamW: $fused tokens/s (ours/that $(awk -v a="$ours" -v b="$fused" 'BEGIN {printf "%.2f", (b > 0 ? a / b : 0)}'))"
  fi
}
# gpt_fsdp / gpt_fsdp_peer: the GPT example under torch_fsdp (configs/gpt_fsdp.toml: FULL_SHARD, one
# unit per block, bf16 gathered parameters with fp32 reduction, world size 1 on NCCL) against PyTorch
# 2.11's fully_shard on the same blocks with MixedPrecisionPolicy(bf16, fp32) (gpu_peer_gpt.py
# --fully_shard), one run each, measured as gpt / gpt_peer are.
fsdp_win_tok="" fsdp_win_last=""
step_gpt_fsdp() {
  need bin/gpt || return
  [[ -f "$here/configs/gpt_fsdp.toml" ]] || { step_key="configs/gpt_fsdp.toml is not in the bundle"; return; }
  no_gpu smoke_ok && return
  gpt_run hybrid_adam gpt_fsdp.toml
  [[ -n "$gpt_tok" ]] || { step_status=FAIL; note "no 'training tokens/s' line (torch_fsdp)"; return; }
  step_status=PASS
  if [[ -n "$gpt_win" ]]; then read -r fsdp_win_last fsdp_win_tok <<<"$gpt_win"; else fsdp_win_tok=$gpt_tok; fi
  lead "torch_fsdp tokens/s $fsdp_win_tok${fsdp_win_last:+ (steps $((fsdp_win_last - gpt_eval + 1))-$fsdp_win_last)} final val_bpb ${gpt_bpb:-?}"
}
step_gpt_fsdp_peer() {
  [[ -f "$here/peer/gpu_peer_gpt.py" ]] || { step_key="peer/gpu_peer_gpt.py is not in the bundle"; return; }
  no_gpu smoke_ok && return
  [[ -n "$fsdp_win_tok" ]] || { step_key="gpt_fsdp gave no tokens/s to compare with"; return; }
  local warm=0 n=$gpt_steps args=(--device cuda) tok
  [[ -n "$fsdp_win_last" ]] && warm=$((fsdp_win_last - gpt_eval)) n=$gpt_eval
  ((smoke)) && args=(--device cpu)
  peer_gpt_run gpt_fsdp.toml "$warm" "$n" --fully_shard "${args[@]}"
  tok=$peer_tok
  [[ -n "$tok" ]] || { step_status=FAIL; note "no 'peer: gpt ... training tokens/s' line"; return; }
  step_status=PASS
  lead "fully_shard tokens/s $tok (steps $((warm + 1))-$((warm + n)))"
  note "ours/PyTorch $(awk -v a="$fsdp_win_tok" -v b="$tok" 'BEGIN {printf "%.2f", (b > 0 ? a / b : 0)}') (torch_fsdp $fsdp_win_tok tokens/s; target >= 1.0)"
}
peer_sps=""
step_torch_peer() {
  [[ -f "$here/peer/gpu_peer_fashion_mnist.py" ]] || { step_key="peer/gpu_peer_fashion_mnist.py is not in the bundle"; return; }
  no_gpu smoke_ok && return
  local args=(--device cuda) i all=() line sps
  ((smoke)) && args=(--device cpu --max_steps 30 --test_subset 1000 --warmup_steps 10)
  step_status=PASS
  for ((i = 0; i < runs; ++i)); do
    tm "$PY" "$here/peer/gpu_peer_fashion_mnist.py" --data_dir "$here/data/fashion-mnist" --epochs 1 "${args[@]}" \
      >"$work/peer_fm.out" 2>&1
    local rc=$?
    cat "$work/peer_fm.out"
    ((rc == 0)) || { check_rc $rc gpu_peer_fashion_mnist.py; return; }
    grep -E '^peer: ' "$work/peer_fm.out" >>"$txt"
    line=$(grep -E '^epoch [0-9]+/[0-9]+ +train_loss' "$work/peer_fm.out" | tail -n 1)
    echo "$line" >>"$txt"
    sps=$(sed -n 's/.*samples\/s \([0-9.]*\).*/\1/p' <<<"$line")
    [[ -n "$sps" ]] || { step_status=FAIL; note "no epoch line"; return; }
    all+=("$sps")
  done
  peer_sps=$(max_of "${all[@]}")
  lead "samples/s $peer_sps (best of ${all[*]}) test_accuracy $(sed -n 's/.*test_accuracy \([0-9.]*\).*/\1/p' <<<"$line")"
  if [[ -n "$fm_sps" && "${peer_sps:-0}" != 0 ]]; then
    note "ours/PyTorch $(awk -v a="$fm_sps" -v b="$peer_sps" 'BEGIN {printf "%.2f", a / b}')"
  fi
}

# profile: where a step's time goes. Ours and each peer once more, with BOOSTER_EXAMPLE_PROFILE
# (examples/common/step_profiler.h, peer/gpu_peer_profile.py): a Kineto trace of 20 Fashion-MNIST
# steps (401-420) and 10 GPT steps (201-210); peer/gpu_trace_summary.py's lines (host wall and GPU
# busy time per step, kernels, synchronising calls, the heaviest CPU operators) go to gpu_check.txt
# and the traces, gzipped, to the output directory (trace_*.json.gz). Last: nothing else depends on it.
step_profile() {
  [[ -f "$here/peer/gpu_trace_summary.py" ]] || { step_key="peer/gpu_trace_summary.py is not in the bundle"; return; }
  need bin/fashion_mnist || return
  need bin/gpt || return
  no_gpu smoke_ok && return
  local fm_first=401 fm_last=420 gpt_first=201 gpt_last=210 dev=cuda warm=200
  ((smoke)) && fm_first=3 fm_last=5 gpt_first=3 gpt_last=4 dev=cpu warm=2
  local fm_span="$fm_first-$fm_last" gpt_span="$gpt_first-$gpt_last" name made=0
  local gpt_args=(--set "booster.device=\"$dev\"" --set "train.max_steps=$gpt_last" --set train.eval_interval=100000
                  --set train.final_eval_windows=8 --set train.sample_length=10 --set train.save_model=false
                  --set "train.corpus=\"$here/data/gpt/kjv.txt\"" --set 'train.val_books="Ruth"' --set 'train.optimizer="hybrid_adam"')
  local fm_args=(--set "booster.device=\"$dev\"" --set 'train.optimizer="hybrid_adam"'
                 --set "train.lr_scheduler.warmup_steps=$warm")
  if [[ $dev == cuda ]]; then
    gpt_args+=(--set "distributed.backend=\"$backend\"")
    fm_args+=(--set "distributed.backend=\"$backend\"")
  fi
  BOOSTER_EXAMPLE_PROFILE="$fm_span:$work/trace_ours_fashion_mnist.json" tmb "$here/bin/fashion_mnist" \
    --config "$here/configs/ddp.toml" --data_dir "$here/data/fashion-mnist" --output_dir "$work/fm_profile" \
    --set train.epochs=1 --set "train.max_steps_per_epoch=$fm_last" --set train.test_subset=1000 "${fm_args[@]}"
  BOOSTER_EXAMPLE_PROFILE="$fm_span:$work/trace_peer_fashion_mnist.json" tm "$PY" "$here/peer/gpu_peer_fashion_mnist.py" \
    --data_dir "$here/data/fashion-mnist" --epochs 1 --max_steps "$fm_last" --test_subset 1000 --warmup_steps "$warm" \
    --device "$dev"
  BOOSTER_EXAMPLE_PROFILE="$gpt_span:$work/trace_ours_gpt.json" tmb "$here/bin/gpt" --config "$here/configs/gpt_ddp.toml" \
    --output_dir "$work/gpt_profile" "${gpt_args[@]}"
  BOOSTER_EXAMPLE_PROFILE="$gpt_span:$work/trace_peer_gpt.json" tm "$PY" "$here/peer/gpu_peer_gpt.py" \
    --config "$here/configs/gpt_ddp.toml" --corpus "$here/data/gpt/kjv.txt" --val_books Ruth \
    --warmup_steps $((gpt_first - 1)) --steps $((gpt_last - gpt_first + 1)) --max_steps 300 --device "$dev"
  step_status=PASS
  for name in ours_fashion_mnist:$((fm_last - fm_first + 1)) peer_fashion_mnist:$((fm_last - fm_first + 1)) \
              ours_gpt:$((gpt_last - gpt_first + 1)) peer_gpt:$((gpt_last - gpt_first + 1)); do
    local f="$work/trace_${name%%:*}.json"
    if [[ -s "$f" ]]; then
      "$PY" "$here/peer/gpu_trace_summary.py" "$f" "${name#*:}" "${name%%:*}" | tee -a "$txt"
      gzip -c "$f" >"$out/trace_${name%%:*}.json.gz" && made=$((made + 1))
    else
      step_status=FAIL; note "no trace ${name%%:*}"
    fi
  done
  lead "$made traces (trace_*.json.gz)"
}

run_step env 60 step_env
run_step cuda_kernel_tests 60 step_cuda_kernel_tests
run_step gpu_tests "${GPU_TESTS_LIMIT_S:-300}" step_gpu_tests
run_step fashion_mnist 75 step_fashion_mnist
run_step torch_peer 60 step_torch_peer
run_step gpt 100 step_gpt
run_step gpt_peer 90 step_gpt_peer
run_step gpt_fsdp 60 step_gpt_fsdp
run_step gpt_fsdp_peer 60 step_gpt_fsdp_peer
run_step bench_cuda_kernels 90 step_bench
run_step profile 90 step_profile

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
