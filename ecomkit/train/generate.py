"""Decoding held-out prompts under any strategy: batched, left-padded, greedy or beam search, with the KV cache.

Why left padding: every prompt must end at the same column, and BLOOM's ALiBi is built from the mask's running
count, so a left-padded row scores as it would alone. How each strategy decodes (:func:`decode_mode`): DDP,
Accelerate and ZeRO 0-2 run ``generate()`` on the unwrapped model; ZeRO-3 and FSDP2 ``generate(synced_gpus=True)``
(each forward gathers weights); TP ``generate()`` on the sharded module; PP and sequence parallel decode greedily
without the KV cache (:func:`greedy_without_cache`). Where forwards are collectives every rank runs the same number
of forwards, and one all-reduced "still running" flag per step decides when all stop.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Sequence

import torch
import torch.distributed as dist

from ecomkit.data.prompt_ids import cut_prompt, encode_prompt_texts
from ecomkit.dist import DistEnv
from ecomkit.metrics import make_progress

DECODE_GENERATE, DECODE_UNCACHED = "generate", "greedy-uncached"


@dataclass(frozen=True)
class DecodeSettings:
    """How held-out prompts are decoded (``TrainConfig.gen_*`` fields)."""

    max_new_tokens: int = 32
    num_beams: int = 1          # 1: greedy
    batch_size: int = 8         # prompts per decoding batch, per rank
    use_cache: bool = True      # False: recompute the whole prefix every step (the benchmark's reference)
    max_length: int = 1 << 30   # the training sequence length: prompts are cut the way training cut them


def eos_and_pad(tokenizer) -> tuple[int, int]:
    """The end-of-answer token training appended after every answer, and the id left padding uses."""
    eos = tokenizer.eos_token_id if tokenizer.eos_token_id is not None else tokenizer.pad_token_id
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else eos
    return int(eos), int(pad)


def encode_prompts(tokenizer, prompts: Sequence[str], settings: DecodeSettings) -> tuple[list[list[int]], int]:
    """Prompt ids as training laid them out before the answer, and how many prompts had to be cut.
    A prompt longer than ``max_length - 1`` is cut by training's own rule (:func:`~ecomkit.data.prompt_ids.cut_prompt`);
    the generated answer may run past ``max_length``, which ALiBi allows."""
    budget = max(2, settings.max_length - 1)
    out, cut = [], 0
    for encoded in encode_prompt_texts(tokenizer, list(prompts)):
        kept, lost = cut_prompt(encoded, budget)
        cut += lost.total > 0
        out.append(kept)
    return out, cut


def left_pad(rows: Sequence[Sequence[int]], pad_id: int, device) -> tuple[torch.Tensor, torch.Tensor]:
    """``[B, T]`` ids and attention mask, every row right-aligned (padding on the left)."""
    width = max(len(r) for r in rows)
    ids = torch.full((len(rows), width), pad_id, dtype=torch.long)
    mask = torch.zeros((len(rows), width), dtype=torch.long)
    for i, r in enumerate(rows):
        if r:
            ids[i, width - len(r):] = torch.tensor(list(r), dtype=torch.long)
            mask[i, width - len(r):] = 1
    return ids.to(device), mask.to(device)


def decode_mode(strategy) -> str:
    """``generate`` (transformers' ``generate()`` on the strategy's module) or ``greedy-uncached`` (PP, SP)."""
    if getattr(strategy, "pipeline", None) is not None:
        return DECODE_UNCACHED
    dims, par = getattr(strategy, "dims", None), getattr(strategy.cfg, "parallel", None)
    if dims is not None and dims.tp > 1 and par is not None and par.sequence_parallel:
        return DECODE_UNCACHED
    return DECODE_GENERATE


def needs_sync(strategy, env: DistEnv) -> bool:
    """Whether forwards are collectives across ranks that decode different prompts (see the module docstring)."""
    if not env.distributed:
        return False
    if strategy.name == "zero":
        return strategy.cfg.zero.stage == 3
    return strategy.name in ("fsdp", "tp", "pp", "mixed")


def any_rank_running(running: bool, env: DistEnv, sync: bool) -> bool:
    """One all-reduce of a 0/1 flag: True while any rank still decodes (or, without ``sync``, this one)."""
    if not sync:
        return running
    flag = torch.tensor([1.0 if running else 0.0], device=env.device if env.backend == "nccl" else "cpu")
    dist.all_reduce(flag)
    return bool(flag.item() > 0)


@torch.no_grad()
def greedy_without_cache(strategy, ids: torch.Tensor, mask: torch.Tensor, max_new_tokens: int, eos_id: int,
                         pad_id: int, env: DistEnv, sync: bool) -> torch.Tensor:
    """Greedy decoding through ``strategy.forward_logits`` on the whole sequence every step; new ids ``[B, n]``.
    Finished rows get ``pad_id``; with ``sync`` it runs until every rank's rows finish (one flag all-reduce a step)."""
    running = torch.ones(ids.shape[0], dtype=torch.bool, device=ids.device)
    new: list[torch.Tensor] = []
    for _ in range(max_new_tokens):
        if not any_rank_running(bool(running.any()), env, sync):
            break
        last = torch.tensor([ids.shape[1] - 1], device=ids.device)   # the head at the last position only
        logits = strategy.forward_logits(ids, mask, last)[:, -1].float()
        nxt = torch.where(running, logits.argmax(dim=-1), torch.full_like(running, pad_id, dtype=torch.long))
        new.append(nxt)
        ids = torch.cat([ids, nxt[:, None]], dim=1)
        mask = torch.cat([mask, running.long()[:, None]], dim=1)
        running &= nxt != eos_id
    return torch.stack(new, dim=1) if new else ids[:, :0]


