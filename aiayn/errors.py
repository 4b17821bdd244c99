"""User-facing errors.

A `UserError` is a problem with what the user asked for or gave us (a missing file, a bad config
value, a checkpoint of the wrong architecture). The CLI prints its message as one line and exits
non-zero, without a traceback; anything else is a bug and keeps its traceback.
"""


class UserError(Exception):
    """An error the user can fix; the message says what and where, in one line."""
