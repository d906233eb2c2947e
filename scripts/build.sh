#!/usr/bin/env bash
# Installs the Debian packages (scripts/install_deps.sh), then configures and builds Booster C++
# into build/ (Release, Ninja, ccache in ~/.cache/booster/ccache: kept outside the clone, with paths
# hashed relative to the clone, so a fresh clone of the same sources (CI) compiles from the cache).
#
#   bash scripts/build.sh [--build-dir DIR] [--target TARGET]... [CMAKE_CONFIGURE_ARGS...]
#
# DIR defaults to build (scripts/test.sh --sanitize uses build-sanitize).
# Without --target it builds everything, the test suite included (scripts/test.sh); with one or
# more, only those targets and what they depend on (scripts/run_example.sh). Every other argument
# goes to cmake's configure step.
set -euo pipefail
cd "$(dirname "$0")/.."
targets=()
configure_args=()
build_dir=build
while (($#)); do
  case "$1" in
    --build-dir)
      if (($# < 2)); then
        echo "build.sh: --build-dir needs a directory, e.g. --build-dir build-sanitize" >&2
        exit 2
      fi
      build_dir="$2"
      shift 2
      ;;
    --target)
      if (($# < 2)); then
        echo "build.sh: --target needs a target name, e.g. --target booster_cli" >&2
        exit 2
      fi
      targets+=("$2")
      shift 2
      ;;
    --target=*) targets+=("${1#--target=}"); shift ;;
    *) configure_args+=("$1"); shift ;;
  esac
done
bash scripts/install_deps.sh
export CCACHE_DIR="${CCACHE_DIR:-$HOME/.cache/booster/ccache}"
export CCACHE_BASEDIR="${CCACHE_BASEDIR:-$PWD}"
cmake -S . -B "$build_dir" -G Ninja -DCMAKE_BUILD_TYPE=Release "${configure_args[@]}"
if ((${#targets[@]})); then
  cmake --build "$build_dir" --target "${targets[@]}"
else
  cmake --build "$build_dir"
fi
