"""The one training loop every chapter reuses, read top to bottom like torchtitan's ``train.py``.

Why one: what differs between strategies lives behind :class:`~ecomkit.parallel.base.Strategy`, and callbacks add
checkpoints, health checks and fault handling.
"""

from __future__ import annotations

import functools
import os
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Iterable, Iterator, Sequence

import datasets
import torch
import torch.distributed as dist
from torch.utils.data import DataLoader

from ecomkit import find
from ecomkit.config import TrainConfig, data_parallel_size
from ecomkit.config.recipe import LENGTH_CHECK_STEPS, capped_length
from ecomkit.data import build_datasets, lengths_array, pad_collate
from ecomkit.data.task_file import parse_labels, write_task_file
from ecomkit.data.tokenize import BatchCounts, row_counts
from ecomkit.dist import (DistEnv, all_reduce_max, all_reduce_sum_tensor, distributed_session, log, replica_checksums,
                          restart_attempt, to_device)
from ecomkit.errors import ConfigError
from ecomkit.fast import install_fast_paths
from ecomkit.faults import add_fault_tolerance_callbacks
from ecomkit.hardware import device_peak, mfu_fields
from ecomkit.metrics import (TASK_SUMMARY, MetricsWriter, fill_rate_of, make_progress, peak_memory,
                             slowest_rank_throughput, step_model_flops, time_split)
from ecomkit.models.bloom import PRESETS, ModelSource, flops_per_token, model_length_limit, model_origin
from ecomkit.models.optim import set_schedule_length
from ecomkit.models.precision import length_multiple
from ecomkit.models.tokenizer import get_tokenizer, match_tokenizer
from ecomkit.parallel import LORA, build_strategy, strategy_callbacks
from ecomkit.parallel.base import StepStats
from ecomkit.train.evaluate import held_out_loss, shard_range
from ecomkit.train.outcome import BestWeights, keep_best_or_last
from ecomkit.train.preempt import add_preemption_callbacks
from ecomkit.train.resolve import ModelFacts, ResolvedConfig, RunFacts, precision_choice, resolve_run

# What a run imports only when its config uses it (ecomkit.find, as for its strategy and LoRA).
PACKING = "ecomkit.data.packing"        # --packing on, or auto's pick
SAMPLER = "ecomkit.data.sampler"        # --packing off: bucketed rows
GENERATION = "ecomkit.train.gen_eval"   # --task nlu: scores by generation
SCORING = "ecomkit.train.nlu_accuracy"  # --task nlu: accuracy by candidate scoring
VERDICT = "ecomkit.train.task_metrics"  # --task nlu: whether the figures cleared their baselines
CLIP = "ecomkit.train.clip"             # --clip-policy sentiment
SUMMED = ("loss_sum", *BatchCounts._fields[1:], "stop")   # the columns of a log interval's one all-reduce


def tokenizer_cache_dir() -> Path:
    return Path(os.environ.get("ECOMKIT_CACHE", Path.home() / ".cache" / "ecomkit"))


