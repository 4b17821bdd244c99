#!/usr/bin/env bash
# Create ./.venv-peers: aiayn (editable) plus the peers it is benchmarked against (
# benchmarks/bench_peers.py). Kept apart from .venv so the peers never touch the core install.
# Order matters: torch==2.13.0 first (a local CPU wheel; pip must never resolve torch itself, it
# would fetch a multi-gigabyte CUDA build), then aiayn, then benchmarks/requirements-peers.txt,
# then the two peers whose metadata pins an incompatible torch, with --no-deps.
# Idempotent: re-running only checks. Builds run under `nice -n 19` (the machine is shared).
# Override the interpreter with PYTHON=...
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON=${PYTHON:-$(command -v python3.11 || command -v python3)}
VENV=.venv-peers
REQS=benchmarks/requirements-peers.txt
TORCH_SPEC=torch==2.13.0
FAIRSEQ_SPEC=fairseq-fixed==0.12.3.1
ONMT_SPEC=OpenNMT-py==3.5.1
stamp="$VENV/.peers-installed"
want="$(cat pyproject.toml "$REQS" scripts/setup_peers.sh | sha256sum | cut -c1-16)"
PY="$VENV/bin/python"
check_imports() {
  PYTHONWARNINGS=ignore "$PY" - 2> >(grep -v "^INFO:" >&2) <<'PY'
import aiayn, torch, transformers, ctranslate2, fairseq, onmt
from transformers import MarianConfig, MarianMTModel  # noqa: F401
from fairseq import options, tasks  # noqa: F401
from onmt.model_builder import build_model  # noqa: F401
print("torch", torch.__version__, "transformers", transformers.__version__,
      "ctranslate2", ctranslate2.__version__, "fairseq", fairseq.__version__,
      "onmt", getattr(onmt, "__version__", "?"))
PY
}
if [ -f "$stamp" ] && [ "$(head -n1 "$stamp")" = "$want" ] && check_imports >/dev/null 2>&1; then
  exit 0
fi
rm -f "$stamp"
echo "setting up $VENV (first run: ~10 minutes, fairseq compiles) ..." >&2
[ -x "$PY" ] || "$PYTHON" -m venv "$VENV"
# pip warns once per missing local-index folder; drop those lines, keep the real errors.
quiet() { "$@" 2> >(grep -v "is ignored: it is neither" >&2); }
pip_i() { quiet nice -n 19 "$PY" -m pip install -q --disable-pip-version-check "$@"; }
pip_i "$TORCH_SPEC"
# Everything after this must keep the torch just installed: a constraints file makes pip fail
# instead of silently replacing it.
constraints="$VENV/torch-constraint.txt"
echo "$TORCH_SPEC" > "$constraints"
pip_i -c "$constraints" -e .
pip_i -c "$constraints" -r "$REQS"
if ! "$PY" -c "import fairseq" 2>/dev/null; then
  dl="$VENV/sdists"
  mkdir -p "$dl"
  # Its setup.py imports torch and numpy to build the C++/Cython extensions, so the build sees
  # this environment (no isolation); downloading first keeps pip from resolving its deps.
  quiet nice -n 19 "$PY" -m pip download -q --no-deps --no-build-isolation -d "$dl" "$FAIRSEQ_SPEC"
  pip_i --no-deps --no-build-isolation "$(ls "$dl"/fairseq*fixed-*)"
fi
"$PY" -c "import onmt" 2>/dev/null || pip_i --no-deps "$ONMT_SPEC"
"$PY" -c "import torch, sys; sys.exit(torch.__version__ != '2.13.0+cpu')" \
  || { echo "torch was replaced in $VENV; remove it and re-run" >&2; exit 1; }
check_imports >&2
printf '%s\n%s\n' "$want" "$(date -u +%FT%TZ)" > "$stamp"
