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
# Whether the venv holds aiayn and every requirement of the chosen extras, asked from outside the
# source tree (from the repository root `import aiayn` would find the source even when the
# install failed).
installed() {
  (cd / && "$OLDPWD/$VENV/bin/python" - "$EXTRAS" <<'PY'
import sys
from importlib.metadata import PackageNotFoundError, distribution, version

try:
    from packaging.requirements import Requirement
except ImportError:  # a venv without the test extra: pip's own copy
    from pip._vendor.packaging.requirements import Requirement

extras = set(sys.argv[1].split(","))
missing = []
for line in distribution("aiayn").requires or []:
    req = Requirement(line)
    if req.marker and not any(req.marker.evaluate({"extra": e}) for e in extras | {""}):
        continue
    try:
        if not req.specifier.contains(version(req.name), prereleases=True):
            missing.append(f"{req} (found {version(req.name)})")
    except PackageNotFoundError:
        missing.append(str(req))
import aiayn, torch  # noqa: E401,F401  the package itself, from the venv
if missing:
    sys.exit("missing from .venv: " + ", ".join(missing))
PY
  )
}
if [ -f "$stamp" ] && [ "$(cat "$stamp")" = "$want" ] && installed 2>/dev/null; then
  exit 0
fi
echo "setting up $VENV (first run: a few minutes) ..." >&2
[ -x "$VENV/bin/python" ] || "$PYTHON" -m venv "$VENV"
rm -f "$stamp"
# pip's own exit status decides (a failed install stops the script); the filter only drops one
# harmless warning line and must not turn a failure into success.
pip_q() {
  "$VENV/bin/python" -m pip install -q --disable-pip-version-check "$@" 2>&1 \
    | { grep -v "is ignored: it is neither" || true; }
}
pip_q "$TORCH_SPEC"
pip_q -e ".[$EXTRAS]"
if ! installed; then
  echo "setup failed: .venv lacks what aiayn[$EXTRAS] requires (above); it is not marked ready" >&2
  exit 1
fi
"$VENV/bin/python" -c "import aiayn, torch; print('aiayn', aiayn.__version__, 'torch', torch.__version__)" >&2
echo "$want" > "$stamp"