class TrainingRun:
    """State of one run. Attributes are public so callbacks (checkpointing) can read and restore them."""

    def __init__(self, cfg: TrainConfig, env: DistEnv, callbacks: Sequence[Any] = ()):
        self.flags, self.env, self.callbacks = cfg, env, list(callbacks)   # the flags are read, never written
        self.cfg = cfg                # replaced by the resolved configuration in build()
        self.step = 0                 # optimizer steps completed
        self.epoch = 0
        self.history: list[dict[str, Any]] = []
        self.out_dir = Path(cfg.output_dir)
        self.stop_flag: Callable[[], bool] = lambda: False  # set by train/preempt.py: this rank was signalled
        self.stop_agreed = False      # some rank was: every rank stops after this step (see _finish_steps)
        self.length_cut: dict[str, Any] | None = None   # --max-train-minutes shortened the run (summary.json)

    # ------------------------------------------------------------------ build
    def build(self) -> "TrainingRun":
        """Build every part of the run; a failure part-way releases what was made (DDP's shm segment, groups)."""
        try:
            return self._build()
        except BaseException:
            self.close()
            raise

    def _build(self) -> "TrainingRun":
        cfg, env = self.resolve().cfg, self.env
        self.strategy = build_strategy(cfg, env)
        self.shard = self.strategy.data_shard()                  # (index, count): dp coordinate for TP/PP
        self.replication = env.world_size // self.shard[1]       # ranks that see the same batch
        self.sampler, self.loader = self.training_loader(self.shard)
        self.gen_eval = (find(f"{GENERATION}:evaluator_for_run")(cfg, self.data_report)
                         if cfg.task == "nlu" and cfg.gen_eval_samples else None)
        # The strategy materialises the model: whole, or only this rank's part (ZeRO-3 zero.Init, FSDP2/TP on meta).
        built = self.strategy.build_model(ModelSource(cfg.model, vocab_size=len(self.tokenizer), seed=cfg.seed))
        if cfg.peft != "none":   # LoRA (peft): after the model is built, before the strategy wraps it
            built = find(f"{LORA}:apply_peft")(built, cfg)
        # attention, fused GeLU and loss kernels, the chunked loss, --compile: in that order (ecomkit/fast/__init__.py)
        install_fast_paths(built, cfg, env.device, self.strategy, self.packed)
        self.n_params = self.strategy.parameter_count(built)
        self.n_trainable = (find(f"{LORA}:trainable_parameter_count")(built) if cfg.peft != "none"
                            else self.n_params)
        self.model_config = built.config
        self.strategy.setup(built, self.total_steps)
        self.clip = find(f"{CLIP}:SentimentClip")(env) if cfg.clip_policy == "sentiment" else None
        self.peak, self.mfu_note = device_peak(env.device, cfg.precision)   # the hardware table, once
        resuming = any(getattr(cb, "resuming", False) for cb in self.callbacks)   # appends to metrics.jsonl
        self.metrics = MetricsWriter(self.out_dir, env.is_main, append=resuming, report_to=cfg.report_to,
                                     hparams=cfg.to_dict())  # --report-to
        return self

    def resolve(self) -> ResolvedConfig:
        """The run's facts (the device's precision, the model's shape, the data) and every ``auto`` resolved from
        them once (train/resolve.py); ``self.cfg`` is the sealed result. Public for HF Trainer's path."""
        flags, env = self.flags, self.env
        flags.validate(env.world_size)   # as parse_config does, for runs started inside a session (sweeps)
        self.tokenizer = self.build_tokenizer()
        model = ModelFacts.of(flags.model, len(self.tokenizer))   # its config, on the meta device
        flags.validate(env.world_size, n_head=model.n_head, n_layer=model.n_layer)   # tp divides heads, pp blocks
        precision = precision_choice(flags.precision, env)
        self.build_data()
        self.resolved = resolve_run(flags, RunFacts(env, precision, model, self.data_report,
                                                    float(self.lengths.mean()), len(self.train_ds),
                                                    self._steps_per_epoch))
        self.cfg = self.resolved.cfg
        self.grad_accum, self.packed, self.total_steps = (self.resolved.grad_accum, self.resolved.packed,
                                                          self.cfg.max_steps)
        self.shard = (env.rank, self.resolved.dp)   # replaced by the strategy's (its dp coordinate for TP/PP)
        return self.resolved

    def build_tokenizer(self):
        """Rank 0 trains/loads first (it may write the cache); the others load after a barrier."""
        cache = tokenizer_cache_dir()
        if self.env.distributed and not self.env.is_main:
            dist.barrier()
            return get_tokenizer(self.flags.tokenizer, cache)
        tok = get_tokenizer(self.flags.tokenizer, cache)
        if self.env.distributed:
            dist.barrier()
        return tok

    def build_data(self) -> None:
        """The tokenized sets, on rank 0 first (it writes the Arrow cache); public for HF Trainer's path."""
        datasets.disable_progress_bars()  # progress bars only add noise to logs
        cfg = self.flags
        limit = model_length_limit(cfg.model)   # every rank: an unknown --model fails here, each with its message
        # The barrier is in `finally`: if rank 0 fails (bad data), the others fail the same way, not hang.
        if self.env.distributed and not self.env.is_main:
            dist.barrier()
        try:
            self.train_ds, self.eval_ds, self.eval_records, self.data_report = build_datasets(
                cfg.data, n_rows=cfg.n_rows if cfg.data == "synthetic" else None, seed=cfg.seed, task=cfg.task,
                tokenizer=self.tokenizer, max_length=cfg.seq_len, length_limit=limit,
                column_map=cfg.column_map, strict=cfg.strict_data,
                num_proc=cfg.num_proc, label_map=cfg.label_map, max_rows=cfg.max_rows or None,
                max_bad_fraction=cfg.max_bad_fraction, prompt_format=cfg.prompt_format,
                eval_data=cfg.eval_data or None, labels=parse_labels(cfg.labels) or None, span_end=cfg.span_end)
        finally:
            if self.env.distributed and self.env.is_main:
                dist.barrier()
        if cfg.clip_policy == "sentiment" and "polarity" not in self.train_ds.column_names:
            raise ConfigError("--clip-policy sentiment needs sentiment labels in the data (a 'sentiment' column "
                              "whose values are, or are mapped by --label-map to, positive/neutral/negative).")
        self.lengths = lengths_array(self.train_ds)

    # ------------------------------------------------------------------ batches
    def pad_id(self) -> int:
        return self.tokenizer.pad_token_id if self.tokenizer.pad_token_id is not None else 0

    def collate(self, features):
        """Unpadded rows into one padded batch (evaluation, HF Trainer); bf16 on CPU: bounded shapes."""
        return pad_collate(features, self.pad_id(), length_multiple(self.cfg.precision, self.env.device))

    def _steps_per_epoch(self, packed: bool, grad_accum: int) -> int:
        """Optimizer steps in one pass over the training rows, for a layout the resolver considers."""
        dp = data_parallel_size(self.flags, self.env.world_size)
        if packed:
            return find(f"{PACKING}:PackedBatchSampler")(self.lengths, self.data_report.seq_len,
                                                         self.flags.micro_batch_size, grad_accum, dp, 0,
                                                         self.flags.seed).steps_per_epoch
        return find(f"{SAMPLER}:DistributedBatchSampler")(self.lengths, self.flags.micro_batch_size, grad_accum, dp,
                                                          0, self.flags.seed,
                                                          bucketed=self.flags.bucketed).steps_per_epoch

    def training_loader(self, shard: tuple[int, int]) -> tuple[Any, DataLoader]:
        return training_loader(self.train_ds, self.lengths, self.cfg, shard, self.grad_accum, self.packed,
                               self.pad_id(), length_multiple(self.cfg.precision, self.env.device),
                               self.env.device.type == "cuda")

    def global_batch(self) -> int:
        return self.resolved.global_batch

    def _micro_batches(self) -> Iterator[list[tuple[dict, BatchCounts]]]:
        """Yield the micro-batches of one optimizer step, crossing epoch boundaries as needed."""
        while True:
            self.sampler.set_epoch(self.epoch)
            group: list[tuple[dict, BatchCounts]] = []
            for batch in self.loader:
                group.append(batch)
                if len(group) == self.grad_accum:
                    yield group
                    group = []
            self.epoch += 1

    # ------------------------------------------------------------------ the loop
    def fit(self) -> dict[str, Any]:
        cfg, env = self.cfg, self.env
        for cb in self.callbacks:
            getattr(cb, "on_train_start", lambda run: None)(self)
        if env.is_main:
            log.info(self.startup_report())
        # FLOPs per token given the batch's attention length (metrics.attention_length: real tokens, not seq_len)
        flops_tok = functools.partial(flops_per_token, self.n_params, self.model_config.n_layer,
                                      self.model_config.hidden_size)
        # the LM head's 6·V·h per position, counted only where the loss reads it (metrics.step_model_flops)
        self.head_flops = 6.0 * self.model_config.vocab_size * self.model_config.hidden_size
        bar = make_progress(self.total_steps, cfg.progress and env.is_main, eta=True)
        bar.update(self.step)
        batches = self._micro_batches()
        best = BestWeights.for_run(self)   # final/ keeps the best evaluated weights, or says why the last
        if cfg.eval_interval and self.step == 0:  # evaluations at steps 0, k, 2k, ...: the untrained reference
            self.metrics.write(best.observe(0, {"type": "eval", "step": 0, **self.evaluate()}))
        start_time = time.perf_counter()
        pending: list[tuple[dict[str, Any], StepTensors]] = []   # steps whose device values are not read yet
        while self.step < self.total_steps:
            self._maybe_inject_fault()
            fetch_start = time.perf_counter()  # a step's wall time starts with fetching its batches
            row, tensors = self._train_step(next(batches), fetch_start)
            pending.append((row, tensors))
            self.step += 1
            if self.step == cfg.untimed_steps + LENGTH_CHECK_STEPS:
                self._check_length(start_time, pending, bar)   # --max-train-minutes, on measured steps
            eval_due = bool(cfg.eval_interval) and self.step % cfg.eval_interval == 0 and self.step < self.total_steps
            if eval_due or self.step % cfg.log_interval == 0 or self.step == self.total_steps:
                # the log interval's one read of the device: losses, counts and norms of its steps, and the stop flag
                self._finish_steps(pending, flops_tok)
                if eval_due:
                    row.update(best.observe(self.step, self.evaluate()))
                for done, _ in pending:
                    self.history.append(done)
                    self.metrics.write(done)
                pending = []
                bar.set_postfix(loss=f"{row['loss']:.4f}", lr=f"{row['lr']:.2e}")
            bar.update(1)
            for cb in self.callbacks:
                getattr(cb, "on_step_end", lambda run, r: None)(self, row)
        bar.close()
        return self._finish_training(best, time.perf_counter() - start_time)

    def _maybe_inject_fault(self) -> None:
        """``--fail-at-step K --fail-rank R``: rank R dies at step K, once (not after a torchrun restart)."""
        f = self.cfg
        if (f.fail_at_step >= 0 and self.step == f.fail_at_step and self.env.rank == f.fail_rank
                and restart_attempt() == 0):
            print(f"[rank {self.env.rank}] fault injection: exiting abruptly at step {self.step}", flush=True)
            os._exit(13)

    def _train_step(self, micro: list[tuple[dict, BatchCounts]], started: float | None = None
                    ) -> tuple[dict[str, Any], "StepTensors"]:
        """One optimizer step, with no read of the device: its host row, and its device values for later.
        Per micro-batch forward, loss, backward, then clip and step; ``started``: when fetching ``micro`` began."""
        strategy = self.strategy
        t0 = time.perf_counter() if started is None else started
        batches, counts, label_tokens, scale = self._step_inputs(micro)
        t_data = time.perf_counter() - t0
        if strategy.owns_forward_backward:   # pipelines run the whole step through their schedule (chapter 04)
            loss_sum, times = self._pipeline_forward_backward(batches, scale)
        else:
            loss_sum, times = None, []
            for i, batch in enumerate(batches):
                tm = time.perf_counter()
                # DDP: no_sync() on every micro-step but the last, so gradients accumulate locally
                with strategy.micro_step_context(is_last=i == len(batches) - 1):
                    tok_sum = strategy.forward_loss_sum(batch)   # forward, loss summed over label tokens
                    strategy.backward(tok_sum * scale)           # backward; DDP all-reduces each full bucket
                loss_sum = tok_sum.detach() if loss_sum is None else loss_sum + tok_sum.detach()
                times.append(time.perf_counter() - tm)
        clip_value = self._clip_value(batches)   # fixed, or the sentiment rule of chapter 02
        tc = time.perf_counter()
        stats = strategy.clip_and_step(clip_value)   # clip the global gradient norm, then the optimizer step
        row = self._step_row(clip_value, stats, t0, t_data, times, time.perf_counter() - tc)
        return row, StepTensors(loss_sum, label_tokens, stats.grad_norm, stats.skipped, counts[1:])

    def _pipeline_forward_backward(self, batches: list[dict], scale: Any) -> tuple[torch.Tensor, list[float]]:
        """A pipeline's whole step through its schedule: the loss sum and its one timing."""
        tm = time.perf_counter()
        loss_sum = self.strategy.forward_backward(batches, scale)
        return loss_sum, [time.perf_counter() - tm]

    def _clip_value(self, batches: list[dict]) -> float:
        """The step's clip value: ``--max-grad-norm``, or the sentiment policy's from the step's batches."""
        return self.cfg.max_grad_norm if self.clip is None else self.clip.value(batches)

    def _step_inputs(self, micro: list[tuple[dict, BatchCounts]]
                     ) -> tuple[list[dict], list[int], torch.Tensor, torch.Tensor]:
        """The step's batches on the device, their counts, the global label-token count and the loss scale
        (world size / global label tokens, so DDP's gradient average is that of the global mean loss)."""
        env = self.env
        counts = [sum(x) for x in zip(*(c for _, c in micro))]   # label tokens, tokens, rows, positions, Σ L²
        batches = [{k: to_device(v, env.device) if isinstance(v, torch.Tensor) else v for k, v in b.items()}
                   for b, _ in micro]
        label_tokens = all_reduce_sum_tensor([float(counts[0])], env)[0]   # a device tensor: no host read
        return batches, counts, label_tokens, (env.world_size / label_tokens).to(torch.float32)

    def _step_row(self, clip_value: float, stats: StepStats, t0: float, t_data: float, times: list[float],
                  t_opt: float) -> dict[str, Any]:
        """The step's host row: timings, learning rate, clip value, peak memory and the strategy's extras."""
        step_time = time.perf_counter() - t0
        mem, mem_kind = peak_memory(self.env.device)
        return {
            "type": "train", "step": self.step + 1, "epoch": self.epoch, "lr": self.strategy.current_lr(),
            "clip": clip_value, "step_time_s": step_time, "data_s": t_data, "fwd_bwd_s": sum(times), "optim_s": t_opt,
            # exposed communication, measurable with accumulation: the synced micro-step minus a no_sync one
            "comm_exposed_s": (times[-1] - sum(times[:-1]) / (len(times) - 1))
            if len(times) > 1 and self.env.distributed else None,
            "peak_mem_bytes": mem, "mem_kind": mem_kind, **stats.extra,
        }

    def _finish_steps(self, steps: list[tuple[dict[str, Any], "StepTensors"]], flops_tok: Callable[[float], float]
                      ) -> None:
        """Complete the rows of the log interval's steps: one all-reduce of a table with a row per step and the
        columns :data:`SUMMED` (losses, counts, the preemption flag), and one read of the device for them all."""
        env = self.env
        table = [[t.loss_sum, *map(float, t.counts), float(self.stop_flag())] for _, t in steps]
        flat = all_reduce_sum_tensor([v for r in table for v in r], env).reshape(len(steps), len(SUMMED)).tolist()
        sums = [dict(zip(SUMMED, r)) for r in flat]
        self.stop_agreed = self.stop_agreed or any(s["stop"] > 0 for s in sums)
        labels, norms = read_scalars([t.label_tokens for _, t in steps]), read_scalars([t.grad_norm for _, t in steps])
        for (row, tensors), s, label_count, norm in zip(steps, sums, labels, norms):
            tokens, samples, positions, squared = (s[k] / self.replication for k in SUMMED[1:5])
            predicted = label_count / self.replication   # positions whose logits the loss reads
            step_time = row["step_time_s"]
            model_flops = step_model_flops(tokens, squared, predicted, flops_tok, self.head_flops) / step_time
            row.update({"loss": s["loss_sum"] / label_count, "grad_norm": norm, "skipped": bool(tensors.skipped),
                        "tokens": int(tokens), "samples": int(samples), "padded_tokens": int(positions),
                        "tokens_per_s": tokens / step_time, "samples_per_s": samples / step_time,
                        "model_flops_per_s": model_flops,
                        **mfu_fields(model_flops, self.peak, env.world_size, self.mfu_note)})   # MFU, once

    def _check_length(self, start_time: float, pending: list[tuple[dict[str, Any], Any]], bar: Any) -> None:
        """A run auto sized from the data, held against ``--max-train-minutes`` at its measured pace (the slowest
        rank's): shortened, its lr schedule too, when it would run longer; said in the log and summary.json."""
        cfg = self.cfg
        if not (self.resolved.length_by_epochs and cfg.max_train_minutes > 0):
            return
        times = [r["step_time_s"] for r in [*self.history, *(row for row, _ in pending)][cfg.untimed_steps:]]
        step_s = all_reduce_max(sum(times) / len(times), self.env)
        elapsed = all_reduce_max(time.perf_counter() - start_time, self.env)
        length = capped_length(self.total_steps, self.step, elapsed, step_s, cfg.max_train_minutes)
        if length is None:
            return
        self.length_cut = {"planned_steps": self.total_steps, "steps": length, "measured_step_s": round(step_s, 4),
                           "max_train_minutes": cfg.max_train_minutes, "after_steps": self.step}
        set_schedule_length(self.strategy.scheduler, length)   # the cosine now ends at the new last step
        self.total_steps = bar.total = length
        bar.refresh()
        if self.env.is_main:
            log.warning("run shortened to %d of its %d steps (%.2f epochs): at the measured %.3f s/step it would "
                        "pass --max-train-minutes %g; its lr schedule ends there too (--max-steps or --epochs sets "
                        "the length)", length, self.length_cut["planned_steps"],
                        length / max(1, self.resolved.steps_per_epoch), step_s, cfg.max_train_minutes)

    # ------------------------------------------------------------------ evaluation
    def evaluate(self, final: bool = False) -> dict[str, Any]:
        """Held-out loss, candidate-scoring accuracy and, for nlu, scores by generation (``final``: every held-out
        row, + predictions.jsonl; a periodic evaluation reads the same sample each time). Every rank calls it."""
        cfg, env = self.cfg, self.env
        cap = cfg.final_eval_samples or None
        bar = self._final_evaluation_bar(cap) if final else None
        positions = cfg.micro_batch_size * cfg.seq_len   # candidate scoring: several records per forward
        try:
            out: dict[str, Any] = held_out_loss(self.strategy, self.eval_ds, self.collate, env, cfg.micro_batch_size,
                                                None if final else cfg.eval_batches, self.shard, max_examples=cap,
                                                bar=bar)
            if cfg.task == "nlu" and len(self.eval_records):
                scored = find(f"{SCORING}:evaluate_nlu_accuracy")(
                    self.strategy, self.tokenizer, self.eval_records, env, cap if final else cfg.eval_nlu_samples,
                    shard=self.shard, max_length=cfg.seq_len, labels=self.data_report.labels,
                    prompt_format=cfg.prompt_format, train_label_counts=self.data_report.train_label_counts,
                    batch_positions=positions, bar=bar)
                out.update(scored)
            if self.gen_eval is not None:
                predictions = self.out_dir / find(f"{GENERATION}:PREDICTIONS_FILE") if final else None
                out.update(self.gen_eval(self.strategy, self.tokenizer, env, self.shard, predictions, False,
                                         final=final, bar=bar, untrained=self.step == 0 and not final))
        finally:
            if bar is not None:
                bar.close()
        # which method made each figure: candidate scoring or generation (only task nlu scores)
        out["eval_methods"] = find(f"{TASK_SUMMARY}:eval_methods")(out) if cfg.task == "nlu" else {}
        return out

    def _final_evaluation_bar(self, cap: int | None) -> Any:
        """One bar over the whole final evaluation on rank 0, in this rank's held-out examples, with an ETA."""
        enabled = bool(self.cfg.progress) and self.env.is_main
        total = 0
        if enabled:
            index, count = self.shard
            total = shard_size(min(len(self.eval_ds), cap or len(self.eval_ds)), index, count)
            if self.cfg.task == "nlu" and len(self.eval_records):
                total += find(f"{SCORING}:scored_examples")(self.eval_records, self.data_report.labels, cap,
                                                            self.shard)
            if self.gen_eval is not None:
                total += shard_size(len(self.gen_eval.decoded_examples(final=True)), index, count)
        return make_progress(total, enabled, desc="eval", eta=True)

    # ------------------------------------------------------------------ after training
    def _finish_training(self, best: BestWeights, wall: float) -> dict[str, Any]:
        """The weights kept, the final evaluation over every held-out row, the summary (train/outcome.py)."""
        kept = keep_best_or_last(self, best)   # the best copy is put back when it beats the last weights
        final_eval = self.evaluate(final=True)
        self.metrics.write({"type": "eval", "step": self.step, **final_eval})
        summary = self.summary(final_eval, wall)
        verdict = (find(f"{VERDICT}:baseline_outcome")(summary, recommended_lr=self.resolved.recommended_lr)
                   if self.cfg.task == "nlu" else {"cleared": None})   # an LM run has no figure with a baseline
        summary.update(final_checkpoint=kept, baseline=verdict)   # why a run missed its baseline, how to retry
        if getattr(self.strategy, "replicated", False):
            summary["replica_checksums"] = replica_checksums(self.strategy.raw_model, self.env)
        for cb in self.callbacks:
            getattr(cb, "on_train_end", lambda run, s: None)(self, summary)
        return summary

    def startup_report(self) -> str:
        """HF Trainer's "Running training" block, one aligned line per setting: value and a few words of why."""
        cfg, env, report = self.cfg, self.env, self.data_report
        origin = model_origin(cfg.model)
        backend = f"{env.backend}, " if env.distributed else ""
        rows = [("strategy", f"{self.strategy.name} × {env.world_size} process(es), {backend}{env.device.type}", ""),
                ("model", f"{cfg.model}: {self.n_params:,} parameters", origin["text"] if cfg.verbose
                 else "random-init preset" if origin["kind"] == "preset" else f"real weights ({origin['kind']})"),
                ("data", f"{report.validation.kept:,} of {report.validation.total:,} rows of "
                         f"{Path(report.source).name} → {report.n_train_examples:,} train / "
                         f"{report.n_eval_examples:,} eval examples", "")]
        lora = self.lora_facts()
        if lora:
            rows.append(("LoRA", f"r={lora['r']}, {lora['trainable_params']:,} of {lora['params']:,} parameters "
                                 f"train", f"targets {','.join(lora['targets'])}"))
        cut = "; ".join(f"{k}: {c.text()}" for k, c in report.cuts.items() if c.text() != "nothing cut")
        rows.append(("lengths", f"train: {report.lengths['train'].text()}; {cut or 'nothing cut'}", ""))
        rows += self.resolved.rows(cfg.verbose)
        scope = evaluation_scope(cfg, len(self.eval_ds), self.eval_records, report.labels)
        rows.append(("evaluation", scope[0], ""))
        width = max(len(name) for name, _, _ in rows) + 2
        value_width = max((len(v) for _, v, w in rows if w and len(v) < 40), default=0) + 2
        lines = ["***** Running training *****"]
        for name, value, why in rows:
            value = f"{value:<{value_width}}" if why else value
            lines.append(f"  {name:<{width}}{value}{'  ' if why and not value.endswith('  ') else ''}{why}".rstrip())
        lines += [f"  note: {w}" for w in scope[1:]]
        if cfg.verbose:
            lines.append(f"  data in full: {report.summary()}")
        for warning in [*report.cut_warnings(), *report.warnings()]:
            log.warning(warning)   # inputs cut by more than half; labels that never occur, rows with no label
        return "\n".join(lines)

    def lora_facts(self) -> dict[str, Any] | None:
        """What a LoRA run trains (rank, targets, trainable share); None for full fine-tuning."""
        if self.cfg.peft == "none":
            return None
        return find(f"{LORA}:lora_facts")(self.cfg, self.n_trainable, self.n_params)

    def summary(self, final_eval: dict[str, float], wall: float) -> dict[str, Any]:
        """``summary.json``: what ran, what it measured (steady-phase totals at the slowest rank's pace), its config."""
        cfg, env = self.cfg, self.env
        train_rows = [r for r in self.history if r.get("type") == "train"]
        throughput = slowest_rank_throughput(train_rows, env, cfg.untimed_steps)   # a collective: every rank
        steady = train_rows[cfg.untimed_steps:]
        flops = (sum(r["model_flops_per_s"] * r["step_time_s"] for r in steady) / throughput["steady_wall_s"]
                 if throughput["steady_wall_s"] > 0 else float("nan"))
        return {
            "strategy": self.strategy.name, "model": cfg.model, "params": self.n_params,
            "trainable_params": self.n_trainable, "peft": cfg.peft, "model_origin": model_origin(cfg.model),
            "recipe": self.resolved.to_dict(), "length_cut": self.length_cut,
            "lora": self.lora_facts(),
            "world_size": env.world_size, "global_batch": self.global_batch(), "data": self.data_report.facts(),
            "grad_accum": self.grad_accum, "steps": self.step, "seq_len": cfg.seq_len, "packing": self.packed,
            "fill_rate": fill_rate_of(train_rows), "steps_per_epoch": self.sampler.steps_per_epoch,
            "first_loss": train_rows[0]["loss"] if train_rows else None,
            "final_loss": train_rows[-1]["loss"] if train_rows else None,
            **final_eval, **throughput, "time_split": time_split(train_rows, cfg.untimed_steps),
            "model_flops_per_s": flops, **mfu_fields(flops, self.peak, env.world_size, self.mfu_note),
            "peak_flops": self.peak, "peak_mem_bytes": max((r["peak_mem_bytes"] for r in train_rows), default=0),
            "wall_s": wall, "output_dir": str(self.out_dir.resolve()),
            "model_dir": str((self.out_dir / "final").resolve()) if cfg.save_model else None,
            "config": cfg.to_dict(),
        }

    def save(self) -> None:
        """``final/`` (``save_pretrained``; with LoRA also ``adapter/``) and the task file ecomkit.predict reads."""
        cfg, strategy = self.cfg, self.strategy
        if not cfg.save_model:
            return
        match_tokenizer(strategy.raw_model, self.tokenizer)  # the tokenizer's pad/bos/eos, use_cache on
        if cfg.peft != "none":  # <out>/adapter (PEFT format) and <out>/final (merged)
            strategy.save_peft(str(self.out_dir), self.tokenizer)
        else:
            strategy.save_pretrained(str(self.out_dir / "final"), self.tokenizer)
        if self.env.is_main:   # the prompt format and labels it learned, for evaluation and ecomkit.predict
            report = self.data_report
            write_task_file(self.out_dir / "final", prompt_format=cfg.prompt_format, task=cfg.task,
                            labels=report.labels, kinds=list(report.examples_per_kind), seq_len=int(cfg.seq_len),
                            gen_max_new_tokens=cfg.gen_max_new_tokens if cfg.task == "nlu" else None,
                            reading={k: getattr(cfg, k) for k in ("column_map", "label_map", "span_end")},
                            train_label_counts=report.train_label_counts,
                            train_spans=report.train_spans if cfg.task == "nlu" else None)

    def close(self) -> None:
        if getattr(self, "metrics", None) is not None:   # None when build() failed before the writer
            self.metrics.close()
        if getattr(self, "strategy", None) is not None:
            self.strategy.close()
        self.strategy = None
        self.loader = None


