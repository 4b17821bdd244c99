"""A model directory handed to other runtimes (`aiayn export --format ...`), one module each:

- `huggingface` Hugging Face Transformers' `MarianMTModel`, or `PegasusForConditionalGeneration`
                for a pre-norm model (weights permuted, loaded as they are);
- `onnx`        an encoder and an incremental decoder as ONNX graphs, and `OnnxGreedy` to run them;
- `ctranslate2` CTranslate2's model spec, for its int8 and float32 CPU decoding.

Each imports its optional package where it is used: without it the module still imports and the
command says what to install.
"""

from __future__ import annotations

import importlib
from typing import Any

from aiayn.config import MAX_SEQUENCE
from aiayn.errors import UserError


def check_max_positions(n: int | None) -> None:
    """Refuse (one line) a `--max-positions` that sizes no sane position table (None: the default)."""
    if n is not None and not 2 <= n <= MAX_SEQUENCE:
        raise UserError(f"--max-positions must be between 2 and {MAX_SEQUENCE}, got {n}")


def require(module: str, needed_by: str, install: str) -> Any:
    """An exporter's optional package, imported where it is used (each is large): a one-line
    UserError naming what to install when it is missing."""
    try:
        return importlib.import_module(module)
    except ImportError:
        raise UserError(f"{needed_by} needs the {module} package: pip install {install}") from None
