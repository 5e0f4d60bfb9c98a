"""Evaluation by generation: decode held-out examples, parse the answers, score them against their baselines.

The held-out :class:`~ecomkit.data.formats.TaskExample` list is the same on
every rank. The first ``n_samples`` of it are decoded: each data shard takes a
contiguous, disjoint share (sizes differ by at most one, nothing dropped) and
runs the same number of decoding batches (:func:`ecomkit.train.generate.generate_texts`).
The generated texts are gathered from the ranks with ``dist.gather_objects``
(the one "gather from ranks"), one copy per data shard (TP/PP ranks of one
shard decode the same share), so every rank then holds every answer in the
order of the list and computes the same figures from it. Those answers are
what ``predictions.jsonl`` records, so anyone can recompute every figure
(:func:`scores_from_predictions` does, and a test holds it to the summary).

Row keys (``metrics.jsonl`` eval rows and ``summary.json``), present when the
decoded examples include that kind:

- classification: ``gen_acc``, ``gen_macro_f1``, ``gen_majority_acc`` (the
  majority-label baseline: always the most frequent *training* label of the
  example's label set, recorded per row as ``majority``), ``gen_majority_labels``
  (the labels that baseline answered), ``gen_acc_margin_points``, ``gen_classify_n``;
- extraction: ``gen_span_precision``/``recall``/``f1``, ``gen_strict_acc``,
  ``gen_span_f1_per_label``, the dictionary baseline's ``dict_span_precision``/
  ``recall``/``f1`` and ``dict_strict_acc``, ``gen_span_f1_margin_points``,
  ``gen_extract_n``;
- both: ``gen_decoded``, ``gen_prompts_cut``, ``gen_unknown_labels``,
  ``gen_decode_s``, ``gen_examples_per_s`` (all decoded examples / wall time of
  the decoding, the slowest rank's), ``gen_decode_mode``.
"""

from __future__ import annotations

import json
import time
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterable, Mapping, Sequence

from ecomkit.data.formats import KIND_CLASSIFY, KIND_EXTRACT, Span, TaskExample, build_prompt, format_answer, \
    parse_answer
from ecomkit.config import TrainConfig
from ecomkit.dist import DistEnv, gather_objects, log
from ecomkit.train.generate import DecodeSettings, decode_mode, generate_texts
from ecomkit.train.task_metrics import (SpanDictionary, classification_scores, extraction_scores, majority_answer,
                                        margin_points)

PREDICTIONS_FILE = "predictions.jsonl"


def shard_range(n: int, index: int, count: int) -> tuple[int, int]:
    """``[start, end)`` of shard ``index`` of ``count`` over ``n`` items: contiguous, sizes differ by at most one."""
    base, extra = divmod(n, count)
    start = index * base + min(index, extra)
    return start, start + base + (index < extra)


