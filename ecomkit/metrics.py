"""Run metrics: one JSON line per step or eval, a final ``summary.json``, and the printed summary.

Rank 0 writes; every value was measured in this run. Each line is flushed
immediately so a crash loses nothing and a notebook can plot a run that is
still going.
"""

from __future__ import annotations

import json
import os
import resource
import time
from pathlib import Path
from typing import Any, Sequence

import torch

from ecomkit.dist import DistEnv, all_reduce_max
from ecomkit.reporting import open_sinks


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
        self.sinks: list[Any] = []  # --report-to: each row also goes, as the same dict, to these (ecomkit.reporting)
        if enabled:
            self.dir.mkdir(parents=True, exist_ok=True)
            self._fh = open(self.path, "a" if append else "w", encoding="utf-8")
            self.sinks = open_sinks(report_to, self.dir, hparams)

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

def attention_length(tokens: float, squared_lengths: float) -> float:
    """The sequence length to put in the attention FLOPs term: ΣL²/ΣL over the real (unpadded) sequences.

    Why not ``cfg.seq_len``: a sequence of L real tokens does 12·n_layer·h·L
    attention FLOPs per token, so a batch does Σ L·(6Ψ + 12·n_layer·h·L) =
    tokens × (6Ψ + 12·n_layer·h·ΣL²/ΣL). Counting ``cfg.seq_len`` instead
    credits every short sample with attention over positions it never had,
    which inflates MFU on data shorter than the truncation length. Padded
    positions are not useful work either, so they are not counted.
    """
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
    return f"{n:.1f} TiB"


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
        + classification_lines(summary)
        + generation_lines(summary)
        + methods_line(summary)
        + not_learned_line(summary)
        + throughput_lines(summary)
        + f"peak memory     {format_bytes(summary['peak_mem_bytes'])} per rank\n"
        + (summary.get("final_checkpoint") or {}).get("line", "")
        + f"outputs         {summary['output_dir']} (metrics.jsonl, summary.json"
        + (f", model in {summary['model_dir']}" if summary.get("model_dir") else "") + ")\n",
        flush=True,
    )


def model_lines(summary: dict[str, Any]) -> str:
    """Which model trained (a random-init preset or real weights) and, with LoRA, what of it trained.

    Why in the summary: the numbers above a preset's run are a random init's; a reader must not take
    them for what the real SeqGPT or EcomGPT weights would do.
    """
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


# Which method made each headline figure of an evaluation (figures that disagree must say why). Candidate
# scoring never decodes: it ranks the candidate labels by their mean log-probability after the prompt, so an
# untrained model still picks one of them; generation decodes an answer and scores what it parses, so an answer
# that is no label scores 0. The two can disagree on the same questions; each figure names its method.
CANDIDATE_SCORING = "candidate scoring"
GENERATED_EXACT = "generation, exact match"
GENERATED_SPANS = "generation, span F1"
METHOD_OF_PREFIX = (("acc_", CANDIDATE_SCORING), ("macro_f1_", CANDIDATE_SCORING),
                    ("gen_acc", GENERATED_EXACT), ("gen_macro_f1", GENERATED_EXACT),
                    ("gen_span_", GENERATED_SPANS), ("gen_strict_acc", GENERATED_SPANS))


def methods_line(summary: dict[str, Any]) -> str:
    """One line saying how the two methods differ, when a summary holds figures from both."""
    methods = set((summary.get("eval_methods") or {}).values())
    if CANDIDATE_SCORING not in methods or not methods - {CANDIDATE_SCORING}:
        return ""
    return ("methods         candidate scoring ranks the candidate labels by mean log-probability after the prompt "
            "(no decoding, always one of them); generation decodes an answer and scores the label or spans "
            "parsed from it (an answer that names no label is wrong)\n")


def not_learned_line(summary: dict[str, Any]) -> str:
    """The one line of a run whose model does not clear a baseline: what missed, the likely reason, the retry
    (``summary["baseline"]``, from ``ecomkit.train.outcome.baseline_outcome``)."""
    verdict = summary.get("baseline") or {}
    return verdict["line"] + "\n" if verdict.get("cleared") is False else ""


