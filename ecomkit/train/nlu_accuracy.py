"""NLU accuracy by scoring each candidate label after the prompt (``--task nlu``; found by name, as generation is).

Why scoring, not generation: mean log-probability per token of prompt + candidate + EOS needs no string matching
and has no length bias. Every rank scores a disjoint share with the same number of forwards (collectives).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Iterable, Mapping, Sequence

import torch

from ecomkit.data.prompt_ids import encode_prompt_answer, encode_prompt_texts, fit_prompt_answer
from ecomkit.data.targets import build_classification_example
from ecomkit.data.tasks import CATEGORY_LABELS, CLASSIFICATION_TASKS, SENTIMENT_LABELS, can_classify
from ecomkit.data.tokenize import IGNORE_INDEX
from ecomkit.dist import DistEnv, all_reduce_max
from ecomkit.train.evaluate import all_reduce_sums, answer_positions, shard_range

# No truncation unless the caller gives the training sequence length.
_NO_TRUNCATION = 1 << 30


def scored_targets(records: Iterable[dict[str, Any]], labels: dict[str, Any]) -> list[str]:
    """The classification targets candidate scoring can score: two or more labels, and a held-out record for it."""
    wanted = [t for t in CLASSIFICATION_TASKS if len(labels.get(t) or ()) >= 2]
    found: set[str] = set()
    for record in records:
        found.update(t for t in wanted if t not in found and can_classify(record, t))
        if len(found) == len(wanted):
            break
    return [t for t in wanted if t in found]


def scored_examples(records: Sequence[dict[str, Any]], labels: dict[str, Any], cap: int | None,
                    shard: tuple[int, int]) -> int:
    """This shard's records a final evaluation scores, over every target (its progress bar's share)."""
    total = 0
    for target in scored_targets(records, labels):
        usable = sum(1 for r in records if can_classify(r, target))
        start, end = shard_range(min(usable, cap or usable), *shard)
        total += end - start
    return total


@dataclass(frozen=True)
class CandidateScore:
    """One candidate's log-probability after the prompt: the sum over its scored tokens and their count."""

    log_prob: float   # Σ log p over the answer tokens and the end-of-answer EOS
    n_tokens: int     # how many tokens that sum covers (answer tokens + 1)

    @property
    def mean(self) -> float:
        """The score candidates are ranked by: mean log-probability per scored token."""
        return self.log_prob / self.n_tokens


Rows = list[tuple[list[int], list[int]]]   # one example's candidates: (ids, labels) each, as in training


def encode_candidates(tokenizer, prompt: str, candidates: Sequence[str], max_length: int | None = None) -> Rows:
    """prompt + candidate + EOS per candidate, as in training; labels mark the scored tokens."""
    return [encode_prompt_answer(tokenizer, prompt, cand, max_length or _NO_TRUNCATION) for cand in candidates]


def encode_examples(tokenizer, examples: Sequence[Any], max_length: int | None = None) -> list[Rows]:
    """:func:`encode_candidates` for many examples at once: the prompts tokenised in one batch, each distinct
    candidate once (the same ids and labels; a tokenizer without EOS gets :func:`encode_candidates`' error)."""
    if tokenizer.eos_token_id is None:
        return [encode_candidates(tokenizer, ex.prompt, ex.candidates, max_length) for ex in examples]
    prompts = encode_prompt_texts(tokenizer, [ex.prompt for ex in examples])
    answers: dict[str, list[int]] = {}
    out = []
    for ex, prompt in zip(examples, prompts):
        rows = []
        for cand in ex.candidates:
            if cand not in answers:
                answers[cand] = tokenizer(cand, add_special_tokens=False)["input_ids"]
            ids, labels, _ = fit_prompt_answer(prompt, answers[cand], tokenizer.eos_token_id,
                                               max_length or _NO_TRUNCATION)
            rows.append((ids, labels))
        out.append(rows)
    return out


def _candidate_batch(rows: Rows, pad: int, device) -> tuple[dict, torch.Tensor]:
    """The rows right-padded into one batch; labels mark the scored tokens."""
    width = max(len(ids) for ids, _ in rows)
    ids = torch.full((len(rows), width), pad, dtype=torch.long)
    mask = torch.zeros((len(rows), width), dtype=torch.long)
    labels = torch.full((len(rows), width), IGNORE_INDEX, dtype=torch.long)
    for i, (row_ids, row_labels) in enumerate(rows):
        ids[i, : len(row_ids)] = torch.tensor(row_ids)
        mask[i, : len(row_ids)] = 1
        labels[i, : len(row_labels)] = torch.tensor(row_labels)
    return {"input_ids": ids.to(device), "attention_mask": mask.to(device)}, labels.to(device)


