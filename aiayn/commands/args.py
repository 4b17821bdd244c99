"""Options dataclasses filled from a command's parsed arguments by field name, so that a command
does not copy its options one by one and a new field cannot be silently left out."""

from __future__ import annotations

import argparse
import dataclasses
from typing import Any, Iterable, TypeVar

T = TypeVar("T")


def options_from_args(cls: type[T], args: argparse.Namespace, *, defaults: Iterable[str] = (),
                      **derived: Any) -> T:
    """An instance of the dataclass `cls` with each field taken from `derived` if named there,
    else from the argparse dest of the same name; a dest that is None (an option not given)
    leaves the field's default, whose reasons are written with the dataclass. `defaults` names the
    fields the command leaves at their default (no option sets them). A field none of these
    covers is a TypeError: a field added to `cls` must be given an option, be derived, or be named
    in `defaults`."""
    defaults = set(defaults)
    names = {f.name for f in dataclasses.fields(cls)}
    unknown = sorted((defaults | set(derived)) - names)
    if unknown:
        raise TypeError(f"{cls.__name__} has no field {', '.join(unknown)}")
    kwargs, missing = dict(derived), []
    for name in sorted(names - defaults - set(derived)):
        if not hasattr(args, name):
            missing.append(name)
        elif getattr(args, name) is not None:
            kwargs[name] = getattr(args, name)
    if missing:
        raise TypeError(f"{cls.__name__}: no option sets {', '.join(missing)}; add one, derive it, "
                        f"or name it in defaults=")
    return cls(**kwargs)