# ---------------------------------------------------------------------- the step's parts
@dataclass
class StepTensors:
    """One step's values not yet read: device tensors, or numbers a strategy already had on the host.

    Why: ``float(t)`` of a CUDA tensor makes the host wait for the GPU; the log interval reads them all at once."""

    loss_sum: torch.Tensor | float      # this rank's token-loss sum (all-reduced at the read)
    label_tokens: torch.Tensor | float  # the global batch's label tokens (already all-reduced: the loss scale's)
    grad_norm: torch.Tensor | float     # the global gradient norm, as the strategy computed it
    skipped: Any                         # fp16: the loss scaler skipped the step
    counts: Sequence[int]                # this rank's tokens, rows, positions, Σ L² (host numbers)


def read_scalars(values: Sequence[torch.Tensor | float]) -> list[float]:
    """Python floats of 0-d tensors and numbers, reading the device once (one stack, one ``tolist``)."""
    tensors = [v for v in values if isinstance(v, torch.Tensor)]
    if not tensors:
        return [float(v) for v in values]
    device = tensors[0].device
    read = iter(torch.stack([v.detach().reshape(()).to(device, torch.float64) for v in tensors]).tolist())
    return [next(read) if isinstance(v, torch.Tensor) else float(v) for v in values]


class Counted:
    """A collate function that also counts its batch on the host: ``(batch, BatchCounts)``.
    Why: the step's counts, its padding (the mask plan) and its labeled positions then cost no device read."""

    def __init__(self, collate: Callable, count: Callable):
        self.collate, self.count = collate, count

    def __call__(self, features):
        batch, counts = self.collate(features), self.count(features)
        if "document_ids" not in batch:   # whether the rows were padded: the model's mask plan, known without a read
            batch["has_padding"] = counts.tokens < counts.positions
        batch["label_count"] = counts.label_tokens
        return batch, counts


