#!/usr/bin/env bash
# Install into ./.venv if needed, then run the default test suite (slow tests excluded; add
# `-m slow` to run those, or any other pytest arguments).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
exec .venv/bin/python -m pytest -q "$@"
