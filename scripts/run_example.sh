#!/usr/bin/env bash
# The main job: builds only what it runs — the fashion_mnist example, the `booster` launcher and the
# torch_ddp plugin that examples/configs/ddp.toml names (loaded from build/bin/plugins/), not the
# test suite — then trains the Fashion-MNIST CNN on 2 ranks with that plugin.
# Extra arguments go to the example (e.g. --set train.epochs=2); `--set booster.plugin=NAME` for an
# in-tree plugin (plugins/NAME/) also builds that plugin.
set -euo pipefail
cd "$(dirname "$0")/.."
targets=(fashion_mnist booster_cli booster_plugin_torch_ddp)
for arg in "$@"; do
  if [[ "$arg" == booster.plugin=* || "$arg" == --set=booster.plugin=* ]]; then
    name="${arg#*booster.plugin=}"
    name="${name//\"/}"
    if [[ -d "plugins/$name" ]]; then targets+=("booster_plugin_$name"); fi
  fi
done
build_args=()
for t in "${targets[@]}"; do build_args+=(--target "$t"); done
bash scripts/build.sh "${build_args[@]}"
exec build/bin/booster run --nproc_per_node 2 build/bin/fashion_mnist \
  --config examples/configs/ddp.toml --output_dir runs/fashion_mnist_ddp "$@"
