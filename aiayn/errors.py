"""User-facing errors.

A `UserError` is a problem with what the user asked for or gave us (a missing file, a bad config
value, a checkpoint of the wrong architecture) or with the machine it runs on (a full disk, a
read-only directory). The CLI prints its message as one line and exits non-zero, without a
traceback; anything else is a bug and keeps its traceback.
"""

from __future__ import annotations

import os


class UserError(Exception):
    """An error the user can fix; the message says what and where, in one line."""


class OutputError(UserError):
    """Writing `path` failed for a reason outside the program (disk full, no permission): the
    message names the path, the system's reason, the remedy and what to do after it."""

    def __init__(self, path: str | os.PathLike, reason: str, remedy: str,
                 then: str = "run the command again"):
        self.path, self.reason, self.remedy, self.then = str(path), reason, remedy, then
        super().__init__(f"cannot write {self.path}: {reason}; {remedy}, then {then}")
