#!/usr/bin/env bash
# test_gpu_check.sh — checks scripts/gpu_check.sh and the bundle's run.sh (scripts/gpu_run.sh) on a
# machine without GPU (no ctest; a few minutes, most of it the smoke run on the CPU):
#
#   bash scripts/test_gpu_check.sh [WORK_DIR]      WORK_DIR default: a fresh temporary directory
#
#  1. a target the build does not know makes gpu_check.sh fail, naming it;
#  2. gpu_check.sh --bundle with the TARGETS of gpu_check.sh that the build knows today (the others
#     are listed as missing): size <= 60 MiB, MANIFEST, run.sh, data, only $ORIGIN RUNPATHs, no
#     LibTorch/CUDA/glibc library packed;
#  3. run.sh --out DIR: finishes, writes exactly gpu_check.txt and gpu_check.log, prints a summary row
#     (PASS/FAIL/SKIP) for each of its 9 steps, a program missing from the bundle is a FAIL naming it,
#     without a GPU env FAILs and the GPU steps SKIP, and the exit status is non-zero;
#  4. OUT=DIR run.sh (no --out) writes into $OUT;
#  5. GPU_CHECK_SMOKE=1 run.sh: fashion_mnist, gpt and the PyTorch peers (gpt_peer, torch_peer) run a
#     few CPU steps and their numbers (samples/s, tokens/s, the ours/PyTorch ratios) reach the
#     summary; gpt_peer measures the same steps as gpt's last eval window; profile writes and
#     summarises 4 traces.
# Needs what gpu_check.sh needs, and the venv's python3 (~/.cache/booster/venv) as BOOSTER_PYTHON.
# Exit status: the number of failed checks (0 = all passed).
set -uo pipefail
cd "$(dirname "$0")/.." || exit 1
work="${1:-$(mktemp -d /tmp/test_gpu_check.XXXXXX)}"
mkdir -p "$work"
export BOOSTER_PYTHON="${BOOSTER_PYTHON:-${BOOSTER_VENV:-$HOME/.cache/booster/venv}/bin/python3}"
fails=0
check() {  # check DESCRIPTION COMMAND...: runs the command, PASS when it exits 0
  local what=$1; shift
  if "$@" >/dev/null 2>&1; then echo "PASS  $what"; else echo "FAIL  $what"; fails=$((fails + 1)); fi
}

# 1. an unknown target
GPU_CHECK_TARGETS="fashion_mnist no_such_target_gpu_check" bash scripts/gpu_check.sh --bundle "$work/b0" \
  >"$work/unknown.log" 2>&1
rc=$?
check "unknown target: gpu_check.sh fails" test "$rc" -ne 0
check "unknown target: the message names it" grep -q "does not know the target(s): no_such_target_gpu_check" "$work/unknown.log"

# 2. the bundle, with the targets the build knows
mapfile -t all < <(sed -n '/^TARGETS=(/,/^)/p' scripts/gpu_check.sh | sed '1d;$d' | tr ' ' '\n' | sed '/^$/d')
known=() missing=()
for t in "${all[@]}"; do
  if ninja -C build-gpu -t query "$t" >/dev/null 2>&1; then known+=("$t"); else missing+=("$t"); fi
done
echo "targets in gpu_check.sh: ${#all[@]}; not known to the build yet: ${missing[*]:-none}"
GPU_CHECK_TARGETS="${known[*]}" bash scripts/gpu_check.sh --bundle "$work/bundle" >"$work/bundle.log" 2>&1
rc=$?
b="$work/bundle"
check "gpu_check.sh --bundle exits 0 (log: $work/bundle.log)" test "$rc" -eq 0
check "bundle at most 60 MiB ($(du -sb "$b" 2>/dev/null | cut -f1) bytes)" test "$(du -sb "$b" | cut -f1)" -le $((60 * 1024 * 1024))
for f in run.sh MANIFEST lib/libbooster.so.0 data/gpt/kjv.txt data/fashion-mnist/train-images-idx3-ubyte.gz \
         configs/ddp.toml configs/gpt_ddp.toml peer/gpu_peer_fashion_mnist.py peer/gpu_peer_gpt.py; do
  check "bundle has $f" test -s "$b/$f"
done
check "bundle lib/ has no LibTorch, CUDA, NCCL, glibc or GCC runtime" \
  bash -c "! ls '$b/lib' | grep -E '^(libtorch|libc10|libcuda|libcudart|libnccl|libc\\.so|libm\\.so|libstdc|libgcc|libgomp)'"
check "every RUNPATH in the bundle is \$ORIGIN-relative" \
  bash -c "! for f in '$b'/bin/* '$b'/plugins/* '$b'/lib/*; do readelf -d \"\$f\" | sed -n 's/.*(RUNPATH).*\\[\\(.*\\)\\]/\\1/p'; done | tr ':' '\\n' | grep -v '^\\\$ORIGIN'"

# 3. run.sh --out here (no GPU)
have_gpu=0
nvidia-smi -L >/dev/null 2>&1 && have_gpu=1
start=$SECONDS
timeout 600 bash "$b/run.sh" --out "$work/out" >"$work/run.stdout" 2>&1
rc=$?
echo "run.sh took $((SECONDS - start)) s, exit status $rc"
check "run.sh finishes in under 8 minutes" test $((SECONDS - start)) -lt 480
check "run.sh prints the summary" grep -q "===== summary" "$work/run.stdout"
check "run.sh writes exactly gpu_check.txt and gpu_check.log" \
  test "$(find "$work/out" -mindepth 1 -printf '%P ' | tr ' ' '\n' | sort | tr '\n' ' ')" = "gpu_check.log gpu_check.txt "
