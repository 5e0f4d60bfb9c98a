"""Run chapter scripts from a notebook: under torchrun or as one plain process.

A failing ``!torchrun`` does not fail its cell; :func:`run_torchrun` streams output live and raises
:class:`~ecomkit.errors.EcomkitError` with the output's tail when the job fails.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections import deque
from pathlib import Path
from typing import Any, Callable, Mapping, Sequence

from ecomkit.errors import USER_ERROR_KEY, DataError, EcomkitError
from ecomkit.metrics import in_notebook

TAIL_LINES = 40


def repo_root(start: str | Path | None = None) -> Path:
    """The repository root: the nearest folder at or above ``start`` (default: cwd) with pyproject.toml."""
    here = Path(start or Path.cwd()).resolve()
    for folder in (here, *here.parents):
        if (folder / "pyproject.toml").is_file() and (folder / "ecomkit").is_dir():
            return folder
    raise EcomkitError(
        f"could not find the ecomkit repository root above {here}: no folder there has both "
        "pyproject.toml and ecomkit/. Start Jupyter (or Python) inside the repository checkout."
    )


def child_env(env: Mapping[str, str] | None) -> dict[str, str]:
    """os.environ + ``env``; OMP_NUM_THREADS=1 unless given (N processes × all cores oversubscribes)."""
    merged = dict(os.environ)
    merged.update(env or {})
    merged.setdefault("OMP_NUM_THREADS", "1")
    merged["PYTHONUNBUFFERED"] = "1"
    return merged


def _resolve_script(script: str | Path, root: Path) -> Path:
    path = Path(script)
    path = path if path.is_absolute() else root / path
    if not path.is_file():
        raise EcomkitError(f"script {path} does not exist. Pass a path relative to the repository root {root}, "
                           "e.g. 'scripts/01_env_check.py'.")
    return path


PROGRESS_LINE = re.compile(r"^\s*(train|decode|eval)\s+\d+/\d+")   # what the scripts' progress bars print


class ProgressLine:
    """A launch's progress in one line that updates in place, for a notebook cell that does not stream.

    A quiet launch otherwise shows nothing for minutes; outside a notebook it shows nothing.
    """

    def __init__(self, label: str, show: bool | None = None):
        self.label, self.start = label, time.monotonic()
        self.show = in_notebook() if show is None else show
        self.seen: list[str] = []
        self._handle = None

    def __call__(self, line: str) -> None:
        if not PROGRESS_LINE.match(line):
            return
        text = f"{self.label}: {line.strip()}  ({time.monotonic() - self.start:.0f} s)"
        self.seen.append(text)
        if not self.show:
            return
        from IPython.display import display  # lazy: only in a notebook (checked above)

        bundle = {"text/plain": text}
        if self._handle is None:
            self._handle = display(bundle, raw=True, display_id=True)
        else:
            self._handle.update(bundle, raw=True)


def _with_progress(hook: Callable[[str], None] | None, progress: ProgressLine) -> Callable[[str], None]:
    def both(line: str) -> None:
        progress(line)
        if hook is not None:
            hook(line)
    return both


def stream_command(cmd: list[str], *, cwd: Path, env: dict[str, str], timeout: float | None,
                   live: bool, on_line: Callable[[str], None] | None = None,
                   on_start: Callable[[subprocess.Popen], None] | None = None) -> subprocess.CompletedProcess:
    """Run ``cmd``, echo each output line as it arrives, kill the whole process group on timeout.

    ``on_line`` sees every line; ``on_start`` the started process; without ``live`` a notebook sees the progress line.
    """
    if not live:
        on_line = _with_progress(on_line, ProgressLine(next((Path(str(c)).name for c in cmd
                                                             if str(c).endswith(".py")), "run")))
    proc = subprocess.Popen(cmd, cwd=cwd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            text=True, bufsize=1, errors="replace", start_new_session=True)
    timed_out = threading.Event()
    if on_start is not None:
        on_start(proc)

    def kill() -> None:
        timed_out.set()
        try:
            os.killpg(proc.pid, signal.SIGKILL)  # torchrun and its workers share this new session
        except ProcessLookupError:
            pass

    timer = threading.Timer(timeout, kill) if timeout else None
    if timer:
        timer.start()
    lines: list[str] = []
    try:
        assert proc.stdout is not None
        for line in proc.stdout:
            lines.append(line)
            if live:
                print(line, end="", flush=True)
            if on_line is not None:
                on_line(line)
        proc.wait()
    finally:
        if timer:
            timer.cancel()
        if proc.poll() is None:
            kill()
            proc.wait()
    out = "".join(lines)
    if timed_out.is_set():
        raise EcomkitError(f"{' '.join(cmd)} did not finish within {timeout} s and was killed. "
                           f"Last output:\n{_tail(out)}")
    return subprocess.CompletedProcess(cmd, proc.returncode, stdout=out, stderr="")


def _tail(text: str, n: int = TAIL_LINES) -> str:
    return "".join(deque(text.splitlines(keepends=True), maxlen=n)) or "(no output)"


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


def _check(result: subprocess.CompletedProcess, agent_error_file: Path | None = None) -> subprocess.CompletedProcess:
    """``result``, or an EcomkitError: a worker's user error alone when it reported one, else the output's tail."""
    if result.returncode != 0:
        user_error = user_error_from_agent_file(agent_error_file) if agent_error_file else None
        if user_error:
            raise EcomkitError(f"{user_error.removeprefix('error: ')}\n(exit status {result.returncode} of: "
                               f"{' '.join(map(str, result.args))})")
        raise EcomkitError(
            f"command failed with exit status {result.returncode}: {' '.join(map(str, result.args))}\n"
            f"Last {TAIL_LINES} lines of its output:\n{_tail(result.stdout)}"
        )
    return result


def run_torchrun(script: str | Path, args: Sequence[str] = (), nproc: int = 2, *,
                 env: Mapping[str, str] | None = None, timeout: float | None = None,
                 max_restarts: int = 0, live: bool = True) -> subprocess.CompletedProcess:
    """``torchrun --standalone --nproc_per_node N script args`` from the repository root.

    Output of all ranks is printed live and kept in ``result.stdout``. On failure or timeout raises
    :class:`EcomkitError` with the worker's user error if it reported one, else the output's tail.
    """
    root = repo_root()
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", str(nproc),
           "--max_restarts", str(max_restarts), str(_resolve_script(script, root)), *map(str, args)]
    with tempfile.TemporaryDirectory(prefix="ecomkit-launch-") as folder:
        agent_file = Path(folder) / "agent_error.json"
        merged = {**child_env(env), "TORCHELASTIC_ERROR_FILE": str(agent_file)}
        return _check(stream_command(cmd, cwd=root, env=merged, timeout=timeout, live=live), agent_file)


def run_python(script: str | Path, args: Sequence[str] = (), *, env: Mapping[str, str] | None = None,
               timeout: float | None = None, live: bool = True) -> subprocess.CompletedProcess:
    """One plain ``python script args`` process (world size 1), same streaming and errors as run_torchrun."""
    root = repo_root()
    cmd = [sys.executable, str(_resolve_script(script, root)), *map(str, args)]
    return _check(stream_command(cmd, cwd=root, env=child_env(env), timeout=timeout, live=live))


def read_json(path: str | Path) -> Any:
    """Load a JSON file a script wrote; a clear DataError if it is missing or malformed."""
    p = Path(path)
    if not p.is_file():
        raise DataError(f"{p}: no such file. The script that should write it probably failed or was "
                        "given another --json-out/--out path; check its output above.")
    try:
        return json.loads(p.read_text(encoding="utf-8"))
    except json.JSONDecodeError as exc:
        raise DataError(f"{p}, line {exc.lineno}: not valid JSON ({exc.msg}). The file may be truncated "
                        "by a crashed run; run the script again.") from exc


def write_json(data: Any, path: str | Path) -> Path:
    """Write what a script measured, for :func:`read_json` to read back; parent folders are created."""
    p = Path(path)
    p.parent.mkdir(parents=True, exist_ok=True)
    p.write_text(json.dumps(data, indent=2, default=str) + "\n", encoding="utf-8")
    return p


def read_jsonl(path: str | Path) -> list[dict[str, Any]]:
    """Load a JSON-lines metrics file (one object per line; blank lines skipped)."""
    p = Path(path)
    if not p.is_file():
        raise DataError(f"{p}: no such file. The script that should write it probably failed; check its output.")
    rows = []
    with p.open(encoding="utf-8") as fh:
        for lineno, line in enumerate(fh, start=1):
            if not line.strip():
                continue
            try:
                rows.append(json.loads(line))
            except json.JSONDecodeError as exc:
                raise DataError(f"{p}, line {lineno}: not valid JSON ({exc.msg}). A run that was killed "
                                "mid-write leaves a partial last line; delete that line or rerun.") from exc
    return rows
