#!/usr/bin/env bash
# Install into ./.venv if needed, then run the whole test suite (extra arguments go to pytest).
set -euo pipefail
cd "$(dirname "$0")/.."
# the tests of the Hugging Face and ONNX exports need their packages; the core install stays light
EXTRAS=test,huggingface,onnx bash scripts/setup.sh
.venv/bin/ruff check --quiet .  # pyflakes and import order (pyproject.toml [tool.ruff])
# One worker per core, at most 4: each test computes on one thread (tests/conftest.py), so two
# workers on two cores take about half the time of one. TEST_WORKERS=0 runs in this process.
WORKERS=${TEST_WORKERS:-$(n=$(nproc); echo $((n < 4 ? n : 4)))}
exec .venv/bin/python -m pytest -q -n "$WORKERS" "$@"
