#!/usr/bin/env bash
# run_fuzz.sh — builds a fuzzer (libFuzzer + ASan + UBSan, parser only: no LibTorch code is
# linked, except for pickle) and runs it for a bounded time. FUZZ_TARGET picks it: safetensors
# (default: the safetensors header and offsets), config (the TOML config reader and --set
# overrides), index (a HuggingFace index's weight_map), sharded_index (a sharded checkpoint's
# <base>.sharded.json) or pickle (the restricted unpickler of .bin files).
#
#   [FUZZ_TARGET=config] tests/fuzz/run_fuzz.sh [OUTPUT_DIR] [SECONDS] [extra libFuzzer args...]
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

# LibTorch's headers (our public headers include ATen's) and, for pickle, its libraries:
# BOOSTER_TORCH_PREFIX (ctest passes the one CMake found), else the venv install_deps.sh makes.
torch_prefix="${BOOSTER_TORCH_PREFIX:-}"
if [ -z "$torch_prefix" ]; then
  torch_prefix="$(ls -d "${BOOSTER_VENV:-$HOME/.cache/booster/venv}"/lib/python3*/site-packages/torch 2>/dev/null | head -1)"
fi
if [ ! -f "$torch_prefix/include/ATen/ATen.h" ]; then
  echo "run_fuzz: LibTorch headers not found (BOOSTER_TORCH_PREFIX='$torch_prefix'); run scripts/install_deps.sh" >&2
  exit 2
fi
torch_includes=(-isystem "$torch_prefix/include" -isystem "$torch_prefix/include/torch/csrc/api/include")

target="${FUZZ_TARGET:-safetensors}"
case "$target" in
  safetensors)
    sources=("$here/safetensors_fuzz.cpp" "$root/booster/src/checkpoint/safetensors_header.cpp")
    seeds=("$here/corpus")
    # The fixtures of other implementations are good seeds too.
    if [ -d "$root/tests/fixtures/safetensors" ]; then seeds+=("$root/tests/fixtures/safetensors"); fi
    dict=(-dict="$here/safetensors.dict")
    defines=()
    libs=()
    ;;
  config)
    sources=("$here/config_fuzz.cpp" "$root/booster/src/config.cpp" "$root/booster/src/options.cpp"
             "$root/booster/src/config_text.cpp" "$root/booster/src/did_you_mean.cpp"
             "$root/booster/src/io/atomic_write.cpp")
    seeds=("$here/corpus_config")
    dict=()
    # toml++'s internal debug assertions off, as in every release build of ours (NDEBUG): one fires
    # on a table header such as "[`x]" before toml++ reports its own parse error (found by this
    # fuzzer; with NDEBUG the input is a clear ConfigError).
    # toml++ 3.3.0 (Debian 12) also reaches TOML_UNREACHABLE (__builtin_unreachable) in its
    # generated is_non_ascii_horizontal_whitespace for some non-ASCII code points outside strings,
    # e.g. a file holding only "μ" (found by this fuzzer; later toml++ releases return false there).
    # Our release build gives a clear ConfigError for such input (checked); the sanitizer's
    # unreachable check is off here so the fuzzer can look past it.
    defines=('-DTOML_ASSERT(expr)=((void)0)' -fno-sanitize=unreachable)
    libs=()
    ;;
  index)
    sources=("$here/index_fuzz.cpp" "$root/booster/src/checkpoint/index_json.cpp")
    seeds=("$here/corpus_index")
    dict=()
    defines=()
    libs=()
    ;;
  sharded_index)
    sources=("$here/sharded_index_fuzz.cpp" "$root/booster/src/checkpoint/sharded_index.cpp"
             "$root/booster/src/checkpoint/index_json.cpp" "$root/booster/src/checkpoint/safetensors_header.cpp")
    seeds=("$here/corpus_sharded_index")
    dict=()
    defines=()
    libs=()
    ;;
  pickle)
    # The unpickler needs LibTorch (tensors, the zip reader): linked as the wheel ships it
    # (uninstrumented); only our sources are instrumented.
    sources=("$here/pickle_fuzz.cpp" "$root/booster/src/checkpoint/torch_unpickler.cpp")
    seeds=("$here/corpus_pickle")
    dict=()
    defines=(-fno-sanitize=vptr)
    libs=(-L"$torch_prefix/lib" -Wl,-rpath,"$torch_prefix/lib" -ltorch_cpu -lc10)
    ;;
  *)
    echo "run_fuzz: FUZZ_TARGET must be safetensors, config, index, sharded_index or pickle, got '$target'" >&2
    exit 2
    ;;
esac

mkdir -p "$out/corpus_$target" "$out/artifacts"
out="$(cd "$out" && pwd)"
bin="$out/${target}_fuzz"

echo "run_fuzz: building $bin"
"$CXX" -std=c++17 -O1 -g -fno-omit-frame-pointer \
  -fsanitize=fuzzer,address,undefined -fno-sanitize-recover=undefined \
  -Wall -Wextra -Wno-unused-parameter \
  -I"$root/booster/include" -I"$root/booster/src" "${torch_includes[@]}" "${defines[@]}" \
  "${sources[@]}" "${libs[@]}" \
  -o "$bin"

echo "run_fuzz: fuzzing for ${seconds}s"
cd "$out/artifacts"
set +e
ASAN_OPTIONS="${ASAN_OPTIONS:-detect_leaks=1:allocator_may_return_null=0}" \
UBSAN_OPTIONS="${UBSAN_OPTIONS:-print_stacktrace=1:halt_on_error=1}" \
  "$bin" -max_total_time="$seconds" -timeout=10 -rss_limit_mb=2048 -max_len=65536 \
  -print_final_stats=1 "${dict[@]}" -artifact_prefix="$out/artifacts/" \
  "$@" "$out/corpus_$target" "${seeds[@]}"
rc=$?
set -e
if [ $rc -ne 0 ]; then
  echo "run_fuzz: FAILED (exit $rc); reproducers in $out/artifacts:" >&2
  ls -1 "$out/artifacts" >&2 || true
  exit 1
fi
echo "run_fuzz: no findings in ${seconds}s"
