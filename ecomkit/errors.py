"""User-facing errors: one clear paragraph, once, last on the screen, instead of a traceback wall.

Every error a user can cause with bad input (a missing file, an unknown
preset, an invalid config value, a mistyped flag) is raised as an
:class:`EcomkitError`. Scripts wrap ``main`` in :func:`exit_on_user_error`,
which reports the message and exits with :data:`USER_ERROR_EXIT`.

**Once, from rank 0.** Every rank of a job usually meets the same bad input
(each parses the same flags and reads the same file), and N copies of one
paragraph followed by torchrun's failure report push it off the screen. So
rank 0 reports; any other rank stays silent and waits :data:`PEER_GRACE_S`
for rank 0 to end the job (torchrun then stops it, as it stops every rank
once one has failed). Only an error that rank 0 did not meet gets reported
by the rank that met it, after that wait, under its rank number.

**Last on the screen.** Under ``torchrun`` the agent prints its own report
after every worker has exited, so anything a worker prints ends up above it.
torchrun's agent gives each worker an error file (``TORCHELASTIC_ERROR_FILE``)
and prints the failing rank's file as the last lines of that report ("Root
Cause"). Rank 0 therefore writes its message there instead of printing it:
it appears once, as the last text of the report, with no worker traceback.
The agent's own lines above the report (its ``ChildFailedError`` traceback)
are torch's and cannot be switched off from a worker. Without torchrun (one
plain process, other launchers) the message goes to stderr.
:func:`user_error_from_agent_file` reads it back from the agent's copy of the
file, which is how :func:`ecomkit.launch.run_torchrun` raises the message alone.
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

    # False for an error that is another rank's consequence (a collective whose peer is gone): it is printed,
    # never written into torchrun's error file, so the agent's "Root Cause" stays the rank that failed first.
    root_cause = True


class ConfigError(EcomkitError, ValueError):
    """An invalid configuration value (raised before any process group exists)."""


class DataError(EcomkitError):
    """Unreadable, missing or malformed training data."""


class ModelNotFoundError(EcomkitError):
    """A model name that is neither a preset, a local directory nor a reachable hub id."""


def did_you_mean(word: str, names: Iterable[str], cutoff: float = 0.6) -> str:
    """The hint " Did you mean 'x'?" (up to three names) for a mistyped ``word``; "" when no name is close.

    Why one helper: a misspelled flag, column, label or config key all get the same hint, from difflib.
    """
    close = difflib.get_close_matches(str(word), [str(n) for n in dict.fromkeys(names)], n=3, cutoff=cutoff)
    return f" Did you mean {' or '.join(repr(c) for c in close)}?" if close else ""


def _rank_and_world() -> tuple[int, int]:
    return int(os.environ.get("RANK", "0") or 0), int(os.environ.get("WORLD_SIZE", "1") or 1)


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
    rank, world = _rank_and_world()
    text = f"error: {exc}"
    if world > 1 and rank != 0:
        # rank 0 met the same input: when it exits, the launcher stops this rank during the wait. SIGTERM's
        # default action is restored first, since a preemption handler would otherwise swallow it.
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
        time.sleep(PEER_GRACE_S)
        text = f"[rank {rank}] {text}"
    _deliver(text, getattr(exc, "root_cause", True))
    sys.exit(USER_ERROR_EXIT)


def exit_on_user_error(main: Callable[..., T]) -> Callable[..., T]:
    """Decorate a script's ``main``: a user error is reported once (rank 0) and exits 2.

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
            report_user_error(exc)

    return wrapper


def user_error_from_agent_file(path: str | os.PathLike) -> str | None:
    """The user error a worker reported, from the error file torchrun's agent copied it to; None otherwise."""
    try:
        record = json.loads(Path(path).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    message = record.get("message") if isinstance(record, dict) else None
    extra = message.get("extraInfo", {}) if isinstance(message, dict) else {}
    found = extra.get(USER_ERROR_KEY) if isinstance(extra, dict) else None
    return str(found) if found else None
