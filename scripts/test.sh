#!/usr/bin/env bash
# Install into ./.venv if needed, then run the whole test suite (extra arguments go to pytest).
set -euo pipefail
cd "$(dirname "$0")/.."
# the tests of the Hugging Face and ONNX exports need their packages; the core install stays light
EXTRAS=test,huggingface,onnx bash scripts/setup.sh
.venv/bin/ruff check --quiet .  # pyflakes and import order (pyproject.toml [tool.ruff])
exec .venv/bin/python -m pytest -q "$@"
