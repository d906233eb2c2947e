#!/usr/bin/env bash
# The GPT example: builds only what it runs — the gpt example, the `booster` launcher and the plugin
# its config names (loaded from build/bin/plugins/) — then trains the GPT-2-style byte-level model
# on the King James Bible on 2 ranks (see docs/gpt.md). The corpus (raw output of the bible-kjv
# package's `bible` program) is cached at build/data/kjv.txt by the example on first use.
#
#   bash scripts/run_gpt.sh                               # examples/configs/gpt_ddp.toml
#   GPT_CONFIG=examples/configs/gpt_zero2.toml bash scripts/run_gpt.sh
#   bash scripts/run_gpt.sh --set train.max_minutes=5     # extra arguments go to the example
#   GPT_CONFIG=examples/configs/gpt_hybrid_tp2pp2.toml GPT_NPROC=4 bash scripts/run_gpt.sh   # 4 ranks
set -euo pipefail
cd "$(dirname "$0")/.."
config="${GPT_CONFIG:-examples/configs/gpt_ddp.toml}"
plugin=$(sed -n 's/^plugin *= *"\([A-Za-z0-9_]*\)".*/\1/p' "$config" | head -n 1)
for arg in "$@"; do
  if [[ "$arg" == booster.plugin=* || "$arg" == --set=booster.plugin=* ]]; then
    plugin="${arg#*booster.plugin=}"
    plugin="${plugin//\"/}"
  fi
done
targets=(gpt booster_cli)
if [[ -n "$plugin" && -d "plugins/$plugin" ]]; then targets+=("booster_plugin_$plugin"); fi
build_args=()
for t in "${targets[@]}"; do build_args+=(--target "$t"); done
bash scripts/build.sh "${build_args[@]}"
exec build/bin/booster run --nproc_per_node "${GPT_NPROC:-2}" build/bin/gpt --config "$config" "$@"
