"""Rows in bounded memory: generate and tokenize N synthetic rows through ecomkit's Arrow path; the list path beside.

What it measures, each variant in a fresh process (its own peak RSS):

- ``arrow``: ``build_datasets("synthetic", n_rows=N, task="lm")`` as the training
  loop calls it (catalog generated in chunks into a memory-mapped Arrow table,
  a stratified split, tokenisation as a batched ``datasets.map`` written to
  disk), then the sampler's lengths array and its epoch plan. Default 10 M rows.
- ``list``: the list path ecomkit used before: ``generate_catalog`` as one list of
  dicts, tokenised from that list in memory. Default 1 M rows (the catalog
  generator's own limit for one list).

Reported per variant: wall time, rows/s, the peak resident set (``ru_maxrss``)
and the peak *anonymous* resident memory (sampled from ``/proc/self/status``
every 0.2 s). The difference is file-backed pages: the shared libraries, and
the pages of the memory-mapped tables that the process touched. The Arrow
path reads its tables batch by batch with plain reads
(:mod:`ecomkit.data.stream`), so only opening a table maps a few of its pages;
the goal (≤ 3 GB) is checked on both figures. The cache is a fresh
temporary folder, so nothing is reused from an earlier run. rows/s depends on
the load of the machine (the artifact records the load average).

    python benchmarks/bench_rows.py                      # 10 M rows (Arrow) and 1 M rows (list)
    python benchmarks/bench_rows.py --rows 200000 --list-rows 100000
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

from common import REPO, bench_env, print_table, verdict, write_artifact

GOAL_BYTES = 3 * 1024**3
GIB = 1024**3


class AnonPeak:
    """Samples RssAnon of this process (and its children's peak via ru_maxrss at the end) in a thread."""

    def __init__(self, interval: float = 0.2):
        self.peak, self.interval, self._stop = 0, interval, threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self._stop.is_set():
            for line in Path("/proc/self/status").read_text().splitlines():
                if line.startswith("RssAnon:"):
                    self.peak = max(self.peak, int(line.split()[1]) * 1024)
            self._stop.wait(self.interval)

    def __enter__(self) -> "AnonPeak":
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join()


def run_variant(mode: str, rows: int, max_length: int, num_proc: int) -> dict:
    """Inside the child process: run one variant and return its numbers."""
    import datasets

    from ecomkit.data import DistributedBatchSampler, build_datasets, generate_catalog, lengths_array, tokenize_records
    from ecomkit.models.tokenizer import get_tokenizer

    datasets.disable_progress_bars()
    tok = get_tokenizer("local", Path(os.environ["ECOMKIT_TOKENIZER_CACHE"]))
    with AnonPeak() as anon:
        start = time.perf_counter()
        if mode == "arrow":
            train, held_out, *_ = build_datasets("synthetic", n_rows=rows, seed=0, task="lm", tokenizer=tok,
                                                 max_length=max_length, num_proc=num_proc)
            lengths, examples = lengths_array(train), len(train) + len(held_out)
        else:
            records = generate_catalog(rows, seed=0)
            train = tokenize_records(records, tok, "lm", max_length, num_proc=num_proc)
            lengths, examples = train["length"], len(train)
        sampler = DistributedBatchSampler(lengths, micro_batch_size=8, grad_accum=1, num_replicas=2, rank=0, seed=0)
        next(iter(sampler))   # plans the epoch, as the training loop's first step does
        n_batches = sampler.steps_per_epoch
        wall = time.perf_counter() - start
    own = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    children = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss * 1024
    return {"variant": mode, "rows": rows, "examples": examples, "global_batches": n_batches, "wall_s": wall,
            "rows_per_s": rows / wall, "peak_rss_gib": max(own, children) / GIB, "peak_anon_gib": anon.peak / GIB,
            "num_proc": num_proc}


def measure(mode: str, rows: int, args) -> dict:
    """Run one variant in a fresh process with an empty data cache; return its row."""
    cache = Path(tempfile.mkdtemp(prefix="ecomkit-bench-rows-"))
    env = {**bench_env(), "ECOMKIT_CACHE": str(cache), "TOKENIZERS_PARALLELISM": "false",
           "ECOMKIT_TOKENIZER_CACHE": bench_env()["ECOMKIT_CACHE"]}
    cmd = [sys.executable, __file__, "--child", mode, "--rows", str(rows), "--max-length", str(args.max_length),
           "--num-proc", str(args.num_proc)]
    try:
        proc = subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True)
    finally:
        shutil.rmtree(cache, ignore_errors=True)
    if proc.returncode != 0:
        raise SystemExit(f"{mode} run failed:\n{proc.stdout[-2000:]}\n{proc.stderr[-4000:]}")
    row = json.loads(proc.stdout.strip().splitlines()[-1])
    print(f"{mode:5s} {rows:>11,} rows: {row['wall_s']:.0f} s, {row['rows_per_s']:,.0f} rows/s, peak RSS "
          f"{row['peak_rss_gib']:.2f} GiB (anonymous {row['peak_anon_gib']:.2f} GiB)", flush=True)
    return row


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=10_000_000, help="rows for the Arrow path")
    parser.add_argument("--list-rows", type=int, default=1_000_000, help="rows for the list path (<= 1,000,000)")
    parser.add_argument("--max-length", type=int, default=128)
    parser.add_argument("--num-proc", type=int, default=1)
    parser.add_argument("--results-dir", default=None, help="where the artifact goes (default benchmarks/results)")
    parser.add_argument("--child", choices=("arrow", "list"), default=None, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        print(json.dumps(run_variant(args.child, args.rows, args.max_length, args.num_proc)))
        return
    print(f"load average before: {os.getloadavg()[0]:.2f} on {os.cpu_count()} cores (rows/s depends on it)")
    rows = [measure("list", args.list_rows, args), measure("arrow", args.list_rows, args)]
    if args.rows != args.list_rows:
        rows.append(measure("arrow", args.rows, args))
    print_table(rows, ["variant", "rows", "wall_s", "rows_per_s", "peak_rss_gib", "peak_anon_gib"])
    big = rows[-1]
    notes = [verdict(f"peak RSS of the Arrow path at {big['rows']:,} rows (GiB)", big["peak_rss_gib"], "<= 2.79 GiB = 3 GB",
                     big["peak_rss_gib"] * GIB <= GOAL_BYTES),
             verdict(f"peak anonymous memory of the Arrow path at {big['rows']:,} rows (GiB)", big["peak_anon_gib"],
                     "<= 2.79 GiB = 3 GB", big["peak_anon_gib"] * GIB <= GOAL_BYTES)]
    same = rows[1]
    notes.append(f"At {same['rows']:,} rows the Arrow path peaks at {same['peak_rss_gib']:.2f} GiB "
                 f"({same['peak_anon_gib']:.2f} GiB anonymous) against {rows[0]['peak_rss_gib']:.2f} GiB for the list path; "
                 f"rows/s {same['rows_per_s']:,.0f} vs {rows[0]['rows_per_s']:,.0f} (one tokenising process each; "
                 f"rows/s depends on the machine's load, see the load average above).")
    print(notes[-1])
    write_artifact("bench_rows", rows, extra={
        "settings": {k: v for k, v in vars(args).items() if k not in ("child", "results_dir")},
        "columns": ["variant", "rows", "examples", "wall_s", "rows_per_s", "peak_rss_gib", "peak_anon_gib"],
        "headers": ["path", "rows", "examples", "wall (s)", "rows/s", "peak RSS (GiB)", "peak anonymous (GiB)"],
        "notes": notes}, results_dir=args.results_dir)


if __name__ == "__main__":
    main()
