#!/usr/bin/env bash
# Builds everything and runs the whole test suite (unit tests, multi-process tests on 127.0.0.1,
# the example end to end, and the out-of-tree consumer build). Exit status is ctest's.
#
#   bash scripts/test.sh              build/ (Release), every test (what CI runs)
#   bash scripts/test.sh --sanitize   build-sanitize/ with AddressSanitizer + UndefinedBehaviorSanitizer
#                                     (BOOSTER_SANITIZE), the unit and distributed tests (ctest labels
#                                     unit and dist); any sanitizer report fails its test
set -euo pipefail
cd "$(dirname "$0")/.."
sanitize=0
for arg in "$@"; do
  case "$arg" in
    --sanitize) sanitize=1 ;;
    *) echo "test.sh: unknown argument '$arg' (the one option is --sanitize)" >&2; exit 2 ;;
  esac
done
# ccache outside the clone (also used by the out-of-tree consumer test): see scripts/build.sh.
export CCACHE_DIR="${CCACHE_DIR:-$HOME/.cache/booster/ccache}"
export CCACHE_BASEDIR="${CCACHE_BASEDIR:-$PWD}"
if ((sanitize)); then
  bash scripts/build.sh --build-dir build-sanitize -DBOOSTER_SANITIZE=ON -DBOOSTER_BUILD_BENCHMARKS=OFF
  cd build-sanitize
  # Leak checking is off: LibTorch's static registries and the plugins (never unloaded, by design)
  # are alive at exit. A report exits the process with status 1, which fails the test.
  export ASAN_OPTIONS="detect_leaks=0:detect_stack_use_after_return=0:strict_string_checks=1"
  export UBSAN_OPTIONS="print_stacktrace=1:halt_on_error=1"
  ctest --output-on-failure -j 2 --timeout 1800 -L "unit|dist"
else
  bash scripts/build.sh
  cd build
  ctest --output-on-failure -j 2 --timeout 900
fi