for s in env cuda_kernel_tests bench_cuda_kernels gpu_tests fashion_mnist gpt gpt_peer gpt_fsdp gpt_fsdp_peer torch_peer profile; do
  check "summary row for $s with PASS/FAIL/SKIP" bash -c "grep -qE '^$s +\\| (PASS|FAIL|SKIP) +\\| +[0-9]+ \\|' '$work/out/gpu_check.txt'"
done
for t in "${missing[@]}"; do  # the steps that run a program of the bundle
  case "$t" in
    booster_gpu_tests) s=gpu_tests ;; booster_cuda_kernel_tests) s=cuda_kernel_tests ;;
    bench_cuda_kernels | fashion_mnist | gpt) s=$t ;; *) continue ;;
  esac
  check "missing $t: $s is a FAIL naming it" \
    bash -c "grep -qE '^$s +\\| FAIL .*bin/$t is not in the bundle' '$work/out/gpu_check.txt'"
done
if ((!have_gpu)); then
  check "no GPU: env FAILs saying so" bash -c "grep -qE '^env +\\| FAIL .*no CUDA GPU visible' '$work/out/gpu_check.txt'"
  for s in fashion_mnist gpt gpt_peer gpt_fsdp gpt_fsdp_peer torch_peer profile; do
    check "no GPU: $s is a SKIP with the reason" bash -c "grep -qE '^$s +\\| SKIP .*no CUDA GPU visible' '$work/out/gpu_check.txt'"
  done
  check "run.sh exits non-zero when a step failed" test "$rc" -ne 0
fi

# 4. $OUT as the default output directory
mkdir -p "$work/out_env"
OUT="$work/out_env" timeout 600 bash "$b/run.sh" >/dev/null 2>&1
check "OUT=DIR: run.sh writes gpu_check.txt into \$OUT" test -s "$work/out_env/gpu_check.txt"

# 5. smoke mode: the examples and the peer on the CPU, their numbers in the summary
GPU_CHECK_SMOKE=1 timeout 600 bash "$b/run.sh" --out "$work/smoke" >"$work/smoke.stdout" 2>&1
sm="$work/smoke/gpu_check.txt"
if [[ " ${known[*]} " == *" fashion_mnist "* ]]; then
  check "smoke: fashion_mnist PASS with samples/s and accuracy" bash -c "grep -qE '^fashion_mnist +\\| PASS .*samples/s [0-9]+ test_accuracy 0\\.[0-9]+' '$sm'"
fi
if [[ " ${known[*]} " == *" gpt "* ]]; then
  check "smoke: gpt PASS with tokens/s and val_bpb" bash -c "grep -qE '^gpt +\\| PASS .*tokens/s [0-9]+ final val_bpb [0-9.]+' '$sm'"
  # gpt's last eval window (steps 4-6 when its 6 steps ran within max_minutes on a busy machine;
  # without one, its steps from 1) is the window gpt_peer measures.
  win=$(sed -n 's/^gpt .*| PASS .*steps \([0-9]*-[0-9]*\) tokens\/s [0-9].*/\1/p' "$sm")
  [[ -n "$win" ]] || win="1-[0-9]+"
  echo "gpt's measured window in the smoke run: steps $win"
  check "smoke: gpt_peer PASS with tokens/s over gpt's steps $win and the ours/PyTorch ratio" \
    bash -c "grep -qE '^gpt_peer +\\| PASS .*tokens/s [0-9]+ \\(steps $win[;)].*ours/PyTorch [0-9.]+' '$sm'"
fi
if [[ " ${known[*]} " == *" gpt "* ]]; then
  check "smoke: gpt_fsdp PASS with torch_fsdp tokens/s" bash -c "grep -qE '^gpt_fsdp +\\| PASS .*torch_fsdp tokens/s [0-9]+' '$sm'"
  check "smoke: gpt_fsdp_peer PASS with fully_shard tokens/s and the ours/PyTorch ratio" \
    bash -c "grep -qE '^gpt_fsdp_peer +\\| PASS .*fully_shard tokens/s [0-9]+ .*ours/PyTorch [0-9.]+' '$sm'"
fi
check "smoke: gpt_peer's line in gpu_check.txt" bash -c "grep -qE '^peer: gpt steps [0-9]+-[0-9]+: [0-9]+ training tokens/s' '$sm'"
check "smoke: torch_peer PASS with samples/s and the ours/PyTorch ratio" \
  bash -c "grep -qE '^torch_peer +\\| PASS .*samples/s [0-9]+ .*ours/PyTorch [0-9.]+' '$sm'"
check "smoke: profile PASS with 4 traces, summarised in gpu_check.txt and gzipped beside it" \
  bash -c "grep -qE '^profile +\\| PASS +\\| +[0-9]+ \\| 4 traces' '$sm' && grep -qE '^ours_gpt: [0-9.]+ us/step host wall' '$sm' &&
           grep -qE '^peer_fashion_mnist: [0-9.]+ us/step host wall' '$sm' && test -s '$work/smoke/trace_ours_gpt.json.gz'"

echo "test_gpu_check: $fails failed check(s); files in $work"
exit "$fails"
