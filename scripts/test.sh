#!/usr/bin/env bash
# Builds everything and runs the whole test suite (unit tests, multi-process tests on 127.0.0.1,
# the example end to end, and the out-of-tree consumer build). Exit status is ctest's.
set -euo pipefail
cd "$(dirname "$0")/.."
export CCACHE_DIR="${CCACHE_DIR:-$PWD/.ccache}"   # also used by the out-of-tree consumer test
bash scripts/build.sh
cd build
ctest --output-on-failure -j 2 --timeout 900
