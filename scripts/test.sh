#!/usr/bin/env bash
# Install into ./.venv if needed, then run the test suite (extra arguments go to pytest).
#   bash scripts/test.sh           every test (CI runs this)
#   bash scripts/test.sh --fast    the inner loop: every test not marked `slow` (under 2 minutes on
#                                  2 cores; every module of aiayn still runs)
set -euo pipefail
cd "$(dirname "$0")/.."
# the tests of the Hugging Face and ONNX exports need their packages; the core install stays light
EXTRAS=test,huggingface,onnx bash scripts/setup.sh
.venv/bin/ruff check --quiet .  # pyflakes and import order (pyproject.toml [tool.ruff])
SELECT=()
if [ "${1:-}" = "--fast" ]; then
  shift
  SELECT=(-m "not slow")
fi
# One worker per core, at most 4: each test computes on one thread (tests/conftest.py), so two
# workers on two cores take about half the time of one. TEST_WORKERS=0 runs in this process.
# -rs lists every skipped test with its reason (hardware the machine lacks, say); under CI=true a
# test skipped for a missing package fails the run (tests/conftest.py).
WORKERS=${TEST_WORKERS:-$(n=$(nproc); echo $((n < 4 ? n : 4)))}
exec .venv/bin/python -m pytest -q -rs -n "$WORKERS" "${SELECT[@]}" "$@"
