#!/usr/bin/env bash
# Installs what Booster C++ needs, idempotently (Debian 12, as root or with sudo):
#   1. the Debian packages below;
#   2. LibTorch 2.11.0 (PyTorch's C++ library, CUDA 13.0 build, cxx11 ABI) as PyPI's torch==2.11.0 in
#      a virtual environment kept outside the clone, $BOOSTER_VENV (default ~/.cache/booster/venv), so
#      a fresh clone (CI) reuses it; its python3 is also the tests' and benchmarks' Python peer.
# CMake finds that LibTorch by default (CMakeLists.txt); -DTorch_DIR=... picks another.
set -euo pipefail

PKGS=(
  build-essential cmake ninja-build ccache pkg-config git
  libgloo-dev python3-venv
  libboost1.74-dev libboost-filesystem1.74-dev
  libtomlplusplus-dev nlohmann-json3-dev
  libgtest-dev libgmock-dev
  libcli11-dev libspdlog-dev libfmt-dev
  zlib1g-dev
  dataset-fashion-mnist bible-kjv
  procps iproute2 openssh-server
  clang libclang-rt-14-dev
  gnuplot-nox fonts-liberation
)

SUDO=""
if [ "$(id -u)" -ne 0 ]; then SUDO="sudo"; fi

missing=()
for p in "${PKGS[@]}"; do
  if ! dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed"; then
    missing+=("$p")
  fi
done

if [ ${#missing[@]} -gt 0 ]; then
  echo "install_deps: installing ${missing[*]}"
  export DEBIAN_FRONTEND=noninteractive
  $SUDO apt-get update -q
  $SUDO apt-get install -y -q --no-install-recommends "${missing[@]}"
else
  echo "install_deps: all ${#PKGS[@]} packages already installed"
fi

# LibTorch 2.11.0 and the Python peers, in one virtual environment (Debian's python3-venv). pip's
# cache (~/.cache/pip) makes a re-created environment a copy, not a download.
TORCH_VERSION=2.11.0
VENV="${BOOSTER_VENV:-${HOME}/.cache/booster/venv}"
probe='import sys, numpy, torch; print(torch.__version__, torch.utils.cmake_prefix_path)'
if [ -x "$VENV/bin/python3" ] && found="$("$VENV/bin/python3" -c "$probe" 2>/dev/null)" &&
   [ "${found%%[+ ]*}" = "$TORCH_VERSION" ]; then
  echo "install_deps: torch $TORCH_VERSION already in $VENV"
else
  echo "install_deps: installing torch==$TORCH_VERSION into $VENV (about 4.7 GB with its CUDA libraries)"
  mkdir -p "$(dirname "$VENV")"
  /usr/bin/python3 -m venv "$VENV"
  "$VENV/bin/python3" -m pip install --disable-pip-version-check -q "torch==$TORCH_VERSION" numpy
  found="$("$VENV/bin/python3" -c "$probe")"
fi
echo "install_deps: LibTorch $found"
# transformers: the reference of the HuggingFace interop tests (tests/hf), pinned.
TRANSFORMERS_VERSION=5.24.0
if [ "$("$VENV/bin/python3" -c 'import transformers; print(transformers.__version__)' 2>/dev/null)" = "$TRANSFORMERS_VERSION" ]; then
  echo "install_deps: transformers $TRANSFORMERS_VERSION already in $VENV"
else
  echo "install_deps: installing transformers==$TRANSFORMERS_VERSION into $VENV"
  "$VENV/bin/python3" -m pip install --disable-pip-version-check -q "transformers==$TRANSFORMERS_VERSION"
fi
[ "$("$VENV/bin/python3" -c 'import peft; print(peft.__version__)' 2>/dev/null)" = 0.21.2 ] || "$VENV/bin/python3" -m pip install --disable-pip-version-check -q "peft==0.21.2"  # peft: the LoRA reference of tests/hf/peft_interop_test.cpp, pinned