def training_loader(train_ds, lengths, cfg: TrainConfig, shard: tuple[int, int], grad_accum: int, packed: bool,
                    pad_id: int, multiple: int | None, pin_memory: bool = False) -> tuple[Any, DataLoader]:
    """``(sampler, loader)`` of this rank's micro-batches, each ``(batch, counts)`` (:class:`Counted`): packed
    sequences of ``cfg.seq_len`` tokens, or bucketed rows padded to a ``multiple``; ``shard``: (index, count)."""
    if packed:   # one shape every step: micro_batch_size sequences of exactly seq_len tokens
        sampler = find(f"{PACKING}:PackedBatchSampler")(lengths, cfg.seq_len, cfg.micro_batch_size, grad_accum,
                                                        num_replicas=shard[1], rank=shard[0], seed=cfg.seed)
        collate = Counted(functools.partial(find(f"{PACKING}:packed_collate"), seq_len=cfg.seq_len, pad_id=pad_id),
                          functools.partial(find(f"{PACKING}:sequence_counts"), seq_len=cfg.seq_len))
        return sampler, DataLoader(find(f"{PACKING}:RowGroups")(train_ds), batch_sampler=sampler, collate_fn=collate,
                                   pin_memory=pin_memory)
    sampler = find(f"{SAMPLER}:DistributedBatchSampler")(lengths, cfg.micro_batch_size, grad_accum, shard[1], shard[0],
                                                         cfg.seed, bucketed=cfg.bucketed)
    collate = Counted(functools.partial(pad_collate, pad_id=pad_id, pad_to_multiple_of=multiple),
                      functools.partial(row_counts, pad_to_multiple_of=multiple))
    return sampler, DataLoader(train_ds, batch_sampler=sampler, collate_fn=collate, pin_memory=pin_memory)


