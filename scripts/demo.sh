#!/usr/bin/env bash
# Install into ./.venv if needed, then run the main job on its built-in default: train and
# evaluate grapheme-to-phoneme conversion on the CMU Pronouncing Dictionary (offline, CPU).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
exec .venv/bin/aiayn demo "$@"
