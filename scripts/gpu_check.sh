#!/usr/bin/env bash
# gpu_check.sh — builds Booster C++ for Hopper and packs everything a GPU check needs into one
# directory (the bundle), which is then carried to a GPU machine and run there with `bash DIR/run.sh`.
#
#   bash scripts/gpu_check.sh --bundle DIR
#
# Here (no GPU needed): scripts/build.sh (which runs scripts/install_deps.sh, idempotent) configures
# build-gpu/ with -DBOOSTER_CUDA_ARCHITECTURES=90 (sm_90 code + compute_90 PTX) -DBOOSTER_WITH_CUDA=ON
# and builds TARGETS below. Needs the CUDA toolkit (/usr/local/cuda), the Fashion-MNIST gz files
# (/usr/share/datasets/fashion-mnist) and `bible` (bible-kjv) for the GPT text.
# The GPU machine needs only python3 with torch 2.11.0+cu130 (its torch/lib, nvidia/cu13/lib and
# nvidia/nccl/lib give LibTorch, the CUDA runtime and NCCL); see scripts/gpu_run.sh.
#
# DIR (replaced; at most 60 MiB, checked):
#   bin/      the executables of TARGETS            plugins/  the booster_plugin_*.so of TARGETS
#   lib/      libbooster*.so* and every other shared library they load that the GPU machine lacks
#             (spdlog, fmt, toml++, zlib, ...), not LibTorch, CUDA, NCCL, glibc, libstdc++, libgcc, libgomp
#   data/     fashion-mnist/*.gz, gpt/kjv.txt (`bible` Genesis..Ruth, 1.1 MB; Ruth is the held-out book)
#   configs/  ddp.toml, gpt_ddp.toml, gpt_fsdp.toml  peer/  gpu_peer_fashion_mnist.py, gpu_peer_gpt.py, gpu_peer_profile.py (the
#                                                    PyTorch peers of fashion_mnist and gpt)
#   run.sh    a copy of scripts/gpu_run.sh    MANIFEST  commit, build settings, every file with its size
# Every ELF file's RUNPATH is rewritten to $ORIGIN-relative paths (no /work/main or venv path at run
# time). Fails with a message when a target is unknown to the build, the build fails, a library is
# not found, or the bundle is over 60 MiB.
# GPU_CHECK_TARGETS="t1 t2 ..." replaces the list below (to test while some targets do not exist yet).
set -euo pipefail

# Every target the GPU check needs; a target the build does not know fails the script.
# (dist_worker, hybrid_worker: booster_gpu_tests starts them from its own directory; the plugins without CUDA support
# are there for the test that they refuse device = "cuda" by name.)
TARGETS=(
  booster_cuda_kernel_tests bench_cuda_kernels booster_gpu_tests dist_worker hybrid_worker booster_cuda booster_cli
  fashion_mnist gpt booster_plugin_torch_ddp booster_plugin_low_level_zero booster_plugin_torch_fsdp
  booster_plugin_gemini booster_plugin_hybrid_parallel
)
BUILD_DIR=build-gpu
MAX_BYTES=$((60 * 1024 * 1024))
FASHION_DIR=/usr/share/datasets/fashion-mnist

cd "$(dirname "$0")/.."
repo=$PWD
die() { echo "gpu_check: error: $*" >&2; exit 1; }

bundle=""
while (($#)); do
  case "$1" in
    --bundle) (($# >= 2)) || die "--bundle needs a directory"; bundle="$2"; shift 2 ;;
    --bundle=*) bundle="${1#--bundle=}"; shift ;;
    -h|--help) sed -n '2,25p' "$0"; exit 0 ;;
    *) die "unknown argument '$1' (usage: bash scripts/gpu_check.sh --bundle DIR)" ;;
  esac
done
[[ -n "$bundle" ]] || die "usage: bash scripts/gpu_check.sh --bundle DIR"
if [[ -n "${GPU_CHECK_TARGETS:-}" ]]; then
  read -r -a TARGETS <<<"$GPU_CHECK_TARGETS"
  echo "gpu_check: GPU_CHECK_TARGETS replaces the target list: ${TARGETS[*]}"
fi

