"""What a run shows: one JSON line per step or eval, a final ``summary.json``, the progress bar, the printed summary.

Rank 0 writes values measured in this run, each line flushed, so a crash loses nothing and a live run can be plotted.
"""

from __future__ import annotations

import json
import math
import os
import resource
import sys
import time
from pathlib import Path
from typing import Any, Sequence

import numpy as np
import torch
from tqdm import tqdm

from ecomkit import find
from ecomkit.config import parse_report_to
from ecomkit.dist import DistEnv, all_reduce_max

# Loaded by name, only on their path: the --report-to dashboards (TensorBoard, W&B, MLflow), and the lines of
# task scores (a summary with accuracy or generation figures).
REPORTING = "ecomkit.reporting"
TASK_SUMMARY = "ecomkit.task_summary"
SCORE_PREFIXES = ("acc_", "gen_")


def peak_memory(device: torch.device) -> tuple[int, str]:
    """(bytes, kind): CUDA ``max_memory_allocated`` on GPU, peak RSS of this process on CPU."""
    if device.type == "cuda":
        return int(torch.cuda.max_memory_allocated(device)), "cuda_max_allocated"
    return int(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss) * 1024, "cpu_peak_rss"


class MetricsWriter:
    """Append rows to ``metrics.jsonl``; ``finish`` writes ``summary.json`` atomically."""

    def __init__(self, output_dir: str | os.PathLike, enabled: bool, filename: str = "metrics.jsonl",
                 append: bool = False, report_to: str = "none", hparams: dict[str, Any] | None = None):
        self.dir = Path(output_dir)
        self.enabled = enabled
        self.path = self.dir / filename
        self._fh = None
        self.sinks: list[Any] = []  # --report-to: each row also goes, as the same dict, to these
        if enabled:
            self.dir.mkdir(parents=True, exist_ok=True)
            self._fh = open(self.path, "a" if append else "w", encoding="utf-8")
            if parse_report_to(report_to):
                self.sinks = find(f"{REPORTING}:open_sinks")(report_to, self.dir, hparams)

    def write(self, row: dict[str, Any]) -> None:
        if self._fh is None:
            return
        row = {"time": round(time.time(), 3), **row}
        self._fh.write(json.dumps(row, ensure_ascii=False) + "\n")
        self._fh.flush()
        for sink in self.sinks:
            sink.log(row)

    def finish(self, summary: dict[str, Any]) -> None:
        if not self.enabled:
            return
        tmp = self.dir / "summary.json.tmp"
        tmp.write_text(json.dumps(summary, indent=2, ensure_ascii=False))
        os.replace(tmp, self.dir / "summary.json")
        self.close()

    def close(self) -> None:
        if self._fh is not None:
            self._fh.close()
            self._fh = None
        for sink in self.sinks:
            sink.close()
        self.sinks = []


def in_notebook() -> bool:
    """True inside a Jupyter kernel (where a display can be updated in place), False in a terminal or script."""
    try:
        from IPython import get_ipython  # lazy: optional (notebooks extra); absent in plain script installs

        shell = get_ipython()
        return shell is not None and shell.__class__.__name__ == "ZMQInteractiveShell"
    except ImportError:
        return False


