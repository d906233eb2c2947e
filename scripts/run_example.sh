#!/usr/bin/env bash
# The main job: builds everything, then trains the Fashion-MNIST CNN on 2 ranks with the TorchDDP
# plugin (loaded from build/bin/plugins/booster_plugin_torch_ddp.so, chosen in the TOML config).
# Extra arguments go to the example (e.g. --set train.epochs=2).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/build.sh
exec build/bin/booster run --nproc_per_node 2 build/bin/fashion_mnist \
  --config examples/configs/ddp.toml --output_dir runs/fashion_mnist_ddp "$@"