# ---------------------------------------------------------------------- what an evaluation reads
def shard_size(n: int, index: int, count: int) -> int:
    start, end = shard_range(n, index, count)
    return end - start


def evaluation_scope(cfg: TrainConfig, n_examples: int, records: Iterable[dict[str, Any]],
                     labels: dict[str, Any]) -> list[str]:
    """What the periodic evaluations (the same sample each time) and the final one (every held-out row) read.

    Why say it: a figure on 32 of 1,343 rows is not one to quote; the start-up report shows this line."""
    final = f"the first {cfg.final_eval_samples:,} of each" if cfg.final_eval_samples else "every held-out row"
    lines = [f"periodic: up to {cfg.eval_batches} micro-batches per rank for the loss"
             + (f", {cfg.eval_nlu_samples} records per target" if cfg.task == "nlu" else "")
             + f"; final: {final} ({n_examples:,} examples; --final-eval-samples caps it)"]
    if cfg.task == "nlu" and not find(f"{SCORING}:scored_targets")(records, labels):
        lines.append("no held-out record has a classification label (category or sentiment with two or more "
                     "labels), so candidate scoring does not run and --eval-nlu-samples has no effect; "
                     "extraction is scored by generation (--gen-eval-samples)")
    return lines


# ---------------------------------------------------------------------- entry points
def train_in_session(cfg: TrainConfig, env: DistEnv, callbacks: Iterable[Any] = (),
                     extra_summary: Any = None) -> dict[str, Any]:
    """Build, train, evaluate and save one run inside an existing process group (several runs may share it).
    ``extra_summary(run) -> dict`` may add fields to the summary before it is written."""
    run = TrainingRun(cfg, env, list(callbacks)).build()
    try:
        summary = run.fit()
        if extra_summary is not None:
            summary.update(extra_summary(run))
        run.save()
        if env.is_main:
            run.cfg.save(run.out_dir / "config.json")
        run.metrics.finish(summary)
    finally:
        run.close()
        del run
    return summary


def run_callbacks(cfg: TrainConfig, callbacks: Iterable[Any] = ()) -> list[Any]:
    """``callbacks`` plus the ones the config asks for: ``--dcp-dir`` (04), checkpoints, health, preemption (07)."""
    out = add_fault_tolerance_callbacks(cfg, [*callbacks, *strategy_callbacks(cfg)])
    return add_preemption_callbacks(cfg, out)


def validate_before_launch(cfg: TrainConfig) -> None:
    """``cfg.validate`` for ``$WORLD_SIZE`` processes, with the preset's shape when the model is a preset, before
    the process group exists (a model from a directory or the hub is checked by :meth:`TrainingRun.build`)."""
    preset = PRESETS.get(cfg.model)
    cfg.validate(n_head=preset.n_head if preset else None, n_layer=preset.n_layer if preset else None)


def run_training(cfg: TrainConfig, callbacks: Iterable[Any] = ()) -> dict[str, Any]:
    """Set up the process group, train, evaluate, save, tear down. Returns the summary (all ranks)."""
    validate_before_launch(cfg)
    callbacks = run_callbacks(cfg, callbacks)
    with distributed_session(timeout_s=cfg.timeout_s, seed=cfg.seed) as env:
        return train_in_session(cfg, env, callbacks)