class LineProgress:
    """tqdm-compatible bar for piped output, about 10 lines a run: a notebook streaming torchrun never sees ``\\r``."""

    def __init__(self, total: int, desc: str = "", eta: bool = False):
        self.total, self.desc, self.n = total, desc, 0
        self.every = max(1, total // 10)
        self.postfix: dict[str, Any] = {}
        self.eta, self.start, self.printed = eta, time.monotonic(), 0

    def update(self, n: int = 1) -> None:
        self.n += n
        if n == 0:
            return
        if self.n // self.every > self.printed or self.n >= self.total:
            self.printed = self.n // self.every
            post = " ".join(f"{k}={v}" for k, v in self.postfix.items())
            text = f"{self.desc} {self.n}/{self.total} {post}"
            print(text.rstrip() + self.timing() if self.eta else text, flush=True)

    def timing(self) -> str:
        """`` [12 s, ETA 1 min 40 s]``: elapsed, and the rest at the mean rate so far."""
        elapsed = time.monotonic() - self.start
        left = elapsed * max(self.total - self.n, 0) / self.n if self.n else float("nan")
        return f" [{format_seconds(elapsed)}, ETA {format_seconds(left)}]"

    def set_postfix(self, **kw: Any) -> None:
        self.postfix = kw

    def refresh(self) -> None:
        self.every = max(1, self.total // 10)

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
    """A bar of ``total`` units on this rank (``enabled``); ``eta``: piped lines say elapsed time and ETA too."""
    if not enabled:
        return NoProgress(total, desc)
    if in_notebook():
        from tqdm.notebook import tqdm as notebook_tqdm  # lazy: needs ipywidgets, only present in notebooks

        return notebook_tqdm(total=total, desc=desc)
    if sys.stderr.isatty():
        return tqdm(total=total, desc=desc, dynamic_ncols=True)
    return LineProgress(total, desc, eta)


def attention_length(tokens: float, squared_lengths: float) -> float:
    """The attention FLOPs term's length: ΣL²/ΣL over real rows (a batch does Σ L·(6Ψ + 12·n_layer·h·L))."""
    return squared_lengths / tokens if tokens > 0 else 0.0


def fill_rate_of(train_rows: Sequence[dict[str, Any]]) -> float | None:
    """Real tokens over the positions computed (``padded_tokens``), summed over the run's training rows."""
    positions = sum(r.get("padded_tokens", 0) for r in train_rows)
    return sum(r.get("tokens", 0) for r in train_rows) / positions if positions else None


def format_bytes(n: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(n) < 1024 or unit == "TiB":
            return f"{n:.1f} {unit}" if unit != "B" else f"{int(n)} B"
        n /= 1024


def print_run_summary(summary: dict[str, Any]) -> None:
    if int(os.environ.get("RANK", 0)) != 0:
        return
    print(
        "\n=== run summary ===\n"
        f"strategy        {summary['strategy']} × {summary['world_size']} process(es), global batch {summary['global_batch']}\n"
        + model_lines(summary)
        + data_line(summary)
        + f"loss            {summary['first_loss']:.4f} → {summary['final_loss']:.4f} (train), eval "
          f"{summary['eval_loss']:.4f}{examples_note(summary)}\n"
        + task_lines(summary)
        + not_learned_line(summary)
        + throughput_lines(summary)
        + f"peak memory     {format_bytes(summary['peak_mem_bytes'])} per rank\n"
        + (summary.get("final_checkpoint") or {}).get("line", "")
        + f"outputs         {summary['output_dir']} (metrics.jsonl, summary.json"
        + (f", model in {summary['model_dir']}" if summary.get("model_dir") else "") + ")\n",
        flush=True,
    )


def model_lines(summary: dict[str, Any]) -> str:
    """Which model trained (a preset's random init, or real weights) and, with LoRA, what of it trained."""
    origin = summary.get("model_origin")
    if not origin:
        return ""
    line = f"model           {summary['model']}: {summary['params']:,} parameters, {origin['text']}\n"
    lora = summary.get("lora")
    if lora:
        share = lora["trainable_params"] / lora["params"] if lora["params"] else float("nan")
        base = "" if lora["base_bits"] >= 16 else f"; frozen base in {lora['base_bits']} bits"
        line += (f"LoRA            on: r={lora['r']}, alpha {lora['alpha']:g}, targets {', '.join(lora['targets'])}"
                 f"{base}; {lora['trainable_params']:,} of {lora['params']:,} parameters train ({share:.2%})\n")
    return line


def examples_note(summary: dict[str, Any]) -> str:
    """`` (N held-out examples)``: what the eval loss rests on, when the evaluation counted it."""
    n = summary.get("eval_loss_examples")
    return f" ({n:,} held-out examples)" if n is not None else ""


def task_lines(summary: dict[str, Any]) -> str:
    """The task scores' lines (``task_summary``), its module loaded only when the summary holds scores."""
    if not any(k.startswith(SCORE_PREFIXES) for k in summary):
        return ""
    return find(f"{TASK_SUMMARY}:task_lines")(summary)


def not_learned_line(summary: dict[str, Any]) -> str:
    """The one line of a run whose model does not clear a baseline: what missed, the likely reason, the retry."""
    verdict = summary.get("baseline") or {}
    return verdict["line"] + "\n" if verdict.get("cleared") is False else ""


def data_line(summary: dict[str, Any]) -> str:
    """What the run trained on: records used of those read, and the examples built per kind (when known)."""
    data = summary.get("data")
    if not data:
        return ""
    kinds = ", ".join(f"{k} {n:,}" for k, n in data.get("examples_per_kind", {}).items())
    eval_file = data.get("eval_rows_read") is not None
    used = data["train_records"] if eval_file else data["records_used"]
    cap = f", capped by max_rows={data['max_rows']:,}" if data.get("max_rows") and used < data["rows_valid"] else ""
    if eval_file:
        read = (f"{used:,} of {data['rows_read']:,} training rows used{cap}, "
                f"{data['eval_records']:,} of {data['eval_rows_read']:,} eval-file rows")
    else:
        read = (f"{data['records_used']:,} of {data['rows_read']:,} rows used{cap} "
                f"({data['train_records']:,} train / {data['eval_records']:,} eval)")
    return f"data            {read}; examples: {kinds}\n" + lengths_line(data)


def lengths_line(data: dict[str, Any]) -> str:
    """seq_len, the longest row per split, and what fitting the rows to seq_len cut (rows, tokens, windows)."""
    if not data.get("seq_len") or not data.get("lengths"):
        return ""
    parts = []
    for split, stats in data["lengths"].items():
        cut = data.get("cuts", {}).get(split, {})
        text = f"{split} longest {stats['row']['max']}"
        if cut.get("rows_cut"):
            text += f", {cut['rows_cut']:,} rows cut ({cut['tokens_dropped']:,} tokens dropped)"
        if cut.get("documents_windowed"):
            text += f", {cut['documents_windowed']:,} documents in windows"
        parts.append(text)
    return f"lengths         seq_len {data['seq_len']}: " + "; ".join(parts) + "\n"


def throughput_lines(summary: dict[str, Any]) -> str:
    """The summary's throughput as printed: totals over the steady phase, then the step-time spread."""
    steps, wall = summary.get("steady_steps"), summary.get("steady_wall_s")
    basis = ""
    if steps and wall:
        who = f", slowest of {summary['world_size']} ranks" if summary.get("slowest_rank_steady_s") is not None else ""
        basis = f" (totals over {steps} steady steps / {wall:.2f} s{who})"
    fill = (f", fill {summary['fill_rate']:.1%} of positions ({'packed' if summary.get('packing') else 'padded'})"
            if summary.get("fill_rate") is not None else "")
    line = (f"throughput      {summary['samples_per_s']:.1f} samples/s, {summary['tokens_per_s']:,.0f} real tokens/s"
            f"{fill}{basis}\n")
    if summary.get("step_time_median_s") is not None:
        line += (f"step time       {summary['step_time_s'] * 1000:.0f} ms mean, "
                 f"{summary['step_time_median_s'] * 1000:.0f} ms median, "
                 f"{summary['step_time_p90_s'] * 1000:.0f} ms p90\n")
    else:
        line += f"step time       {summary['step_time_s'] * 1000:.0f} ms mean\n"
    return line + flops_line(summary)


def flops_line(summary: dict[str, Any]) -> str:
    """Model FLOP/s, and MFU where the device has a table peak (a GPU the hardware table knows)."""
    flops = summary.get("model_flops_per_s")
    if not flops:
        return ""
    mfu = summary.get("mfu")
    share = (f" = {mfu:.1%} MFU ({summary['peak_flops'] / 1e12:,.0f} TFLOP/s per device, hardware table)"
             if mfu is not None else f" ({summary['mfu_note']})" if summary.get("mfu_note") else "")
    return f"model FLOP/s    {flops / 1e9:,.1f} GFLOP/s{share}\n"


def step_model_flops(tokens: float, squared_lengths: float, predicted: float, flops_per_token_at,
                     head_flops: float) -> float:
    """One step's model FLOPs: every real token through the blocks, the LM head (6Vh) only where the loss reads it.
    ``flops_per_token_at(T)``: 6Ψ + attention at length T; ``predicted``: positions the loss reads."""
    return tokens * flops_per_token_at(attention_length(tokens, squared_lengths)) - max(
        tokens - predicted, 0.0) * head_flops


def throughput_summary(train_rows: list[dict[str, Any]], warmup_steps: int = 1,
                       slowest_rank_steady_s: float | None = None) -> dict[str, Any]:
    """Steady-phase throughput after ``warmup_steps`` rows: totals over wall time (the slowest rank's, when given)."""
    steady = train_rows[warmup_steps:] if len(train_rows) > warmup_steps else list(train_rows)
    times = [float(r["step_time_s"]) for r in steady]
    own_total = sum(times)
    total = max(own_total, slowest_rank_steady_s) if slowest_rank_steady_s is not None else own_total
    samples = sum(int(r["samples"]) for r in steady)
    tokens = sum(int(r["tokens"]) for r in steady)
    padded = sum(int(r.get("padded_tokens", 0)) for r in steady)
    median, p90 = (float(v) for v in np.percentile(times, [50, 90])) if times else (float("nan"),) * 2
    return {
        "steady_steps": len(steady),
        "steady_wall_s": total,
        "samples_per_s": samples / total if total > 0 else float("nan"),
        "tokens_per_s": tokens / total if total > 0 else float("nan"),
        "step_time_s": total / len(steady) if steady else float("nan"),
        "step_time_median_s": median,
        "step_time_p90_s": p90,
        "slowest_rank_steady_s": slowest_rank_steady_s,
        "padding_rate": 1 - tokens / padded if padded and all("padded_tokens" in r for r in steady) else None,
    }


def time_split(train_rows: list[dict[str, Any]], warmup_steps: int = 1,
               parts: tuple[str, ...] = ("data_s", "fwd_bwd_s", "optim_s")) -> dict[str, float]:
    """Where the steady phase's wall time went: each part's share of the summed step times, plus ``other``."""
    steady = train_rows[warmup_steps:] if len(train_rows) > warmup_steps else list(train_rows)
    total = sum(float(r["step_time_s"]) for r in steady)
    if total <= 0:
        return {}
    out = {p.removesuffix("_s"): sum(float(r.get(p) or 0.0) for r in steady) / total for p in parts}
    out["other"] = 1.0 - sum(out.values())
    return out


def slowest_rank_throughput(own_rows: list[dict[str, Any]], env: DistEnv, warmup_steps: int = 1,
                            rows: list[dict[str, Any]] | None = None) -> dict[str, Any]:
    """:func:`throughput_summary` of ``rows`` (default: ``own_rows``) at the slowest rank's pace (a collective).
    ``rows`` may be every rank's counts; the pace still comes from each rank's own step times."""
    own_wall = throughput_summary(own_rows, warmup_steps)["steady_wall_s"]
    slowest = all_reduce_max(own_wall, env) if env.distributed else None
    return throughput_summary(own_rows if rows is None else rows, warmup_steps, slowest)