@dataclass(frozen=True)
class Decoded:
    """One rank's decoded prompts: the answers, how many prompts were cut, and which answers hit the budget
    (``at_budget[i]``: no end-of-answer token within ``max_new_tokens``, so it may be cut short)."""

    texts: list[str]
    cut: int
    at_budget: list[bool]


def stopped_at_budget(row: Sequence[int], eos_id: int, max_new_tokens: int) -> bool:
    """Whether a generated row ran out of new tokens before its end-of-answer token."""
    return eos_id not in row and len(row) >= max_new_tokens


@torch.no_grad()
def decode_batch(strategy, ids: torch.Tensor, mask: torch.Tensor, settings: DecodeSettings, eos_id: int,
                 pad_id: int, env: DistEnv, sync: bool) -> list[list[int]]:
    """New token ids per row (up to its first EOS, which is dropped; a row without one keeps every token)."""
    if decode_mode(strategy) == DECODE_UNCACHED:
        out = greedy_without_cache(strategy, ids, mask, settings.max_new_tokens, eos_id, pad_id, env, sync)
    else:
        with strategy.autocast():
            out = strategy.raw_model.generate(
                input_ids=ids, attention_mask=mask, max_new_tokens=settings.max_new_tokens,
                num_beams=settings.num_beams, do_sample=False, use_cache=settings.use_cache,
                eos_token_id=eos_id, pad_token_id=pad_id, synced_gpus=sync)[:, ids.shape[1]:]
    rows = []
    for row in out.tolist():
        rows.append(row[:row.index(eos_id)] if eos_id in row else row)
    return rows


def generate_texts(strategy, tokenizer, prompts: Sequence[str], env: DistEnv, settings: DecodeSettings,
                   n_batches: int | None = None, progress: bool = False) -> tuple[list[str], int]:
    """This rank's prompts decoded (texts without the prompt) and the number of prompts cut to fit
    (:func:`decode_prompts` without the per-answer budget flags)."""
    decoded = decode_prompts(strategy, tokenizer, prompts, env, settings, n_batches, progress)
    return decoded.texts, decoded.cut


def decode_prompts(strategy, tokenizer, prompts: Sequence[str], env: DistEnv, settings: DecodeSettings,
                   n_batches: int | None = None, progress: bool = False, bar: Any = None) -> Decoded:
    """This rank's prompts decoded: texts without the prompt, prompts cut to fit, answers that hit the budget.
    ``n_batches``: batches every rank runs; a rank with fewer prompts repeats one and drops its output, so collective
    counts match. Decoded shortest first, returned in their own order; ``bar`` or ``progress`` show progress."""
    eos, pad = eos_and_pad(tokenizer)
    rows, cut = encode_prompts(tokenizer, prompts, settings)
    order = sorted(range(len(rows)), key=lambda i: len(rows[i]))
    bs = settings.batch_size
    n_batches = n_batches if n_batches is not None else -(-len(rows) // bs)
    sync = needs_sync(strategy, env)
    model = strategy.model
    was_training = model.training
    model.eval()
    strategy.raw_model.eval()
    own_bar = make_progress(n_batches, progress and env.is_main and bar is None, desc="decode")
    texts: list[str] = [""] * len(rows)
    at_budget: list[bool] = [False] * len(rows)
    try:
        for b in range(n_batches):
            chunk = order[b * bs:(b + 1) * bs]
            batch = [rows[i] for i in chunk] or rows[:1] or [[eos]]  # an empty share still takes part in collectives
            ids, mask = left_pad(batch, pad, env.device)
            new = decode_batch(strategy, ids, mask, settings, eos, pad, env, sync)[:len(chunk)]
            for i, r in zip(chunk, new):
                texts[i] = tokenizer.decode(r, skip_special_tokens=True)
                at_budget[i] = stopped_at_budget(r, eos, settings.max_new_tokens)
            own_bar.update(1)
            if bar is not None and chunk:
                bar.update(len(chunk))
    finally:
        own_bar.close()
        model.train(was_training)
        strategy.raw_model.train(was_training)
    return Decoded(texts, cut, at_budget)
