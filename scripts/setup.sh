#!/usr/bin/env bash
# Create ./.venv with aiayn installed (editable). torch==2.13.0 goes in first so that pip never
# resolves `torch` to a multi-gigabyte CUDA build. Re-running is fast: it only checks.
# Override the interpreter with PYTHON=..., the torch requirement with TORCH_SPEC=..., the
# optional dependencies with EXTRAS=... (default test; scripts/test.sh adds the exporters').
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON=${PYTHON:-$(command -v python3.11 || command -v python3)}
TORCH_SPEC=${TORCH_SPEC:-torch==2.13.0}
EXTRAS=${EXTRAS:-test}
VENV=.venv
stamp="$VENV/.aiayn-installed"
want="$(sha256sum pyproject.toml | cut -c1-16) $TORCH_SPEC [$EXTRAS]"
if [ -f "$stamp" ] && [ "$(cat "$stamp")" = "$want" ] && "$VENV/bin/python" -c "import aiayn, torch" 2>/dev/null; then
  exit 0
fi
echo "setting up $VENV (first run: a few minutes) ..." >&2
[ -x "$VENV/bin/python" ] || "$PYTHON" -m venv "$VENV"
pip_q() { "$VENV/bin/python" -m pip install -q --disable-pip-version-check "$@" 2>&1 | grep -v "is ignored: it is neither" || true; }
pip_q "$TORCH_SPEC"
pip_q -e ".[$EXTRAS]"
"$VENV/bin/python" -c "import aiayn, torch; print('aiayn', aiayn.__version__, 'torch', torch.__version__)" >&2
echo "$want" > "$stamp"
