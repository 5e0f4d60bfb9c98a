"""Execute the chapters top to bottom and commit them with their outputs: ``make notebooks`` (or one: ``NB=03``).

Why: a reader on a repository page sees every number and figure without running anything. Each executed code
cell records the hash of the source that produced its outputs, so ``tests/test_notebook_outputs.py`` fails when
a cell's code changed after the notebook ran; machine paths are replaced by neutral names.
"""

from __future__ import annotations

import argparse
import getpass
import hashlib
import os
import re
import socket
import sys
import tempfile
import time
from pathlib import Path

import nbformat
from nbclient import NotebookClient

NOTEBOOKS = Path(__file__).resolve().parent
REPO = NOTEBOOKS.parent
MAX_BYTES = 2_000_000          # a committed notebook stays readable on a repository page
HASH_KEY = "ecomkit"           # cell metadata: {"ecomkit": {"source_sha256": ...}}
CELL_TIMEOUT_S = 1800


def source_hash(source: str) -> str:
    """The hash a cell's outputs are stamped with: its source, exactly as committed."""
    return hashlib.sha256(source.encode("utf-8")).hexdigest()


def stamp(nb: nbformat.NotebookNode) -> None:
    """Record in each executed code cell the hash of the source that produced its outputs."""
    for cell in nb.cells:
        if cell.cell_type == "code":
            cell.metadata[HASH_KEY] = {"source_sha256": source_hash(cell.source)}
            cell.metadata.pop("execution", None)


def scrubbers(tmp: Path) -> list[tuple[re.Pattern, str]]:
    """Machine-specific strings and their neutral replacements, longest first."""
    pairs = [(str(REPO) + os.sep, ""), (str(REPO), "."), (str(tmp), "<tmp>"), (tempfile.gettempdir(), "<tmp>"),
             (str(Path.home()), "~"), (socket.gethostname(), "<host>"), (sys.prefix, ".venv"),
             (os.path.realpath(sys.prefix), ".venv")]   # the environment, wherever it lives, reads as the usual .venv
    user = getpass.getuser()
    rules = [(re.compile(re.escape(a)), b) for a, b in sorted(pairs, key=lambda p: -len(p[0])) if len(a) > 1]
    if len(user) > 2:
        rules.append((re.compile(rf"\b{re.escape(user)}\b(?=[@/:])"), "<user>"))
    return rules


def scrub(nb: nbformat.NotebookNode, rules: list[tuple[re.Pattern, str]]) -> None:
    """Replace machine paths, the host and the user name in every text output."""
    def clean(text):
        if isinstance(text, list):
            text = "".join(text)
        for rx, repl in rules:
            text = rx.sub(repl, text)
        return text

    for cell in nb.cells:
        for out in cell.get("outputs", []):
            if "text" in out:
                out["text"] = clean(out["text"])
            for key, value in out.get("data", {}).items():
                if key.startswith("text/") or key == "application/json":
                    out["data"][key] = clean(value) if isinstance(value, (str, list)) else value
            if out.get("output_type") == "error":
                out["traceback"] = [clean(line) for line in out["traceback"]]


def execute(path: Path) -> tuple[int, float]:
    """Run one notebook from the notebooks folder as a learner would; write it back stamped and scrubbed."""
    nb = nbformat.read(path, as_version=4)
    with tempfile.TemporaryDirectory(prefix="ecomkit-nb-") as tmp:
        env_tmp = Path(tmp)
        os.environ.update(TMPDIR=tmp, IPYTHONDIR=str(env_tmp / "ipython"), OMP_NUM_THREADS="1",
                          HF_HUB_OFFLINE="1", MPLBACKEND="module://matplotlib_inline.backend_inline")
        os.environ.setdefault("ECOMKIT_CACHE", str(REPO / ".cache" / "ecomkit"))
        start = time.perf_counter()
        NotebookClient(nb, timeout=CELL_TIMEOUT_S, kernel_name="python3", record_timing=False,
                       resources={"metadata": {"path": str(NOTEBOOKS)}}).execute()
        seconds = time.perf_counter() - start
        stamp(nb)
        scrub(nb, scrubbers(env_tmp))
    nbformat.write(nb, path)
    size = path.stat().st_size
    if size > MAX_BYTES:
        raise SystemExit(f"{path.name}: {size:,} bytes with outputs, over the {MAX_BYTES:,}-byte limit; "
                         "show fewer or smaller outputs (figure dpi, printed logs)")
    return size, seconds


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("names", nargs="*", help="chapter numbers or file names (default: every chapter)")
    args = parser.parse_args(argv)
    paths = sorted(NOTEBOOKS.glob("*.ipynb"))
    if args.names:
        paths = [p for p in paths if any(p.name.startswith(n) or p.name == n for n in args.names)]
        if not paths:
            parser.error(f"no notebook matches {args.names} in {NOTEBOOKS.name}/")
    for path in paths:
        print(f"executing {path.name} ...", flush=True)
        size, seconds = execute(path)
        print(f"  {path.name}: {seconds:.0f} s, {size / 1e6:.2f} MB", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
