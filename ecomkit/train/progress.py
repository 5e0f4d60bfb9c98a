"""A progress bar on rank 0 only: a widget in Jupyter, a tqdm bar in a terminal,
and periodic plain lines when output is piped (e.g. a notebook cell that
streams a torchrun subprocess), since ``\\r`` updates never reach a pipe reader."""

from __future__ import annotations

import math
import sys
import time
from typing import Any

from tqdm import tqdm

from ecomkit.launch import in_notebook   # one test for "inside a Jupyter kernel", shared with the launcher


class LineProgress:
    """tqdm-compatible minimal bar that prints ~10 lines per run (``eta``: each with the elapsed time and an ETA)."""

    def __init__(self, total: int, desc: str = "", eta: bool = False):
        self.total, self.desc, self.n = total, desc, 0
        self.every = max(1, total // 10)
        self.postfix: dict[str, Any] = {}
        self.eta, self.start, self.printed = eta, time.monotonic(), 0

    def update(self, n: int = 1) -> None:
        self.n += n
        if n == 0:   # the loop's update(step) at start: nothing happened yet (a line would read "train 0/60 ")
            return
        if self.n // self.every > self.printed or self.n >= self.total:   # updates of several units cross marks
            self.printed = self.n // self.every
            post = " ".join(f"{k}={v}" for k, v in self.postfix.items())
            text = f"{self.desc} {self.n}/{self.total} {post}"
            print(text.rstrip() + self.timing() if self.eta else text, flush=True)

    def timing(self) -> str:
        """`` [12 s, ETA 1 min 40 s]``: elapsed, and the rest at the mean rate so far (with ``eta``)."""
        if not self.eta:
            return ""
        elapsed = time.monotonic() - self.start
        left = elapsed * max(self.total - self.n, 0) / self.n if self.n else float("nan")
        return f" [{format_seconds(elapsed)}, ETA {format_seconds(left)}]"

    def set_postfix(self, **kw: Any) -> None:
        self.postfix = kw

    def close(self) -> None:
        pass


class NoProgress(LineProgress):
    def update(self, n: int = 1) -> None:
        self.n += n


def format_seconds(s: float) -> str:
    if math.isnan(s):
        return "?"
    return f"{s:.0f} s" if s < 60 else f"{int(s // 60)} min {s % 60:.0f} s"


def make_progress(total: int, enabled: bool, desc: str = "train", eta: bool = False):
    """A bar of ``total`` units on this rank (``enabled``); ``eta``: piped lines say elapsed time and ETA too
    (tqdm's bars always do)."""
    if not enabled:
        return NoProgress(total, desc)
    if in_notebook():
        from tqdm.notebook import tqdm as notebook_tqdm  # lazy: needs ipywidgets, only present in notebooks

        return notebook_tqdm(total=total, desc=desc)
    if sys.stderr.isatty():
        return tqdm(total=total, desc=desc, dynamic_ncols=True)
    return LineProgress(total, desc, eta)