@torch.no_grad()
def score_encoded(strategy, encoded: Sequence[Rows], pad: int, device) -> list[list[CandidateScore]]:
    """Every candidate of several examples in one padded forward: one list of scores per example (right padding
    leaves real positions' logits unchanged; only answer positions' logits are computed)."""
    flat = [row for rows in encoded for row in rows]
    batch, labels = _candidate_batch(flat, pad, device)
    positions = answer_positions(labels)
    logits = strategy.forward_logits(batch["input_ids"], batch["attention_mask"], positions)
    # the token at position t + 1 is predicted by the logits at position t; only scored positions get a softmax
    targets = labels[:, positions + 1]
    scored = targets != IGNORE_INDEX
    logp = torch.log_softmax(logits[scored].float(), dim=-1)                    # [n_scored, vocab]
    token_logp = logp.gather(-1, targets[scored][:, None]).squeeze(-1)
    sums = torch.zeros(len(flat), dtype=torch.float64, device=token_logp.device)
    sums.index_add_(0, scored.nonzero()[:, 0], token_logp.double())
    counts = scored.sum(1).tolist()
    scores = [CandidateScore(float(v), int(c)) for v, c in zip(sums.tolist(), counts)]
    out, at = [], 0
    for rows in encoded:
        out.append(scores[at:at + len(rows)])
        at += len(rows)
    return out


@torch.no_grad()
def candidate_log_probs(strategy, tokenizer, prompt: str, candidates: Sequence[str], device,
                        max_length: int | None = None) -> list[CandidateScore]:
    """Σ log-probability of each candidate's answer tokens and EOS after ``prompt``, in one padded forward
    (``max_length``: training's sequence length, so a long prompt is cut as training cut it)."""
    encoded = encode_candidates(tokenizer, prompt, candidates, max_length)
    return score_encoded(strategy, [encoded], pad_id_of(tokenizer), device)[0]


def pad_id_of(tokenizer) -> int:
    return tokenizer.pad_token_id if tokenizer.pad_token_id is not None else 0


def plan_groups(sizes: Sequence[tuple[int, int]], budget: int | None) -> list[list[int]]:
    """Examples grouped for one forward each, shortest first: ``sizes`` = (rows, longest row) per example; a group's
    padded positions stay within ``budget`` (None: one example per forward; a larger example forms a group alone)."""
    order = sorted(range(len(sizes)), key=lambda i: sizes[i][1])
    groups: list[list[int]] = []
    rows = width = 0
    for i in order:
        n, w = sizes[i]
        if groups and budget is not None and (rows + n) * max(width, w) <= budget:
            groups[-1].append(i)
            rows, width = rows + n, max(width, w)
        else:
            groups.append([i])
            rows, width = n, w
    return groups


def best_candidate(scores: Sequence[CandidateScore]) -> int:
    """Index of the highest mean log-probability per scored token; ties go to the lowest index."""
    if not scores:
        raise ValueError("no candidates to choose from")
    best = 0
    for i, s in enumerate(scores):
        if s.mean > scores[best].mean:
            best = i
    return best


def score_candidates(strategy, tokenizer, prompt: str, candidates: Sequence[str], device,
                     max_length: int | None = None) -> int:
    """The predicted candidate: see the module docstring for the rule (mean log-prob per token, EOS included)."""
    return best_candidate(candidate_log_probs(strategy, tokenizer, prompt, candidates, device, max_length))


def majority_label(labels: Sequence[str], train_counts: Mapping[str, int]) -> str:
    """The majority-label baseline's one answer for a label set: its most frequent *training* label (ties and
    unseen label sets: the first label)."""
    if not labels:
        raise ValueError("a label set without labels has no majority")
    labels = list(labels)
    return max(labels, key=lambda lab: (train_counts.get(lab, 0), -labels.index(lab)))


def majority_share(label_counts: Sequence[float], majority: int) -> float:
    """The majority-class baseline: the share of the scored records whose label is ``majority``, the training
    split's most frequent label (its index)."""
    total = sum(label_counts)
    return label_counts[majority] / total if total else float("nan")


def macro_f1(confusion: Sequence[Sequence[float]]) -> float:
    """Mean F1 over the labels that occur as gold or prediction (``confusion[gold][pred]`` counts).
    Why beside accuracy: on skewed labels always answering the majority scores high accuracy, but macro-F1 near
    ``1 / n_labels``."""
    k = len(confusion)
    scores = []
    for c in range(k):
        tp = confusion[c][c]
        gold = sum(confusion[c])
        pred = sum(confusion[g][c] for g in range(k))
        if gold or pred:
            scores.append(2 * tp / (gold + pred))
    return sum(scores) / len(scores) if scores else float("nan")


