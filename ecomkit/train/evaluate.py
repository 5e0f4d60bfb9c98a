"""Evaluation: held-out loss, and NLU accuracy by scoring each candidate label.

Every rank evaluates an equal-sized, disjoint slice and the sums are
all-reduced. Equal sizes matter: with sharded strategies (ZeRO-3, FSDP)
every forward is a collective, so all ranks must run the same number.

Accuracy is computed the way SeqGPT-style models are used for
classification: for each candidate label, the sum of the log-probabilities
of its answer tokens after the prompt; the highest-scoring candidate is the
prediction. No generation, no string matching.
"""

from __future__ import annotations

from typing import Any, Sequence

import torch
import torch.distributed as dist

from ecomkit.data.tasks import CLASSIFICATION_TASKS, build_classification_example
from ecomkit.dist import DistEnv
from ecomkit.models.loss import count_label_tokens, token_loss_sum


def all_reduce_sums(values: list[float], env: DistEnv) -> list[float]:
    """Element-wise sums over all ranks, in float64 (token and sample counts stay exact up to 2**53).

    The loop's per-step counts and the evaluations both use it: one collective
    for several numbers, on the device NCCL needs, on the CPU for gloo.
    """
    if not env.distributed:
        return values
    t = torch.tensor(values, dtype=torch.float64, device=env.device if env.backend == "nccl" else "cpu")
    dist.all_reduce(t)
    return t.tolist()


@torch.no_grad()
def evaluate_loss(strategy, eval_ds, collate, env: DistEnv, micro_batch_size: int, n_batches: int,
                  shard: tuple[int, int] | None = None) -> float:
    """Mean next-token loss over ``n_batches`` micro-batches per data shard (global token mean).

    ``shard`` = (index, count) from ``strategy.data_shard()``; ranks of one
    shard (TP/PP) evaluate the same slice, and since numerator and denominator
    are both summed over all ranks the replication cancels out.
    """
    idx, n_shards = shard or (env.rank, env.world_size)
    per_rank = min(n_batches * micro_batch_size, len(eval_ds) // n_shards)
    start = idx * per_rank
    loss_sum, tokens = 0.0, 0
    model = strategy.model
    was_training = model.training
    model.eval()
    for i in range(start, start + per_rank, micro_batch_size):
        idx = list(range(i, min(i + micro_batch_size, start + per_rank)))
        batch = collate([eval_ds[j] for j in idx])
        batch = {k: v.to(env.device) for k, v in batch.items()}
        logits = strategy.forward_logits(batch["input_ids"], batch["attention_mask"])
        loss_sum += float(token_loss_sum(logits, batch["labels"]))
        tokens += count_label_tokens(batch["labels"])
    model.train(was_training)
    total_loss, total_tokens = all_reduce_sums([loss_sum, float(tokens)], env)
    return total_loss / max(total_tokens, 1.0)


def _candidate_batch(tokenizer, prompt: str, candidates: Sequence[str], device) -> tuple[dict, list[tuple[int, int]]]:
    """Token ids of prompt+candidate for each candidate, right-padded; answer spans per row."""
    prompt_ids = tokenizer(prompt, add_special_tokens=False)["input_ids"]
    rows, spans = [], []
    for cand in candidates:
        cand_ids = tokenizer(cand, add_special_tokens=False)["input_ids"]
        rows.append(prompt_ids + cand_ids)
        spans.append((len(prompt_ids), len(prompt_ids) + len(cand_ids)))
    width = max(len(r) for r in rows)
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else 0
    ids = torch.full((len(rows), width), pad, dtype=torch.long)
    mask = torch.zeros((len(rows), width), dtype=torch.long)
    for i, r in enumerate(rows):
        ids[i, : len(r)] = torch.tensor(r)
        mask[i, : len(r)] = 1
    return {"input_ids": ids.to(device), "attention_mask": mask.to(device)}, spans


@torch.no_grad()
def score_candidates(strategy, tokenizer, prompt: str, candidates: Sequence[str], device) -> int:
    """Index of the candidate whose answer tokens have the highest total log-probability."""
    batch, spans = _candidate_batch(tokenizer, prompt, candidates, device)
    logits = strategy.forward_logits(batch["input_ids"], batch["attention_mask"]).float()
    logp = torch.log_softmax(logits, dim=-1)
    scores = []
    for row, (a, b) in enumerate(spans):
        targets = batch["input_ids"][row, a:b]
        # the token at position t is predicted by the logits at position t-1
        scores.append(float(logp[row, a - 1 : b - 1].gather(-1, targets[:, None]).sum()))
    return int(max(range(len(scores)), key=scores.__getitem__))


@torch.no_grad()
def evaluate_nlu_accuracy(strategy, tokenizer, records: Sequence[dict[str, Any]], env: DistEnv,
                          n_samples: int, category_labels: Sequence[str] | None = None,
                          shard: tuple[int, int] | None = None) -> dict[str, float]:
    """Accuracy per classification task (``acc_category``, ``acc_sentiment``) on held-out records.

    Only records that carry every classification label are scored, so each
    rank runs exactly ``per_rank × len(tasks)`` forwards (sharded strategies
    need the same number of collectives on every rank).
    """
    idx, n_shards = shard or (env.rank, env.world_size)
    usable = [r for r in records if all(r.get(t) for t in CLASSIFICATION_TASKS)]
    per_rank = min(n_samples, len(usable)) // n_shards
    if per_rank == 0:
        return {}
    mine = usable[idx * per_rank : (idx + 1) * per_rank]
    model = strategy.model
    was_training = model.training
    model.eval()
    correct = dict.fromkeys(CLASSIFICATION_TASKS, 0.0)
    for rec in mine:
        for task in CLASSIFICATION_TASKS:
            ex = build_classification_example(rec, task, category_labels if task == "category" else None)
            pred = score_candidates(strategy, tokenizer, ex.prompt, ex.candidates, env.device)
            correct[task] += float(pred == ex.correct_index)
    model.train(was_training)
    sums = all_reduce_sums([correct[t] for t in CLASSIFICATION_TASKS], env)
    replication = env.world_size // n_shards  # TP/PP ranks of one shard score the same records
    scored = per_rank * n_shards
    out = {f"acc_{t}": c / replication / scored for t, c in zip(CLASSIFICATION_TASKS, sums)}
    out["nlu_scored"] = scored  # records scored per task: the accuracy resolution is 1/scored
    return out