def classification_lines(summary: dict[str, Any]) -> str:
    """One line per classification target: accuracy, macro-F1, the majority baseline and the margin over it.

    The margin is what a claim "the model learned" rests on: an accuracy is
    only worth its distance from always answering the most frequent label,
    the one the training split holds most often (a baseline never sees the
    labels it is scored on).
    """
    lines = ""
    for key in [k for k in summary if k.startswith("acc_")]:
        target, acc = key[4:], summary[key]
        line = f"eval {target:<11}accuracy {acc:.3f} by {CANDIDATE_SCORING}"
        if summary.get(f"macro_f1_{target}") is not None:
            line += f", macro-F1 {summary[f'macro_f1_{target}']:.3f}"
        if summary.get(f"majority_{target}") is not None:
            base = summary[f"majority_{target}"]
            line += (f"; majority baseline {base:.3f} (training's most frequent label "
                     f"{summary.get(f'majority_label_{target}')!r}), margin {100 * (acc - base):+.1f} points")
        if summary.get(f"scored_{target}"):
            line += f" ({summary[f'scored_{target}']} held-out records)"
        lines += line + "\n"
    return lines


def generation_lines(summary: dict[str, Any]) -> str:
    """Scores by generation (``ecomkit.train.gen_eval``) beside their baselines, with the margin in points.

    A model counts only when it clears its baseline: the training split's
    majority label for classification, the dictionary of training spans for
    extraction (both learned from training data only). Each figure says how
    many examples it rests on, and answers that stopped at the token budget or
    are garbled are counted.
    """
    lines = ""
    if summary.get("gen_acc") is not None:
        line = (f"generated labels accuracy {summary['gen_acc']:.3f} by {GENERATED_EXACT}, "
                f"macro-F1 {summary['gen_macro_f1']:.3f}")
        if summary.get("gen_majority_acc") is not None:
            margin = summary["gen_acc_margin_points"]
            line += (f"; training-majority baseline {summary['gen_majority_acc']:.3f}, margin {margin:+.1f} points "
                     f"({'clears' if margin > 0 else 'does NOT clear'} it")
        else:
            line += " (no baseline: the rows name no training majority"
        lines += line + f"; {summary['gen_classify_n']} examples)\n"
    if summary.get("gen_span_f1") is not None:
        margin = summary["gen_span_f1_margin_points"]
        per = ", ".join(f"{k} {v:.2f}" for k, v in summary.get("gen_span_f1_per_label", {}).items())
        lines += (f"generated spans  micro-F1 {summary['gen_span_f1']:.3f} by {GENERATED_SPANS} "
                  f"(P {summary['gen_span_precision']:.3f}, "
                  f"R {summary['gen_span_recall']:.3f}), strict {summary['gen_strict_acc']:.3f}; dictionary "
                  f"baseline F1 {summary['dict_span_f1']:.3f}, margin {margin:+.1f} points "
                  f"({'clears' if margin > 0 else 'does NOT clear'} it; {summary['gen_extract_n']} examples)\n"
                  + (f"  per label F1   {per}\n" if per else ""))
    if summary.get("gen_decoded"):
        held = summary.get("gen_held_out")
        of = f" of {held}" if held is not None else ""
        lines += (f"decoding         {summary['gen_decoded']}{of} held-out examples, "
                  f"{summary['gen_examples_per_s']:.1f} examples/s ({summary['gen_decode_mode']}), "
                  f"{summary['gen_prompts_cut']} prompts cut to fit, {summary['gen_unknown_labels']} unknown labels "
                  f"in answers, {summary.get('gen_invalid_text', 0)} answers with invalid text (U+FFFD), "
                  f"{summary.get('gen_spans_not_in_input', 0)} predicted spans not in their input, "
                  f"{summary.get('gen_at_budget', 0)} answers stopped at the budget\n")
    if summary.get("gen_budget_advice"):   # a share worth advice, and the lever that follows the cause (gen_eval)
        lines += "budget           " + summary["gen_budget_advice"] + "\n"
    return lines


