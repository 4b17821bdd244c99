"""Reading files back and checking what they hold: every problem is a one-line `UserError` that
names the file (and the field).

- `reading(path)` turns the usual failures to open a file (missing, a directory, no permission)
  into such a line; `sha256_file` streams a file's checksum under it.
- `read_json` reads a JSON file and checks it against a small schema (`check_schema`), which also
  checks a config's fields and a torch-loaded trainer state.

Why not pydantic (installed through FastAPI): `check_schema` is needed anyway for the config and
the trainer state (tensors), and for the JSON files as well it is the smaller tool: meta.json's
schema is 5 lines as a dict and 12 as a pydantic model, manifest.json's 14 (plus 7 of count
checks) against 54, and pydantic's errors need 17 more lines to become these one-line messages.
Importing pydantic and building those models also took 0.3 s, which every command that loads a
model or a dataset would pay.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
from pathlib import Path
from typing import Any, Iterator

from aiayn.errors import UserError


@contextlib.contextmanager
def reading(path: str | os.PathLike, what: str = "a file") -> Iterator[None]:
    """Turn the usual failures to open `path` for reading (missing, a directory, no permission)
    into one-line UserErrors naming it."""
    try:
        yield
    except FileNotFoundError:
        raise UserError(f"{path}: no such file") from None
    except IsADirectoryError:
        raise UserError(f"{path}: is a directory, expected {what}") from None
    except PermissionError:
        raise UserError(f"{path}: permission denied") from None


def sha256_file(path: str | os.PathLike, chunk: int = 1 << 20) -> str:
    """SHA-256 of a file's bytes, streamed; a missing or unreadable file is a one-line `UserError`."""
    h = hashlib.sha256()
    with reading(path), open(path, "rb") as f:
        while block := f.read(chunk):
            h.update(block)
    return h.hexdigest()


OPTIONAL = "?"  # a schema key starting with it may be absent


def _describe(kind: Any) -> str:
    if kind is None:
        return "null"
    if isinstance(kind, tuple):
        return " or ".join(_describe(k) for k in kind)
    if isinstance(kind, frozenset):
        return "one of " + ", ".join(sorted(repr(v) for v in kind))
    if isinstance(kind, dict):
        return "an object"
    if isinstance(kind, list):
        return "a list"
    return {int: "an integer", float: "a number", bool: "true or false", str: "a string",
            dict: "an object", list: "a list"}.get(kind, getattr(kind, "__name__", str(kind)))


def _matches(value: Any, kind: Any) -> bool:
    if kind is None:
        return value is None
    if isinstance(kind, tuple):
        return any(_matches(value, k) for k in kind)
    if isinstance(kind, frozenset):
        return any(value == v and type(value) is type(v) for v in kind)
    if isinstance(kind, dict):
        return isinstance(value, dict)
    if isinstance(kind, list):
        return isinstance(value, (list, tuple))
    if kind is int:
        return isinstance(value, int) and not isinstance(value, bool)
    if kind is float:
        return isinstance(value, (int, float)) and not isinstance(value, bool)
    return isinstance(value, kind)


def check_schema(value: Any, schema: Any, where: str, field: str = "") -> None:
    """Check `value` (parsed JSON, or a torch-loaded state) against `schema`; raise a one-line
    UserError naming `where` and the field (dotted path) that is wrong. A schema is:
    a type (`int` excludes bool, `float` admits int), `None`, a tuple of alternatives, a frozenset
    of allowed values, a list `[item schema]`, or a dict `{key: schema}` whose keys are required
    unless they start with "?", or `{str: schema}` for an object of any keys. Keys a schema does
    not name are allowed (later versions may add fields)."""
    label = f"field {field!r}" if field else "the content"
    alternatives = schema if isinstance(schema, tuple) else (schema,)
    if not any(_matches(value, k) for k in alternatives):
        shown = repr(value) if len(repr(value)) <= 40 else repr(value)[:37] + "..."
        raise UserError(f"{where}: {label} must be {_describe(schema)}, got {shown}")
    for kind in alternatives:  # descend into the container alternative that matched
        if isinstance(kind, dict) and isinstance(value, dict):
            for key, sub in kind.items():
                if key is str:
                    for k, v in value.items():
                        check_schema(v, sub, where, f"{field}.{k}" if field else str(k))
                    continue
                optional = key.startswith(OPTIONAL)
                name = key[1:] if optional else key
                path = f"{field}.{name}" if field else name
                if name not in value:
                    if not optional:
                        raise UserError(f"{where}: field {path!r} is missing")
                    continue
                check_schema(value[name], sub, where, path)
        elif isinstance(kind, list) and isinstance(value, (list, tuple)) and kind:
            for i, v in enumerate(value):
                check_schema(v, kind[0], where, f"{field}[{i}]")


def read_json(path: str | os.PathLike, schema: Any = None) -> Any:
    """Parse the JSON file `path` and check it against `schema`; every problem (missing,
    unreadable, not UTF-8, not JSON, a wrong field) is a one-line UserError naming the file."""
    p = Path(path)
    try:
        with reading(p, "a JSON file"):
            data = json.loads(p.read_text(encoding="utf-8"))
    except UnicodeDecodeError as e:
        raise UserError(f"{p}: not UTF-8 text (byte {e.start})") from None
    except json.JSONDecodeError as e:
        raise UserError(f"{p}:{e.lineno}: not valid JSON ({e.msg})") from None
    except RecursionError:
        raise UserError(f"{p}: JSON nested too deeply") from None
    if schema is not None:
        check_schema(data, schema, str(p))
    return data
