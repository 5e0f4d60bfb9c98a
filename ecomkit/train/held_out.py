"""What one evaluation of a training run reads: a sample at each periodic evaluation, every held-out row at the end.

Why the split: periodic evaluations draw the learning curve, and a sample is
enough for a curve; the final evaluation gives the figures a user quotes, and
a figure that rests on 32 of 1,343 rows is not one to quote. So the final
evaluation reads every held-out row: the loss over every example, candidate
scoring over every record of each target, generation over every example
(``--final-eval-samples N`` caps each at N, for quick runs), and each figure
says how many rows it rests on. The run logs what each kind of evaluation
covers once, at start-up (:func:`evaluation_scope`), including the case where
a sampling flag has nothing to act on.

A curve's last point therefore rests on more rows than the others: the
periodic points all read the same sample (the first rows of the held-out set),
so they compare with each other; the final one is the estimate to quote. On a
held-out set no larger than the sample the two are the same rows.
"""

from __future__ import annotations

from typing import Any, Iterable, Mapping

from ecomkit.config import TrainConfig
from ecomkit.data.tasks import CLASSIFICATION_TASKS, can_classify
from ecomkit.dist import log
from ecomkit.metrics import METHOD_OF_PREFIX
from ecomkit.train.evaluate import evaluate_nlu_accuracy, held_out_loss, shard_range
from ecomkit.train.gen_eval import PREDICTIONS_FILE
from ecomkit.train.progress import make_progress


def evaluate_held_out(run: Any, final: bool = False) -> dict[str, Any]:
    """Held-out loss, candidate-scoring accuracy and, for nlu, scores by generation (``final``: + predictions.jsonl).

    ``run``: a built :class:`~ecomkit.train.loop.TrainingRun`. Every rank calls it (the sums are collectives).
    The final evaluation shows one progress bar over all three, in held-out examples, with an ETA; a periodic one
    reads a sample and shows none (the training bar is running).
    """
    cfg, env = run.cfg, run.env
    cap = cfg.final_eval_samples or None
    bar = final_evaluation_bar(run, cap) if final else None
    # candidate scoring: several records per forward, within the padded positions of a training micro-batch
    positions = cfg.micro_batch_size * cfg.seq_len
    try:
        out: dict[str, Any] = held_out_loss(run.strategy, run.eval_ds, run.collate, env, cfg.micro_batch_size,
                                            None if final else cfg.eval_batches, run.shard, max_examples=cap,
                                            bar=bar)
        if cfg.task == "nlu" and len(run.eval_records):
            out.update(evaluate_nlu_accuracy(run.strategy, run.tokenizer, run.eval_records, env,
                                             cap if final else cfg.eval_nlu_samples, shard=run.shard,
                                             max_length=cfg.seq_len, labels=run.data_report.labels,
                                             prompt_format=cfg.prompt_format,
                                             train_label_counts=run.data_report.train_label_counts,
                                             batch_positions=positions, bar=bar))
        if run.gen_eval is not None:
            out.update(run.gen_eval(run.strategy, run.tokenizer, env, run.shard,
                                    run.out_dir / PREDICTIONS_FILE if final else None, False, final=final, bar=bar,
                                    untrained=run.step == 0 and not final))
    finally:
        if bar is not None:
            bar.close()
    out["eval_methods"] = eval_methods(out)   # which method made each figure: candidate scoring or generation
    return out


def eval_methods(row: dict[str, Any]) -> dict[str, str]:
    """``{figure: method}`` for the scores in an evaluation row (recorded in eval rows and ``summary.json``)."""
    out = {}
    for key, value in row.items():
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            method = next((m for prefix, m in METHOD_OF_PREFIX if key.startswith(prefix)), None)
            if method is not None and not key.endswith("_margin_points"):
                out[key] = method
    return out


def final_evaluation_units(run: Any, cap: int | None) -> int:
    """What this rank's share of the final evaluation holds, in examples: loss rows, scored records per target,
    decoded examples (the bar's total)."""
    index, count = run.shard
    loss_rows = min(len(run.eval_ds), cap or len(run.eval_ds))
    total = shard_size(loss_rows, index, count)
    if run.cfg.task == "nlu" and len(run.eval_records):
        for target in scored_targets(run.eval_records, run.data_report.labels):
            usable = sum(1 for r in run.eval_records if can_classify(r, target))
            total += shard_size(min(usable, cap or usable), index, count)
    if run.gen_eval is not None:
        total += shard_size(len(run.gen_eval.decoded_examples(final=True)), index, count)
    return total


def shard_size(n: int, index: int, count: int) -> int:
    start, end = shard_range(n, index, count)
    return end - start


def final_evaluation_bar(run: Any, cap: int | None) -> Any:
    """One bar over the whole final evaluation on rank 0 (``--progress``), in held-out examples, with an ETA."""
    enabled = bool(run.cfg.progress) and run.env.is_main
    return make_progress(final_evaluation_units(run, cap) if enabled else 0, enabled, desc="eval", eta=True)


def scored_targets(records: Iterable[Mapping[str, Any]], labels: Mapping[str, Any]) -> list[str]:
    """The classification targets candidate scoring can score: two or more labels, and a held-out record for it."""
    wanted = [t for t in CLASSIFICATION_TASKS if len(labels.get(t) or ()) >= 2]
    found: set[str] = set()
    for record in records:
        found.update(t for t in wanted if t not in found and can_classify(record, t))
        if len(found) == len(wanted):
            break
    return [t for t in wanted if t in found]


def evaluation_scope(cfg: TrainConfig, n_examples: int, records: Iterable[Mapping[str, Any]],
                     labels: Mapping[str, Any]) -> list[str]:
    """The lines that say what the periodic and the final evaluations read (logged once by the run)."""
    final = f"the first {cfg.final_eval_samples:,} of each" if cfg.final_eval_samples else "every held-out row"
    lines = [f"evaluation: periodic ones read up to {cfg.eval_batches} micro-batches per rank for the loss"
             + (f" and {cfg.eval_nlu_samples} records per classification target" if cfg.task == "nlu" else "")
             + f"; the final one reads {final} ({n_examples:,} held-out examples; --final-eval-samples caps it)"]
    if cfg.task == "nlu" and not scored_targets(records, labels):
        lines.append("evaluation: no held-out record has a classification label (category or sentiment with two "
                     "or more labels), so candidate scoring does not run and --eval-nlu-samples has no effect; "
                     "extraction is scored by generation (--gen-eval-samples)")
    return lines


def log_evaluation_scope(run: Any) -> None:
    """Say once, on rank 0, what the run's evaluations read (:func:`evaluation_scope`)."""
    if run.env.is_main:
        for line in evaluation_scope(run.cfg, len(run.eval_ds), run.eval_records, run.data_report.labels):
            log.info(line)