@dataclass
class GenerationEvaluator:
    """Decode and score held-out examples; built once per run from the data, called at every evaluation."""

    examples: Sequence[TaskExample]     # held-out examples, in a fixed order (the same on every rank)
    dictionary: SpanDictionary          # the extraction baseline, from the training spans
    fmt: str                            # the prompt format the model is trained on
    settings: DecodeSettings
    n_samples: int                      # how many of ``examples`` each evaluation decodes (0: none)
    train_labels: Mapping[str, int]     # the classification baseline: label -> training records with it

    @classmethod
    def build(cls, examples: Sequence[TaskExample], train_spans: Iterable[Span], fmt: str,
              settings: DecodeSettings, n_samples: int, train_labels: Mapping[str, int]) -> "GenerationEvaluator":
        return cls(list(examples), SpanDictionary.from_spans(train_spans), fmt, settings, n_samples,
                   dict(train_labels))

    def decoded_examples(self) -> list[TaskExample]:
        return list(self.examples[:self.n_samples])

    def __call__(self, strategy, tokenizer, env: DistEnv, shard: tuple[int, int],
                 predictions_path: Path | None = None, progress: bool = False) -> dict[str, Any]:
        """Every rank calls it (decoding and the gather are collectives); returns the row's ``gen_*`` fields."""
        chosen = self.decoded_examples()
        if not chosen:
            return {}
        index, count = shard
        start, end = shard_range(len(chosen), index, count)
        mine = chosen[start:end]
        prompts = [build_prompt(self.fmt, ex.kind, ex.text, ex.labels) for ex in mine]
        per_shard = -(-len(chosen) // count)
        n_batches = -(-per_shard // self.settings.batch_size)
        t0 = time.perf_counter()
        texts, cut = generate_texts(strategy, tokenizer, prompts, env, self.settings, n_batches, progress)
        elapsed = time.perf_counter() - t0
        parts = gather_objects((index, texts, cut, elapsed), env)
        by_shard = {}
        for idx, t, c, _ in parts:
            by_shard.setdefault(idx, (t, c))            # one copy per data shard
        generated = [text for idx in sorted(by_shard) for text in by_shard[idx][0]]
        rows = prediction_rows(self.fmt, chosen, generated, self.dictionary, self.train_labels)
        out = scores_from_rows(rows)
        wall = max(p[3] for p in parts)
        out.update({"gen_decoded": len(rows), "gen_prompts_cut": sum(c for _, c in by_shard.values()),
                    "gen_decode_s": wall, "gen_examples_per_s": len(rows) / wall if wall > 0 else float("nan"),
                    "gen_decode_mode": decode_mode(strategy)})
        if predictions_path is not None and env.is_main:
            write_predictions(predictions_path, rows)
        return out


def prediction_rows(fmt: str, examples: Sequence[TaskExample], generated: Sequence[str],
                    dictionary: SpanDictionary, train_labels: Mapping[str, int]) -> list[dict[str, Any]]:
    """One ``predictions.jsonl`` row per example: what was asked, answered, read, and what the baseline says.

    ``train_labels``: how many training records carry each classification label (the majority baseline's
    answer comes from it, :func:`~ecomkit.train.task_metrics.majority_answer`).
    """
    if len(examples) != len(generated):
        raise ValueError(f"{len(examples)} examples but {len(generated)} generated answers")
    rows = []
    for ex, text in zip(examples, generated):
        parsed = parse_answer(fmt, ex.kind, text, ex.labels)
        row: dict[str, Any] = {"kind": ex.kind, "source": ex.source, "labels": list(ex.labels),
                               "prompt": build_prompt(fmt, ex.kind, ex.text, ex.labels),
                               "gold_answer": format_answer(fmt, ex), "generated": text,
                               "unknown_labels": list(parsed.unknown_labels)}
        if ex.kind == KIND_CLASSIFY:
            row.update(gold=ex.gold_label, predicted=parsed.label, majority=majority_answer(ex.labels, train_labels))
        else:
            row.update(gold=[list(s) for s in ex.gold_spans], predicted=sorted(map(list, parsed.spans)),
                       dictionary=sorted(map(list, dictionary.predict(ex.text, ex.labels))))
        rows.append(row)
    return rows


def scores_from_rows(rows: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """Every figure of an evaluation from its prediction rows alone (the rows ``predictions.jsonl`` holds)."""
    out: dict[str, Any] = {"gen_unknown_labels": sum(len(r["unknown_labels"]) for r in rows)}
    cls = [r for r in rows if r["kind"] == KIND_CLASSIFY]
    if cls:
        golds = [r["gold"] for r in cls]
        got = classification_scores(golds, [r["predicted"] for r in cls])
        base = classification_scores(golds, [r["majority"] for r in cls])   # the training majority's answers
        out.update(gen_acc=got["acc"], gen_macro_f1=got["macro_f1"], gen_majority_acc=base["acc"],
                   gen_majority_labels=sorted({r["majority"] for r in cls}),
                   gen_acc_margin_points=margin_points(got["acc"], base["acc"]), gen_classify_n=len(cls))
    ext = [r for r in rows if r["kind"] == KIND_EXTRACT]
    if ext:
        golds = [{tuple(s) for s in r["gold"]} for r in ext]
        got = extraction_scores(golds, [{tuple(s) for s in r["predicted"]} for r in ext])
        base = extraction_scores(golds, [{tuple(s) for s in r["dictionary"]} for r in ext])
        out.update(gen_span_precision=got["precision"], gen_span_recall=got["recall"], gen_span_f1=got["f1"],
                   gen_strict_acc=got["strict_acc"], gen_span_f1_per_label=got["per_label_f1"],
                   dict_span_precision=base["precision"], dict_span_recall=base["recall"], dict_span_f1=base["f1"],
                   dict_strict_acc=base["strict_acc"], gen_span_f1_margin_points=margin_points(got["f1"], base["f1"]),
                   gen_extract_n=len(ext))
    return out


def write_predictions(path: Path, rows: Sequence[dict[str, Any]]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "w", encoding="utf-8") as f:
        for row in rows:
            f.write(json.dumps(row, ensure_ascii=False) + "\n")


def read_predictions(path: str | Path) -> list[dict[str, Any]]:
    with open(path, encoding="utf-8") as f:
        return [json.loads(line) for line in f if line.strip()]


def scores_from_predictions(path: str | Path) -> dict[str, Any]:
    """Recompute an evaluation's figures from its ``predictions.jsonl``."""
    return scores_from_rows(read_predictions(path))


def evaluator_for_run(cfg: TrainConfig, report: Any) -> GenerationEvaluator | None:
    """The run's evaluator: task ``nlu`` with held-out classify/extract examples and ``gen_eval_samples > 0``."""
    examples = report.eval_examples   # ecomkit.data.build: held-out TaskExamples, in the run's prompt format
    if cfg.task != "nlu" or cfg.gen_eval_samples == 0:
        return None
    if not examples:
        log.info("evaluation by generation: none of the held-out records gives a classification or extraction "
                 "example (instruction rows are scored by their loss only)")
        return None
    settings_line = (f"evaluation by generation: {min(cfg.gen_eval_samples, len(examples))} of {len(examples)} "
                     f"held-out examples per evaluation, {'greedy' if cfg.gen_num_beams == 1 else f'{cfg.gen_num_beams} beams'}"
                     f", up to {cfg.gen_max_new_tokens} new tokens, prompt format {report.prompt_format}")
    log.info(settings_line)
    settings = DecodeSettings(max_new_tokens=cfg.gen_max_new_tokens, num_beams=cfg.gen_num_beams,
                              batch_size=cfg.gen_batch_size, use_cache=cfg.gen_use_cache, max_length=cfg.seq_len)
    train_labels = Counter()
    for counts in report.train_labels.values():   # category and sentiment labels, from the training records
        train_labels.update(counts)
    return GenerationEvaluator.build(examples, report.train_spans, report.prompt_format, settings, cfg.gen_eval_samples,
                                     train_labels)