def _usable(records: Iterable[dict[str, Any]], task: str, limit: int | None) -> list[dict[str, Any]]:
    """The first ``limit`` records (None: all) that give a ``task`` example (a list or an Arrow table)."""
    out = []
    for rec in records:
        if limit is not None and len(out) >= limit:
            break
        if can_classify(rec, task):
            out.append(rec)
    return out


@torch.no_grad()
def evaluate_nlu_accuracy(strategy, tokenizer, records: Iterable[dict[str, Any]], env: DistEnv,
                          n_samples: int | None, category_labels: Sequence[str] | None = None,
                          shard: tuple[int, int] | None = None, max_length: int | None = None,
                          labels: Mapping[str, Sequence[str]] | None = None,
                          prompt_format: str = "ecomkit",
                          train_label_counts: Mapping[str, Mapping[str, int]] | None = None,
                          batch_positions: int | None = None, bar: Any = None) -> dict[str, Any]:
    """Accuracy, macro-F1 and majority-class baseline per classification target, on held-out records.

    Per target ``t``: ``acc_t``, ``macro_f1_t``, ``majority_t``, ``majority_label_t`` and ``scored_t`` on up to
    ``n_samples`` records carrying its label; targets with fewer than two candidates are skipped.
    ``batch_positions``: padded positions per forward (:func:`plan_groups`), None for one record per forward.
    """
    idx, n_shards = shard or (env.rank, env.world_size)
    candidates = {"category": tuple(category_labels or CATEGORY_LABELS), "sentiment": SENTIMENT_LABELS,
                  **{t: tuple(v) for t, v in (labels or {}).items() if t in CLASSIFICATION_TASKS}}
    tasks = [t for t in CLASSIFICATION_TASKS if len(candidates[t]) >= 2]
    mine, scored, rounds = {}, {}, {}
    for task in tasks:
        usable = _usable(records, task, n_samples)
        if len(usable) >= n_shards:   # every shard scores at least one record
            start, end = shard_range(len(usable), idx, n_shards)
            mine[task], scored[task], rounds[task] = usable[start:end], len(usable), -(-len(usable) // n_shards)
    if not mine:
        return {}
    model = strategy.model
    was_training = model.training
    model.eval()
    confusion = {t: [[0.0] * len(candidates[t]) for _ in candidates[t]] for t in mine}
    for task, recs in mine.items():
        examples = [build_classification_example(r, task, candidates[task], prompt_format) for r in recs]
        encoded = encode_examples(tokenizer, examples, max_length)
        groups = plan_groups([(len(rows), max(len(ids) for ids, _ in rows)) for rows in encoded], batch_positions)
        if batch_positions is None:   # one record per forward: every rank runs the largest share's count
            n_forwards = rounds[task]
        else:                         # grouped by length: the most groups any rank has (one collective)
            n_forwards = int(all_reduce_max(float(len(groups)), env)) if env.distributed else len(groups)
        for i in range(n_forwards):   # a rank with fewer groups scores its last group again, not counted
            group = groups[min(i, len(groups) - 1)]
            scores = score_encoded(strategy, [encoded[j] for j in group], pad_id_of(tokenizer), env.device)
            if i >= len(groups):
                continue
            for j, cand_scores in zip(group, scores):
                confusion[task][examples[j].correct_index][best_candidate(cand_scores)] += 1.0
            if bar is not None:
                bar.update(len(group))
    model.train(was_training)
    flat = [c for t in mine for row in confusion[t] for c in row]
    sums = all_reduce_sums(flat, env)
    replication = env.world_size // n_shards  # TP/PP ranks of one shard score the same records
    out: dict[str, float] = {}
    offset = 0
    for task in mine:
        k = len(candidates[task])
        matrix = [[sums[offset + g * k + p] / replication for p in range(k)] for g in range(k)]
        offset += k * k
        total = sum(map(sum, matrix))
        out[f"acc_{task}"] = sum(matrix[c][c] for c in range(k)) / total
        out[f"macro_f1_{task}"] = macro_f1(matrix)
        if train_label_counts is not None:   # the baseline learns from training labels, never from these
            best = majority_label(candidates[task], train_label_counts.get(task, {}))
            out[f"majority_{task}"] = majority_share([sum(row) for row in matrix], candidates[task].index(best))
            out[f"majority_label_{task}"] = best
        out[f"scored_{task}"] = scored[task]
    out["nlu_scored"] = min(scored.values())  # the accuracy resolution is 1/scored
    return out


__all__ = ["CandidateScore", "best_candidate", "candidate_log_probs", "encode_candidates", "encode_examples",
           "evaluate_nlu_accuracy", "macro_f1", "majority_label", "majority_share", "pad_id_of", "plan_groups",
           "score_candidates", "score_encoded", "scored_examples", "scored_targets"]