def print_evaluation(result: dict[str, Any]) -> None:
    """The evaluation of a saved model (``ecomkit.train.eval_run``), on rank 0."""
    if int(os.environ.get("RANK", 0)) != 0:
        return
    print(f"\n=== evaluation of {result['model']} ({result['strategy']} × {result['world_size']}) ===\n"
          f"eval loss       {result['eval_loss']:.4f}{examples_note(result)}\n" + classification_lines(result)
          + generation_lines(result) + methods_line(result),
          flush=True)


def data_line(summary: dict[str, Any]) -> str:
    """What the run trained on: records used of those read, and the examples built per kind (when known)."""
    data = summary.get("data")
    if not data:
        return ""
    kinds = ", ".join(f"{k} {n:,}" for k, n in data.get("examples_per_kind", {}).items())
    eval_file = data.get("eval_rows_read") is not None   # --eval-data: the eval records come from their own file
    used = data["train_records"] if eval_file else data["records_used"]
    cap = f", capped by max_rows={data['max_rows']:,}" if data.get("max_rows") and used < data["rows_valid"] else ""
    if eval_file:
        return (f"data            {used:,} of {data['rows_read']:,} training rows used{cap}, "
                f"{data['eval_records']:,} of {data['eval_rows_read']:,} eval-file rows; examples: {kinds}\n"
                + lengths_line(data))
    return (f"data            {data['records_used']:,} of {data['rows_read']:,} rows used{cap} "
            f"({data['train_records']:,} train / {data['eval_records']:,} eval); examples: {kinds}\n"
            + lengths_line(data))


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
    return line + roofline_line(summary)


def roofline_line(summary: dict[str, Any]) -> str:
    """Model FLOP/s and its share of the peak: MFU (GPU, hardware table) or the measured CPU GEMM's share."""
    flops, peak = summary.get("model_flops_per_s"), summary.get("peak_flops")
    if flops is None or not peak:
        return ""
    share, label = ((summary["mfu"], "MFU") if summary.get("mfu") is not None
                    else (summary.get("peak_share"), "of the measured matmul peak"))
    line = (f"model FLOP/s    {flops / 1e9:,.1f} GFLOP/s = {share:.1%} {label} "
            f"({peak / 1e9:,.1f} GFLOP/s per device, {summary.get('peak_source')})\n")
    if share is not None and share > 1:   # never an unexplained share above the peak
        line += ("                above 100 %: the run's matrix products ran faster than the peak timed at start-up "
                 "(the machine was busier then, or the run's shapes suit the kernels better than the timed "
                 "GEMMs); read the share as a ratio to that timing, not as a bound\n")
    return line


def step_model_flops(tokens: float, squared_lengths: float, predicted: float, flops_per_token_at,
                     head_flops: float) -> float:
    """The model FLOPs of one step: every real token through the blocks, the LM head only where the loss reads it.

    ``flops_per_token_at(T)``: 6Ψ + attention at length T (``models.bloom.flops_per_token``), which counts
    the LM head's 6·V·h for every token. ``predicted``: positions whose next token is a label (the only ones
    whose logits the loss needs: a fine-tuning step with prompt masking computes the head on those alone,
    ``models/loss.py``); ``head_flops``: 6·V·h. Counting the head at the prompt positions as well credited
    the run with work it does not do: on the synthetic nlu data 7.5 % of positions are labelled and the head
    is 14 % of ``small``'s 6Ψ, so 12 % of the FLOPs credited were never computed, and with a single 1024²
    GEMM's median as the peak (``envcheck/matmul.py``) a run's share reached 97-101 %.
    """
    return tokens * flops_per_token_at(attention_length(tokens, squared_lengths)) - max(
        tokens - predicted, 0.0) * head_flops