# ---- 1. build (scripts/build.sh runs install_deps.sh, then cmake configure + build)
build_args=()
for t in "${TARGETS[@]}"; do build_args+=(--target "$t"); done
build_log=$(mktemp)
trap 'rm -f "$build_log"' EXIT
if ! bash scripts/build.sh --build-dir "$BUILD_DIR" "${build_args[@]}" \
    -DBOOSTER_CUDA_ARCHITECTURES=90 -DBOOSTER_WITH_CUDA=ON 2>&1 | tee "$build_log"; then
  unknown=()
  if [[ -f "$BUILD_DIR/build.ninja" ]]; then
    for t in "${TARGETS[@]}"; do
      ninja -C "$BUILD_DIR" -t query "$t" >/dev/null 2>&1 || unknown+=("$t")
    done
  fi
  ((${#unknown[@]} == 0)) || die "the build does not know the target(s): ${unknown[*]} (the TARGETS list at the top of scripts/gpu_check.sh; GPU_CHECK_TARGETS overrides it)"
  die "the build failed (scripts/build.sh --build-dir $BUILD_DIR; output above)"
fi

# ---- 2. the files each target builds (ninja knows them: the inputs of the target's phony edge)
outputs_of() {
  ninja -C "$BUILD_DIR" -t query "$1" | awk '/^  input:/ {on = 1; next} /^  outputs:/ {on = 0} on {print $1}'
}
[[ -n "$bundle" && "$bundle" != "/" ]] || die "refusing bundle directory '$bundle'"
if [[ -e "$bundle" ]]; then
  if [[ -n "$(ls -A "$bundle")" && ! -f "$bundle/MANIFEST" ]]; then
    die "$bundle exists, is not empty and is not a bundle (no MANIFEST): choose another directory"
  fi
  rm -rf "$bundle"
fi
mkdir -p "$bundle"/{bin,lib,plugins,data/fashion-mnist,data/gpt,configs,peer}
bundle=$(cd "$bundle" && pwd)
soname() { readelf -d "$1" 2>/dev/null | sed -n 's/.*(SONAME).*\[\(.*\)\]/\1/p'; }

for t in "${TARGETS[@]}"; do
  mapfile -t outs < <(outputs_of "$t")
  ((${#outs[@]})) || die "target $t builds no file that ninja reports"
  for o in "${outs[@]}"; do
    f="$BUILD_DIR/$o"
    [[ -f "$f" ]] || die "target $t: $f was not built"
    case "$o" in
      bin/plugins/*.so) cp -L "$f" "$bundle/plugins/" ;;
      *.so|*.so.*) name=$(soname "$f"); cp -L "$f" "$bundle/lib/${name:-$(basename "$f")}" ;;
      bin/*) cp -L "$f" "$bundle/bin/" ;;
      *) echo "gpu_check: note: target $t output $o is not packed (neither bin/ nor a shared library)" ;;
    esac
  done
done

# ---- 3. the shared libraries they load that the GPU machine does not give (ldd, on this machine)
from_gpu_machine() {  # $1 = soname, $2 = resolved path: LibTorch, CUDA, NCCL, glibc and the GCC runtime
  case "$1" in
    linux-vdso.so*|ld-linux*|libc.so*|libm.so*|libdl.so*|libpthread.so*|librt.so*|libutil.so*) return 0 ;;
    libresolv.so*|libmvec.so*|libanl.so*|libstdc++.so*|libgcc_s.so*|libgomp.so*) return 0 ;;
    libtorch*|libc10*|libcuda.so*|libcudart*|libnccl*|libcublas*|libcudnn*|libcufft*|libcurand*) return 0 ;;
    libcusparse*|libcusolver*|libcupti*|libnvrtc*|libnvJitLink*|libnvToolsExt*|libcufile*|libnvshmem*) return 0 ;;
  esac
  case "$2" in */nvidia/*|*/torch/lib/*|/usr/local/cuda*) return 0 ;; esac
  return 1
}
missing=()
for f in "$bundle"/bin/* "$bundle"/plugins/* "$bundle"/lib/*; do
  [[ -f "$f" ]] || continue
  # Resolve against the build tree (the copies' RUNPATH is rewritten below).
  src="$BUILD_DIR/${f#"$bundle"/}"; [[ "$f" == "$bundle"/plugins/* ]] && src="$BUILD_DIR/bin/plugins/$(basename "$f")"
  [[ -f "$src" ]] || src="$f"
  while read -r name arrow path _; do
    [[ "$arrow" == "=>" ]] || continue
    if [[ "$path" == "not" ]]; then missing+=("$(basename "$f"): $name"); continue; fi
    from_gpu_machine "$name" "$path" && continue
    [[ -f "$bundle/lib/$name" ]] || cp -L "$path" "$bundle/lib/$name"
  done < <(LD_LIBRARY_PATH="$repo/$BUILD_DIR/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}" ldd "$src" 2>/dev/null || true)
done
((${#missing[@]} == 0)) || die "shared libraries not found here: ${missing[*]}"

# ---- 4. RUNPATH: only $ORIGIN-relative entries (run.sh sets LD_LIBRARY_PATH for the rest)
rpath_script=$(mktemp --suffix=.cmake)
trap 'rm -f "$build_log" "$rpath_script"' EXIT
cat >"$rpath_script" <<'EOF'
file(RPATH_SET FILE "${F}" NEW_RPATH "${R}")
EOF
for f in "$bundle"/bin/* "$bundle"/plugins/* "$bundle"/lib/*; do
  readelf -d "$f" 2>/dev/null | grep -qE '\((RUNPATH|RPATH)\)' || continue
  case "$f" in "$bundle"/lib/*) r="\$ORIGIN" ;; *) r="\$ORIGIN/../lib" ;; esac
  cmake -DF="$f" -DR="$r" -P "$rpath_script" || die "could not rewrite the RUNPATH of $f"
done
for f in "$bundle"/bin/* "$bundle"/plugins/* "$bundle"/lib/*; do
  rp=$(readelf -d "$f" 2>/dev/null | sed -n 's/.*(\(RUNPATH\|RPATH\)).*\[\(.*\)\]/\2/p')
  for entry in ${rp//:/ }; do
    [[ "$entry" == "\$ORIGIN"* ]] || die "$f keeps the RUNPATH entry $entry (a path of this machine)"
  done
done

# ---- 5. data, configs, the peer, run.sh
for g in train-images-idx3-ubyte train-labels-idx1-ubyte t10k-images-idx3-ubyte t10k-labels-idx1-ubyte; do
  [[ -f "$FASHION_DIR/$g.gz" ]] || die "$FASHION_DIR/$g.gz missing (apt-get install dataset-fashion-mnist)"
  cp "$FASHION_DIR/$g.gz" "$bundle/data/fashion-mnist/"
done
# The GPT example's corpus is the raw `bible` output (examples/gpt/data.h); Genesis..Ruth is enough
# for a bounded run, with Ruth as the held-out book (train.val_books = "Ruth" in run.sh).
command -v bible >/dev/null || die "'bible' not found (apt-get install bible-kjv)"
bible -f Gen1:1-Ruth4:22 >"$bundle/data/gpt/kjv.txt"
grep -q '^Ruth4:22 ' "$bundle/data/gpt/kjv.txt" || die "bible -f Gen1:1-Ruth4:22 gave no Ruth 4:22"
cp examples/configs/ddp.toml examples/configs/gpt_ddp.toml examples/configs/gpt_fsdp.toml "$bundle/configs/"
cp scripts/gpu_peer_fashion_mnist.py scripts/gpu_peer_gpt.py scripts/gpu_peer_profile.py scripts/gpu_trace_summary.py "$bundle/peer/"
cp scripts/gpu_run.sh "$bundle/run.sh"
chmod +x "$bundle/run.sh"

# ---- 6. MANIFEST and the size limit
total=$(find "$bundle" -type f -printf '%s\n' | awk '{s += $1} END {print s + 0}')
{
  echo "# Booster C++ GPU check bundle (scripts/gpu_check.sh); run: bash run.sh [--out DIR]"
  echo "commit $(git rev-parse HEAD 2>/dev/null || echo unknown)" \
       "($(git status --porcelain 2>/dev/null | wc -l) files changed or untracked in the working tree)"
  echo "built $(date -u +%Y-%m-%dT%H:%M:%SZ) on $(uname -n): $BUILD_DIR, CUDA architectures 90, targets: ${TARGETS[*]}"
  echo "total $total bytes ($((total / 1024 / 1024)) MiB) before this file; bytes path:"
  (cd "$bundle" && find . -type f ! -name MANIFEST -printf '%s %P\n' | sort -k2)
} >"$bundle/MANIFEST"
total=$(du -sb "$bundle" | cut -f1)
if ((total > MAX_BYTES)); then
  echo "gpu_check: the largest files:" >&2
  (cd "$bundle" && find . -type f -printf '%s %P\n' | sort -rn | head -n 10) >&2
  die "the bundle $bundle is $total bytes, over the limit of $MAX_BYTES (60 MiB)"
fi
echo "gpu_check: bundle $bundle: $total bytes ($((total / 1024 / 1024)) MiB, limit 60 MiB)," \
     "$(find "$bundle" -type f | wc -l) files; on the GPU machine: bash $bundle/run.sh [--out DIR]"
