#!/usr/bin/env bash
# run_fuzz.sh — builds the safetensors header fuzzer (libFuzzer + ASan + UBSan, parser only: no
# LibTorch code is linked) and runs it for a bounded time.
#
#   tests/fuzz/run_fuzz.sh [OUTPUT_DIR] [SECONDS] [extra libFuzzer args...]
#
# OUTPUT_DIR (default build-fuzz) receives the binary, the working corpus (seeded from
# tests/fuzz/corpus) and any crash-* / leak-* / timeout-* / oom-* reproducers. SECONDS defaults to
# 60. Exits non-zero if the build fails or the fuzzer finds a crash, leak, timeout or OOM.
# Needs clang++ with the libFuzzer runtime (Debian: clang + libclang-rt-14-dev).
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
root="$(cd "$here/../.." && pwd)"
out="${1:-$root/build-fuzz}"
seconds="${2:-60}"
shift $(( $# > 2 ? 2 : $# ))

CXX="${FUZZ_CXX:-clang++}"
if ! command -v "$CXX" >/dev/null 2>&1; then
  echo "run_fuzz: $CXX not found (install clang and libclang-rt-14-dev)" >&2
  exit 2
fi
if ! [[ "$seconds" =~ ^[0-9]+$ ]] || [ "$seconds" -lt 1 ]; then
  echo "run_fuzz: SECONDS must be a positive integer, got '$seconds'" >&2
  exit 2
fi

mkdir -p "$out/corpus" "$out/artifacts"
out="$(cd "$out" && pwd)"
bin="$out/safetensors_fuzz"

echo "run_fuzz: building $bin"
"$CXX" -std=c++17 -O1 -g -fno-omit-frame-pointer \
  -fsanitize=fuzzer,address,undefined -fno-sanitize-recover=undefined \
  -Wall -Wextra -Wno-unused-parameter \
  -I"$root/booster/include" \
  "$here/safetensors_fuzz.cpp" "$root/booster/src/checkpoint/safetensors_header.cpp" \
  -o "$bin"

# The fixtures of other implementations are good seeds too.
seeds=("$here/corpus")
fixtures="$root/tests/fixtures/safetensors"
if [ -d "$fixtures" ]; then seeds+=("$fixtures"); fi

echo "run_fuzz: fuzzing for ${seconds}s"
cd "$out/artifacts"
set +e
ASAN_OPTIONS="${ASAN_OPTIONS:-detect_leaks=1:allocator_may_return_null=0}" \
UBSAN_OPTIONS="${UBSAN_OPTIONS:-print_stacktrace=1:halt_on_error=1}" \
  "$bin" -max_total_time="$seconds" -timeout=10 -rss_limit_mb=2048 -max_len=65536 \
  -print_final_stats=1 -dict="$here/safetensors.dict" -artifact_prefix="$out/artifacts/" \
  "$@" "$out/corpus" "${seeds[@]}"
rc=$?
set -e
if [ $rc -ne 0 ]; then
  echo "run_fuzz: FAILED (exit $rc); reproducers in $out/artifacts:" >&2
  ls -1 "$out/artifacts" >&2 || true
  exit 1
fi
echo "run_fuzz: no findings in ${seconds}s"
