"""User-facing errors: one clear paragraph instead of a traceback wall.

Every error a user can cause with bad input (a missing file, an unknown
preset, an invalid config value) is raised as an :class:`EcomkitError`.
Scripts wrap ``main`` in :func:`exit_on_user_error`, which prints the message
and exits with status 2, so that torchrun reports the failing rank without
pages of stack frames.
"""

from __future__ import annotations

import functools
import os
import sys
from typing import Callable, TypeVar

T = TypeVar("T")


class EcomkitError(Exception):
    """Base class for errors caused by user input; the message says what to do."""


class ConfigError(EcomkitError, ValueError):
    """An invalid configuration value (raised before any process group exists)."""


class DataError(EcomkitError):
    """Unreadable, missing or malformed training data."""


class ModelNotFoundError(EcomkitError):
    """A model name that is neither a preset, a local directory nor a reachable hub id."""


def exit_on_user_error(main: Callable[..., T]) -> Callable[..., T]:
    """Decorate a script's ``main``: user errors print one paragraph and exit 2.

    Other exceptions keep their traceback, because those are our bugs. Set
    ``ECOMKIT_TRACEBACK=1`` to see the traceback of user errors as well.
    """

    @functools.wraps(main)
    def wrapper(*args, **kwargs):
        try:
            return main(*args, **kwargs)
        except EcomkitError as exc:
            if os.environ.get("ECOMKIT_TRACEBACK") == "1":
                raise
            rank = os.environ.get("RANK")
            where = f"[rank {rank}] " if rank is not None else ""
            print(f"\n{where}error: {exc}\n", file=sys.stderr, flush=True)
            sys.exit(2)

    return wrapper