def _percentile(sorted_values: list[float], q: float) -> float:
    """Linear-interpolated percentile of an already sorted list (q in [0, 1])."""
    if not sorted_values:
        return float("nan")
    pos = (len(sorted_values) - 1) * q
    lo = int(pos)
    hi = min(lo + 1, len(sorted_values) - 1)
    return sorted_values[lo] + (sorted_values[hi] - sorted_values[lo]) * (pos - lo)


def throughput_summary(train_rows: list[dict[str, Any]], warmup_steps: int = 1,
                       slowest_rank_steady_s: float | None = None) -> dict[str, Any]:
    """Throughput of the steady phase: total samples (tokens) divided by total wall time.

    Why not the mean of per-step rates: with length-bucketed batches the step
    times are uneven, and the mean of ``samples / step_time`` weights a short
    fast step as much as a long slow one, so it overstates throughput (by 19-25 %
    on the chapter 02 runs). Dividing totals gives the rate a user's epoch
    actually runs at. The first ``warmup_steps`` rows (allocator warm-up,
    kernel selection) are left out when enough rows remain.

    ``slowest_rank_steady_s``: the steady-phase wall time of the slowest rank
    (an ``all_reduce(MAX)`` done by the caller); with several ranks the job runs
    at that rank's pace, so the rates are computed from it when given.
    """
    steady = train_rows[warmup_steps:] if len(train_rows) > warmup_steps else list(train_rows)
    times = [float(r["step_time_s"]) for r in steady]
    own_total = sum(times)
    total = max(own_total, slowest_rank_steady_s) if slowest_rank_steady_s is not None else own_total
    samples = sum(int(r["samples"]) for r in steady)
    tokens = sum(int(r["tokens"]) for r in steady)
    padded = sum(int(r.get("padded_tokens", 0)) for r in steady)
    ordered = sorted(times)
    return {
        "steady_steps": len(steady),
        "steady_wall_s": total,
        "samples_per_s": samples / total if total > 0 else float("nan"),
        "tokens_per_s": tokens / total if total > 0 else float("nan"),
        "step_time_s": total / len(steady) if steady else float("nan"),
        "step_time_median_s": _percentile(ordered, 0.5),
        "step_time_p90_s": _percentile(ordered, 0.9),
        "slowest_rank_steady_s": slowest_rank_steady_s,
        # pad positions / all positions of the steady steps, when the rows count padded positions
        "padding_rate": 1 - tokens / padded if padded and all("padded_tokens" in r for r in steady) else None,
    }


def time_split(train_rows: list[dict[str, Any]], warmup_steps: int = 1,
               parts: tuple[str, ...] = ("data_s", "fwd_bwd_s", "optim_s")) -> dict[str, float]:
    """Where the steady phase's wall time went: each part's share of the summed step times, plus ``other``.

    Shares of totals, like the throughput (a mean of per-step shares would
    weight short steps like long ones). ``other`` is what the parts leave out.
    """
    steady = train_rows[warmup_steps:] if len(train_rows) > warmup_steps else list(train_rows)
    total = sum(float(r["step_time_s"]) for r in steady)
    if total <= 0:
        return {}
    out = {p.removesuffix("_s"): sum(float(r.get(p) or 0.0) for r in steady) / total for p in parts}
    out["other"] = 1.0 - sum(out.values())
    return out


def slowest_rank_throughput(own_rows: list[dict[str, Any]], env: DistEnv, warmup_steps: int = 1,
                            rows: list[dict[str, Any]] | None = None) -> dict[str, Any]:
    """:func:`throughput_summary` of ``rows`` (default: ``own_rows``) at the slowest rank's pace.

    Every rank must call it (one ``all_reduce(MAX)`` of this rank's steady wall
    time when several ranks run). ``rows`` lets a caller that gathered every
    rank's counts summarise those while the pace still comes from each rank's
    own step times.
    """
    own_wall = throughput_summary(own_rows, warmup_steps)["steady_wall_s"]
    slowest = all_reduce_max(own_wall, env) if env.distributed else None
    return throughput_summary(own_rows if rows is None else rows, warmup_steps, slowest)
