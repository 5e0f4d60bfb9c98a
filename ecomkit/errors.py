"""User-facing errors: one clear paragraph, once, last on the screen, instead of a traceback wall.

Bad input raises :class:`EcomkitError`; scripts wrap ``main`` in :func:`exit_on_user_error`. Rank 0 reports it (into
torchrun's error file, printed last as "Root Cause"), the others wait :data:`PEER_GRACE_S` to be stopped.
"""

from __future__ import annotations

import difflib
import functools
import json
import os
import signal
import sys
import time
from pathlib import Path
from typing import Callable, Iterable, NoReturn, TypeVar

T = TypeVar("T")

USER_ERROR_EXIT = 2        # a user error; 1 is a crash (a bug), 13 injected faults, 75 preemption
PEER_GRACE_S = 5.0         # how long a rank other than 0 waits for rank 0 to report the same error
USER_ERROR_KEY = "ecomkit_user_error"   # marks the error file of a user error (read back by the launcher)


class EcomkitError(Exception):
    """Base class for errors caused by user input; the message says what to do."""

    # False for another rank's consequence (a peer gone): printed, not filed, so "Root Cause" is the first failure.
    root_cause = True


class ConfigError(EcomkitError, ValueError):
    """An invalid configuration value (raised before any process group exists)."""


class DataError(EcomkitError):
    """Unreadable, missing or malformed training data."""


class ModelNotFoundError(EcomkitError):
    """A model name that is neither a preset, a local directory nor a reachable hub id."""


def did_you_mean(word: str, names: Iterable[str], cutoff: float = 0.6) -> str:
    """The hint " Did you mean 'x'?" (up to three names) for a mistyped ``word``; "" when no name is close."""
    close = difflib.get_close_matches(str(word), [str(n) for n in dict.fromkeys(names)], n=3, cutoff=cutoff)
    return f" Did you mean {' or '.join(repr(c) for c in close)}?" if close else ""


def error_file_record(message: str) -> dict:
    """The JSON torchrun's agent reads from a worker's error file: our message where it shows a traceback."""
    return {"message": {"message": f"{USER_ERROR_KEY}: {message}",
                        "extraInfo": {"py_callstack": message, USER_ERROR_KEY: message,
                                      "timestamp": str(int(time.time()))}}}


def _deliver(text: str, root_cause: bool = True) -> None:
    """Into torchrun's error file when there is one (shown last, in its report), else to stderr."""
    path = os.environ.get("TORCHELASTIC_ERROR_FILE") if root_cause else None
    if path:
        try:
            Path(path).write_text(json.dumps(error_file_record(text)), encoding="utf-8")
            return
        except OSError:
            pass   # an unwritable file: print instead, the message must not be lost
    print(f"\n{text}\n", file=sys.stderr, flush=True)


def report_user_error(exc: BaseException) -> NoReturn:
    """Report ``exc`` once for the whole job (module docstring) and exit with :data:`USER_ERROR_EXIT`."""
    rank, world = int(os.environ.get("RANK", "0") or 0), int(os.environ.get("WORLD_SIZE", "1") or 1)
    text = f"error: {exc}"
    if world > 1 and rank != 0:
        # rank 0 met the same input and the launcher stops this rank during the wait; SIGTERM's default is restored,
        # or a preemption handler would swallow it.
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
        time.sleep(PEER_GRACE_S)
        text = f"[rank {rank}] {text}"
    _deliver(text, getattr(exc, "root_cause", True))
    sys.exit(USER_ERROR_EXIT)


def exit_on_user_error(main: Callable[..., T]) -> Callable[..., T]:
    """Decorate a script's ``main``: a user error is reported once, exit 2 (``ECOMKIT_TRACEBACK=1``: its traceback)."""

    @functools.wraps(main)
    def wrapper(*args, **kwargs):
        try:
            return main(*args, **kwargs)
        except EcomkitError as exc:
            if os.environ.get("ECOMKIT_TRACEBACK") == "1":
                raise
            report_user_error(exc)

    return wrapper
