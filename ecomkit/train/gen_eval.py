"""Evaluation by generation: decode held-out examples, parse the answers, score them against their baselines.

Each data shard decodes a disjoint share and every rank gathers all answers, so all compute the same figures; the
answers go to ``predictions.jsonl``, from which :func:`scores_from_predictions` recomputes every figure. Row keys:
classification ``gen_acc``, ``gen_macro_f1``, ``gen_majority_acc`` (training-majority baseline),
``gen_acc_margin_points``; extraction ``gen_span_precision``/``recall``/``f1``, ``gen_strict_acc``, the dictionary
baseline's ``dict_span_*``; both ``gen_decoded``, ``gen_at_budget`` (answers that used every new token without
ending), ``gen_budget_advice``, ``gen_invalid_text`` (U+FFFD), ``gen_spans_not_in_input``, ``gen_examples_per_s``.
"""

from __future__ import annotations

import dataclasses
import json
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterable, Mapping, Sequence

from ecomkit.data.formats import KIND_CLASSIFY, KIND_EXTRACT, Span, TaskExample, build_prompt, format_answer, \
    parse_answer
from ecomkit.config import TrainConfig
from ecomkit.data.tasks import CLASSIFICATION_TASKS
from ecomkit.dist import DistEnv, gather_objects, log
from ecomkit.train.evaluate import shard_range
from ecomkit.train.generate import DecodeSettings, decode_mode, decode_prompts
from ecomkit.train.task_metrics import (SpanDictionary, classification_scores, extraction_scores, invalid_text,
                                        margin_points, spans_not_in_text, training_majorities)

PREDICTIONS_FILE = "predictions.jsonl"
BUDGET_FLAG = "--gen-max-new-tokens"
# Share of answers at the budget above which a run advises: below it, freeing them moves no figure by a point
# (derived from an artifact in ecomlab/derive/budget.py).
BUDGET_ADVICE_SHARE = 0.013


