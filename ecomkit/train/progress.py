"""A progress bar on rank 0 only: a widget in Jupyter, a tqdm bar in a terminal,
and periodic plain lines when output is piped (e.g. a notebook cell that
streams a torchrun subprocess), since ``\\r`` updates never reach a pipe reader."""

from __future__ import annotations

import sys
from typing import Any

from tqdm import tqdm

from ecomkit.launch import in_notebook   # one test for "inside a Jupyter kernel", shared with the launcher


class LineProgress:
    """tqdm-compatible minimal bar that prints ~10 lines per run."""

    def __init__(self, total: int, desc: str = ""):
        self.total, self.desc, self.n = total, desc, 0
        self.every = max(1, total // 10)
        self.postfix: dict[str, Any] = {}

    def update(self, n: int = 1) -> None:
        self.n += n
        if n == 0:   # the loop's update(step) at start: nothing happened yet (a line would read "train 0/60 ")
            return
        if self.n % self.every == 0 or self.n == self.total:
            post = " ".join(f"{k}={v}" for k, v in self.postfix.items())
            print(f"{self.desc} {self.n}/{self.total} {post}", flush=True)

    def set_postfix(self, **kw: Any) -> None:
        self.postfix = kw

    def close(self) -> None:
        pass


class NoProgress(LineProgress):
    def update(self, n: int = 1) -> None:
        self.n += n


def make_progress(total: int, enabled: bool, desc: str = "train"):
    if not enabled:
        return NoProgress(total, desc)
    if in_notebook():
        from tqdm.notebook import tqdm as notebook_tqdm  # lazy: needs ipywidgets, only present in notebooks

        return notebook_tqdm(total=total, desc=desc)
    if sys.stderr.isatty():
        return tqdm(total=total, desc=desc, dynamic_ncols=True)
    return LineProgress(total, desc)
