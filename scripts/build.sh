#!/usr/bin/env bash
# Installs the Debian packages (scripts/install_deps.sh), then configures and builds Booster C++
# into build/ (Release, Ninja, ccache in .ccache/). Extra arguments go to cmake's configure step.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/install_deps.sh
export CCACHE_DIR="${CCACHE_DIR:-$PWD/.ccache}"
cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE=Release "$@"
cmake --build build