@dataclass
class GenerationEvaluator:
    """Decode and score held-out examples; built once per run from the data, called at every evaluation."""

    examples: Sequence[TaskExample]     # held-out examples, in a fixed order (the same on every rank)
    dictionary: SpanDictionary          # the extraction baseline, from the training spans
    fmt: str                            # the prompt format the model is trained on
    settings: DecodeSettings
    n_samples: int                      # how many of ``examples`` a periodic evaluation decodes (0: none)
    majorities: dict[tuple[str, ...], str] = dataclasses.field(default_factory=dict)  # label set -> training majority
    final_samples: int = 0              # how many the final evaluation decodes (0: every example)
    longest_answer: int = 0             # the longest training answer in tokens, EOS included (0: unknown)

    @classmethod
    def build(cls, examples: Sequence[TaskExample], train_spans: Iterable[Span], fmt: str,
              settings: DecodeSettings, n_samples: int, majorities: Mapping[tuple[str, ...], str] | None = None,
              final_samples: int = 0, longest_answer: int = 0) -> "GenerationEvaluator":
        return cls(list(examples), SpanDictionary.from_spans(train_spans), fmt, settings, n_samples,
                   dict(majorities or {}), final_samples, longest_answer)

    def decoded_examples(self, final: bool = False) -> list[TaskExample]:
        """What one evaluation decodes: ``n_samples`` periodically, every example (or ``final_samples``) at the end."""
        limit = (self.final_samples or len(self.examples)) if final else self.n_samples
        return list(self.examples[:limit])

    def __call__(self, strategy, tokenizer, env: DistEnv, shard: tuple[int, int],
                 predictions_path: Path | None = None, progress: bool = False, final: bool = False,
                 bar: Any = None, untrained: bool = False) -> dict[str, Any]:
        """Every rank calls it (decoding and the gather are collectives); returns the row's ``gen_*`` fields.

        ``untrained``: no step taken yet (the step-0 reference), so no advice on the answers' ends.
        """
        chosen = self.decoded_examples(final)
        if not chosen:
            return {}
        index, count = shard
        start, end = shard_range(len(chosen), index, count)
        mine = chosen[start:end]
        prompts = [build_prompt(self.fmt, ex.kind, ex.text, ex.labels) for ex in mine]
        per_shard = -(-len(chosen) // count)
        n_batches = -(-per_shard // self.settings.batch_size)
        t0 = time.perf_counter()
        decoded = decode_prompts(strategy, tokenizer, prompts, env, self.settings, n_batches, progress, bar)
        elapsed = time.perf_counter() - t0
        parts = gather_objects((index, decoded.texts, decoded.cut, decoded.at_budget, elapsed), env)
        by_shard = {}
        for idx, t, c, b, _ in parts:
            by_shard.setdefault(idx, (t, c, b))         # one copy per data shard
        generated = [text for idx in sorted(by_shard) for text in by_shard[idx][0]]
        at_budget = [flag for idx in sorted(by_shard) for flag in by_shard[idx][2]]
        rows = prediction_rows(self.fmt, chosen, generated, self.dictionary, self.majorities, at_budget)
        out = scores_from_rows(rows)
        wall = max(p[4] for p in parts)
        out.update({"gen_decoded": len(rows), "gen_held_out": len(self.examples),
                    "gen_max_new_tokens": self.settings.max_new_tokens,
                    "gen_prompts_cut": sum(c for _, c, _ in by_shard.values()),
                    "gen_decode_s": wall, "gen_examples_per_s": len(rows) / wall if wall > 0 else float("nan"),
                    "gen_decode_mode": decode_mode(strategy), "gen_longest_train_answer": self.longest_answer or None})
        advice = None if untrained else budget_advice(out["gen_at_budget"], len(rows), self.settings.max_new_tokens,
                                                      self.longest_answer)
        if advice:
            out["gen_budget_advice"] = advice
            if env.is_main:
                (log.warning if final else log.info)(advice)
        if predictions_path is not None and env.is_main:
            write_predictions(predictions_path, rows)
        return out


def budget_advice(at_budget: int, total: int, max_new_tokens: int, longest_answer: int | None) -> str | None:
    """The line for answers that ran to the generation budget, with the lever that follows the cause.

    None at or below :data:`BUDGET_ADVICE_SHARE`. A budget that holds the longest training answer means the model has
    not learned to end its answers: training is the lever, not the budget.
    """
    if not total or at_budget / total <= BUDGET_ADVICE_SHARE:
        return None
    head = (f"{at_budget} of {total} generated answers stopped at the budget of {max_new_tokens} new tokens "
            "without ending")
    if longest_answer and max_new_tokens >= longest_answer:
        return (f"{head}: the budget holds the longest training answer ({longest_answer} tokens), so the model has "
                "not learned to end its answers yet; train longer (more steps or epochs), a larger "
                "--gen-max-new-tokens will not help")
    return f"{head} (they may be cut short); raise it with --gen-max-new-tokens N"


def budget_line(at_budget: int, total: int, max_new_tokens: int, flag: str) -> str:
    """How many answers stopped at the budget, and the flag that raises it above :data:`BUDGET_ADVICE_SHARE`."""
    head = f"{at_budget} of {total} generated answers stopped at the budget of {max_new_tokens} new tokens without ending"
    if total and at_budget / total > BUDGET_ADVICE_SHARE:
        return f"{head} (they may be cut short); raise it with {flag} N"
    return (f"{head}: no more than {BUDGET_ADVICE_SHARE:.1%} of them, too few to move a figure by a point, so no "
            f"advice")


def prediction_rows(fmt: str, examples: Sequence[TaskExample], generated: Sequence[str],
                    dictionary: SpanDictionary, majorities: Mapping[tuple[str, ...], str] | None = None,
                    at_budget: Sequence[bool] | None = None) -> list[dict[str, Any]]:
    """One ``predictions.jsonl`` row per example: what was asked, answered, read, and what the baselines say."""
    if len(examples) != len(generated):
        raise ValueError(f"{len(examples)} examples but {len(generated)} generated answers")
    at_budget = list(at_budget) if at_budget is not None else [False] * len(examples)
    rows = []
    for ex, text, stopped in zip(examples, generated, at_budget):
        parsed = parse_answer(fmt, ex.kind, text, ex.labels)
        row: dict[str, Any] = {"kind": ex.kind, "source": ex.source, "labels": list(ex.labels),
                               "prompt": build_prompt(fmt, ex.kind, ex.text, ex.labels),
                               "gold_answer": format_answer(fmt, ex), "generated": text,
                               "unknown_labels": list(parsed.unknown_labels), "at_budget": bool(stopped),
                               "invalid_text": invalid_text(text)}
        if ex.kind == KIND_CLASSIFY:
            row.update(gold=ex.gold_label, predicted=parsed.label, majority=(majorities or {}).get(tuple(ex.labels)))
        else:
            row.update(gold=[list(s) for s in ex.gold_spans], predicted=sorted(map(list, parsed.spans)),
                       dictionary=sorted(map(list, dictionary.predict(ex.text, ex.labels))),
                       spans_not_in_input=spans_not_in_text(parsed.spans, ex.text))
        rows.append(row)
    return rows


def scores_from_rows(rows: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """Every figure of an evaluation from its prediction rows alone (the rows ``predictions.jsonl`` holds)."""
    out: dict[str, Any] = {"gen_unknown_labels": sum(len(r["unknown_labels"]) for r in rows),
                           "gen_at_budget": sum(bool(r.get("at_budget")) for r in rows),
                           "gen_invalid_text": sum(bool(r.get("invalid_text")) for r in rows),
                           "gen_spans_not_in_input": sum(r.get("spans_not_in_input", 0) for r in rows)}
    cls = [r for r in rows if r["kind"] == KIND_CLASSIFY]
    if cls:
        golds = [r["gold"] for r in cls]
        got = classification_scores(golds, [r["predicted"] for r in cls])
        out.update(gen_acc=got["acc"], gen_macro_f1=got["macro_f1"], gen_classify_n=len(cls))
        if all(r.get("majority") is not None for r in cls):
            base = classification_scores(golds, [r["majority"] for r in cls])
            out.update(gen_majority_acc=base["acc"], gen_acc_margin_points=margin_points(got["acc"], base["acc"]),
                       gen_majority_labels=sorted({r["majority"] for r in cls}))
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
    examples = report.eval_examples
    if cfg.task != "nlu" or cfg.gen_eval_samples == 0:
        return None
    if not examples:
        log.info("evaluation by generation: none of the held-out records gives a classification or extraction "
                 "example (instruction rows are scored by their loss only)")
        return None
    final = min(cfg.final_eval_samples or len(examples), len(examples))
    settings_line = (f"evaluation by generation: {min(cfg.gen_eval_samples, len(examples))} of {len(examples)} "
                     f"held-out examples per periodic evaluation, {final} at the end, "
                     f"{'greedy' if cfg.gen_num_beams == 1 else f'{cfg.gen_num_beams} beams'}"
                     f", up to {cfg.gen_max_new_tokens} new tokens, prompt format {report.prompt_format}; "
                     f"baselines from the training split")
    log.info(settings_line)
    settings = DecodeSettings(max_new_tokens=cfg.gen_max_new_tokens, num_beams=cfg.gen_num_beams,
                              batch_size=cfg.gen_batch_size, use_cache=cfg.gen_use_cache, max_length=cfg.seq_len)
    majorities = training_majorities({t: report.labels[t] for t in CLASSIFICATION_TASKS if report.labels.get(t)},
                                     report.train_label_counts)
    train_lengths = report.lengths.get("train")
    return GenerationEvaluator.build(examples, report.train_spans, report.prompt_format, settings,
                                     cfg.gen_eval_samples, majorities, cfg.final_eval_samples,
                                     train_lengths.longest_answer if train_lengths is not None else 0)
