#!/usr/bin/env bash
# The one command of the benchmark suite: builds Booster C++ into build/ (scripts/build.sh: Debian
# packages, Release, ccache), then runs every benchmark (benchmarks/run_benchmarks.py) and rewrites
# docs/benchmarks.md. Takes under 15 minutes on a 2-core machine. Arguments go to the runner:
#   bash scripts/run_benchmarks.sh --only collectives,startup   # some benchmarks
#   bash scripts/run_benchmarks.sh --reps 3                     # fewer repetitions
#   bash scripts/run_benchmarks.sh --smoke                      # seconds; writes a temp file, not the docs
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/build.sh
exec "${BOOSTER_VENV:-$HOME/.cache/booster/venv}/bin/python3" benchmarks/run_benchmarks.py --build-dir build "$@"
