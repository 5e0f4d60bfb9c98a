"""The one training loop every chapter reuses; only the strategy changes.

Read it top to bottom like nanoGPT's ``train.py``: set-up, data, model,
strategy, loop, eval, save. What differs between DDP, ZeRO, FSDP2, TP, PP and
Accelerate lives in ``ecomkit.parallel`` behind :class:`~ecomkit.parallel.base.Strategy`.

Callbacks (objects with any of ``on_train_start(run)``, ``on_step_end(run, row)``,
``on_train_end(run, summary)``) add checkpointing, health monitoring and
fault handling without touching the loop.
"""

from __future__ import annotations

import functools
import math
import os
import time
from pathlib import Path
from typing import Any, Callable, Iterable, Iterator, Sequence

import datasets
import torch
import torch.distributed as dist

from ecomkit.config import TrainConfig
from ecomkit.config.recipe import resolve_global_batch
from ecomkit.config.vocabulary import AUTO
from ecomkit.data import build_datasets, lengths_array, pad_collate
from ecomkit.data.tokenize import BatchCounts
from ecomkit.data.formats import parse_labels
from ecomkit.dist import (DistEnv, all_reduce_sum_tensor, distributed_session, log, replica_checksums,
                          restart_attempt, to_device)
from ecomkit.envcheck.matmul import roofline_fields, run_peak
from ecomkit.errors import ConfigError
from ecomkit.faults.callbacks import add_fault_tolerance_callbacks
from ecomkit.hardware import device_peak_flops, mfu_fields
from ecomkit.metrics import MetricsWriter, peak_memory, step_model_flops
from ecomkit.models.bloom import PRESETS, ModelSource, flops_per_token, model_length_limit
from ecomkit.models.lora import apply_peft, trainable_parameter_count
from ecomkit.models.tokenizer import get_tokenizer
from ecomkit.parallel import build_strategy
from ecomkit.parallel.base import StepStats
from ecomkit.parallel.mixed import sharded_model_callbacks
from ecomkit.train.clip import ClipPolicy
from ecomkit.train.autoprec import resolve_attention, resolve_loss_kernel, resolve_precision
from ecomkit.train.batches import log_data_choices, resolve_data_settings, training_loader
from ecomkit.train.best import BestWeights, keep_best_or_last
from ecomkit.train.fast_paths import install_fast_paths
from ecomkit.train.gen_eval import evaluator_for_run
from ecomkit.train.held_out import evaluate_held_out, log_evaluation_scope
from ecomkit.train.outcome import baseline_outcome, launch_command
from ecomkit.train.preempt import add_preemption_callbacks
from ecomkit.train.progress import make_progress
from ecomkit.train.run_recipe import precision_value
from ecomkit.train.run_report import resolve_recipe, run_summary, save_run, startup_banner
from ecomkit.train.shapes import length_multiple
from ecomkit.train.step_values import StepTensors, read_scalars


def tokenizer_cache_dir() -> Path:
    return Path(os.environ.get("ECOMKIT_CACHE", Path.home() / ".cache" / "ecomkit"))


class TrainingRun:
    """State of one run. Attributes are public so callbacks (checkpointing) can read and restore them."""

    def __init__(self, cfg: TrainConfig, env: DistEnv, callbacks: Sequence[Any] = ()):
        self.cfg, self.env, self.callbacks = cfg, env, list(callbacks)
        self.grad_accum = cfg.resolve_grad_accum(env.world_size)
        self.step = 0                 # optimizer steps completed
        self.epoch = 0
        self.history: list[dict[str, Any]] = []
        self.out_dir = Path(cfg.output_dir)
        self.shard = (env.rank, env.world_size)  # replaced by strategy.data_shard() in build()
        self.replication = 1
        self.stop_flag: Callable[[], bool] = lambda: False  # set by train/preempt.py: this rank was signalled
        self.stop_agreed = False      # some rank was: every rank stops after this step (see _finish_steps)

    # ------------------------------------------------------------------ build
    def build(self) -> "TrainingRun":
        """Build every part of the run; a failure part-way releases what was made (DDP's shm segment, groups)."""
        try:
            return self._build()
        except BaseException:
            self.close()
            raise

    def _build(self) -> "TrainingRun":
        # The same checks as parse_config and run_training, for runs started inside a session (sweeps, notebooks).
        self.cfg.validate(self.env.world_size)
        precision_given, reasons = self.cfg.precision, {}
        resolve_precision(self.cfg, self.env, reasons)  # --precision auto: bf16 where the device multiplies faster
        self.strategy = build_strategy(self.cfg, self.env)
        self.shard = self.strategy.data_shard()                  # (index, count): dp coordinate for TP/PP
        self.replication = self.env.world_size // self.shard[1]  # ranks that see the same batch
        # the global batch: 32 rows by accumulation for --task nlu on a data file (config/recipe.py)
        self.batch_choice = resolve_global_batch(self.cfg.global_batch_size, self.cfg.grad_accum,
                                                 self.cfg.micro_batch_size, self.shard[1], self.cfg.task,
                                                 self.cfg.data != "synthetic",
                                                 length_auto=self.cfg.max_steps == AUTO and not self.cfg.epochs)
        if not self.batch_choice.given and self.batch_choice.value != self.cfg.micro_batch_size * self.shard[1]:
            self.cfg.global_batch_size = self.batch_choice.value
        self.grad_accum = self.cfg.resolve_grad_accum(self.shard[1])
        self.tokenizer = self.build_tokenizer()
        self.build_data()                      # --seq-len, --packing and --gen-max-new-tokens auto: from the data
        resolve_attention(self.cfg, self.env)  # --attn auto: by device, precision and length (attention_rule)
        resolve_loss_kernel(self.cfg, self.env, self.strategy.supports_chunked_loss)  # --loss-kernel auto
        self.gen_eval = evaluator_for_run(self.cfg, self.data_report)  # evaluation by generation (nlu)
        log_evaluation_scope(self)  # periodic evaluations sample, the final one reads every held-out row
        # The strategy decides how the model is materialised: whole on every rank, or only this rank's part
        # of a local checkpoint (ZeRO-3 under deepspeed.zero.Init, FSDP2/TP on the meta device, loaded in setup).
        model = self.strategy.build_model(ModelSource(self.cfg.model, vocab_size=len(self.tokenizer), seed=self.cfg.seed))
        # A model loaded from a directory or the hub is only known now: tp must divide its heads, pp its blocks.
        self.cfg.validate(self.env.world_size, n_head=model.config.n_head, n_layer=model.config.n_layer)
        model = apply_peft(model, self.cfg)  # LoRA (peft): after the model is built, before the strategy wraps it
        # attention, fused GeLU and loss kernels, the chunked loss, --compile: in that order (train/fast_paths.py)
        install_fast_paths(model, self.cfg, self.env.device, self.strategy, self.packed)
        self.n_params = self.strategy.parameter_count(model)
        self.n_trainable = trainable_parameter_count(model)
        self.model_config = model.config
        # --lr, --warmup-steps and --max-steps auto: by what is trained and the data (config/recipe.py)
        self.recipe, self.recommended_lr = resolve_recipe(self, precision_value(precision_given, self.cfg.precision,
                                                                                reasons.get("precision")))
        if self.cfg.max_steps > 0:
            self.total_steps = self.cfg.max_steps
        else:
            self.total_steps = max(1, math.ceil(self.cfg.epochs * self.sampler.steps_per_epoch))
        self.strategy.setup(model, self.total_steps)
        self.clip = ClipPolicy(self.cfg.clip_policy, self.cfg.max_grad_norm, self.env)
        self.metrics = MetricsWriter(self.out_dir, self.env.is_main, append=self._resuming(),
                                     report_to=self.cfg.report_to, hparams=self.cfg.to_dict())  # --report-to
        return self

    def _resuming(self) -> bool:
        return any(getattr(cb, "resuming", False) for cb in self.callbacks)

    def build_tokenizer(self):
        """Rank 0 trains/loads first (it may write the cache); the others load after a barrier."""
        cache = tokenizer_cache_dir()
        if self.env.distributed and not self.env.is_main:
            dist.barrier()
            return get_tokenizer(self.cfg.tokenizer, cache)
        tok = get_tokenizer(self.cfg.tokenizer, cache)
        if self.env.distributed:
            dist.barrier()
        return tok

    def build_data(self) -> None:
        """Datasets, sampler and loader; public because HF Trainer (ecomkit.train.hf_trainer) trains on the same data."""
        datasets.disable_progress_bars()  # progress bars only add noise to logs
        cfg = self.cfg
        limit = model_length_limit(cfg.model)   # every rank: an unknown --model fails here, each with its message
        # Rank 0 loads, validates and tokenises into the Arrow cache; the others then map the same tables.
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
        lengths = lengths_array(self.train_ds)
        # --seq-len, --gen-max-new-tokens and --packing auto, decided from the data (train/batches.py)
        self.packed, self.packing_reason, self.gen_budget_reason = resolve_data_settings(
            cfg, self.data_report, lengths, self.env.device.type)
        pad_id = self.tokenizer.pad_token_id if self.tokenizer.pad_token_id is not None else 0
        multiple = length_multiple(cfg.precision, self.env.device)  # bf16 on CPU: bounded shapes (train/shapes.py)
        self.collate = lambda feats: pad_collate(feats, pad_id, multiple)   # unpacked: evaluation, HF Trainer
        self.sampler, self.loader = training_loader(self.train_ds, lengths, cfg, self.shard, self.grad_accum,
                                                    self.packed, pad_id, multiple, self.env.device.type == "cuda")

    # ------------------------------------------------------------------ loop
    def global_batch(self) -> int:
        return self.cfg.micro_batch_size * self.grad_accum * self.shard[1]

    def _micro_batches(self) -> Iterator[list[dict]]:
        """Yield the micro-batches of one optimizer step, crossing epoch boundaries as needed."""
        while True:
            self.sampler.set_epoch(self.epoch)
            group: list[dict] = []
            for batch in self.loader:
                group.append(batch)
                if len(group) == self.grad_accum:
                    yield group
                    group = []
            self.epoch += 1

    def fit(self) -> dict[str, Any]:
        cfg, env = self.cfg, self.env
        for cb in self.callbacks:
            getattr(cb, "on_train_start", lambda run: None)(self)
        if env.is_main:
            log.info(startup_banner(self))
            log_data_choices(self)   # lengths, cuts, --seq-len, --packing and the generation budget, and why
        # FLOPs per token given the batch's attention length (metrics.attention_length: real tokens, not cfg.seq_len)
        flops_tok = functools.partial(flops_per_token, self.n_params, self.model_config.n_layer,
                                      self.model_config.hidden_size)
        # the LM head's 6·V·h per position, counted only where the loss reads it (metrics.step_model_flops)
        self.head_flops = 6.0 * self.model_config.vocab_size * self.model_config.hidden_size
        peak = device_peak_flops(env.device, cfg.precision)
        self.roofline = run_peak(env.device, cfg.precision)  # (peak FLOP/s, source): measured GEMM on CPU
        bar = make_progress(self.total_steps, cfg.progress and env.is_main)
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
            eval_due = bool(cfg.eval_interval) and self.step % cfg.eval_interval == 0 and self.step < self.total_steps
            if eval_due or self.step % cfg.log_interval == 0 or self.step == self.total_steps:
                # the log interval's one read of the device: losses, counts and norms of its steps, and the stop flag
                self._finish_steps(pending, flops_tok, peak)
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
        kept = keep_best_or_last(self, best)   # the best copy is put back when it beats the last weights
        final_eval = self.evaluate(final=True)
        self.metrics.write({"type": "eval", "step": self.step, **final_eval})
        summary = run_summary(self, final_eval, time.perf_counter() - start_time)
        summary.update(final_checkpoint=kept,   # why a run missed its baseline, and the command to retry
                       baseline=baseline_outcome(summary, launch_command(), self.recommended_lr))
        if getattr(self.strategy, "replicated", False):
            summary["replica_checksums"] = replica_checksums(self.strategy.raw_model, self.env)
        for cb in self.callbacks:
            getattr(cb, "on_train_end", lambda run, s: None)(self, summary)
        return summary

    def _maybe_inject_fault(self) -> None:
        """``--fail-at-step K --fail-rank R``: rank R dies at step K, once (not after a torchrun restart)."""
        f = self.cfg
        if (f.fail_at_step >= 0 and self.step == f.fail_at_step and self.env.rank == f.fail_rank
                and restart_attempt() == 0):
            print(f"[rank {self.env.rank}] fault injection: exiting abruptly at step {self.step}", flush=True)
            os._exit(13)

    def _train_step(self, micro: list[tuple[dict, BatchCounts]], started: float | None = None
                    ) -> tuple[dict[str, Any], StepTensors]:
        """One optimizer step, with no read of the device: its host row, and its device values for later.

        It reads as chapter 02 teaches DDP: for each micro-batch, forward and loss, then backward (DDP
        all-reduces the gradient buckets during it, except under ``no_sync`` on accumulation micro-steps), then
        clip and step. The rest sits in named helpers: moving the batches and the loss scale
        (:meth:`_step_inputs`), the pipeline branch (:meth:`_pipeline_forward_backward`), the clip policy
        (:meth:`_clip_value`) and the timings (:meth:`_step_row`). ``started`` is when fetching ``micro`` began
        (data time counts in the step); :meth:`_finish_steps` reads the device values at the log interval.
        """
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
        clip_value = self._clip_value(batches)
        tc = time.perf_counter()
        stats = strategy.clip_and_step(clip_value)   # clip the global gradient norm, then the optimizer step
        row = self._step_row(clip_value, stats, t0, t_data, times, time.perf_counter() - tc)
        return row, StepTensors(loss_sum, label_tokens, stats.grad_norm, stats.skipped, counts[1:])

    def _step_inputs(self, micro: list[tuple[dict, BatchCounts]]
                     ) -> tuple[list[dict], list[int], torch.Tensor, torch.Tensor]:
        """The step's batches on the device, their counts, the global label-token count and the loss scale.

        Each micro-batch's loss is a sum over its label tokens, scaled by world size / global label tokens:
        DDP's gradient *average* is then the gradient of the global batch's mean loss, for any number of
        processes or accumulation steps. Summed over all ranks, counts include each batch once per rank that
        saw it (TP/PP replicas see the same batch); the scale world/label_tokens = shards/N stays exact.
        """
        env = self.env
        counts = [sum(x) for x in zip(*(c for _, c in micro))]   # label tokens, tokens, rows, positions, Σ L²
        batches = [{k: to_device(v, env.device) if isinstance(v, torch.Tensor) else v for k, v in b.items()}
                   for b, _ in micro]
        label_tokens = all_reduce_sum_tensor([float(counts[0])], env)[0]   # a device tensor: no host read
        return batches, counts, label_tokens, (env.world_size / label_tokens).to(torch.float32)

    def _pipeline_forward_backward(self, batches: list[dict], scale: torch.Tensor
                                   ) -> tuple[torch.Tensor, list[float]]:
        """A pipeline strategy's whole step (its schedule, e.g. 1F1B): the loss sum and its one timing."""
        tm = time.perf_counter()
        loss_sum = self.strategy.forward_backward(batches, scale)
        return loss_sum, [time.perf_counter() - tm]

    def _clip_value(self, batches: list[dict]) -> float:
        """The clip policy's max gradient norm for this step (fixed, or the sentiment rule of chapter 02)."""
        for batch in batches:
            self.clip.observe(batch)
        return self.clip.value()

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

    def _finish_steps(self, steps: list[tuple[dict[str, Any], StepTensors]], flops_tok: Callable[[float], float],
                      peak: float | None) -> None:
        """Complete the rows of the log interval's steps: one all-reduce of their losses and counts with the
        preemption flag, and one read of the device for all of them."""
        env, n = self.env, len(steps)
        values = [t.loss_sum for _, t in steps] + [float(c) for _, t in steps for c in t.counts]
        *sums, stops = all_reduce_sum_tensor([*values, float(self.stop_flag())], env).tolist()
        self.stop_agreed = self.stop_agreed or stops > 0
        labels, norms = read_scalars([t.label_tokens for _, t in steps]), read_scalars([t.grad_norm for _, t in steps])
        for k, (row, tensors) in enumerate(steps):
            input_tokens, samples, padded, squared = (x / self.replication for x in sums[n + 4 * k:n + 4 * k + 4])
            predicted = labels[k] / self.replication   # positions whose logits the loss reads
            step_time = row["step_time_s"]
            model_flops = step_model_flops(input_tokens, squared, predicted, flops_tok, self.head_flops) / step_time
            row.update({"loss": sums[k] / labels[k], "grad_norm": norms[k], "skipped": bool(tensors.skipped),
                        "tokens": int(input_tokens), "samples": int(samples), "padded_tokens": int(padded),
                        "tokens_per_s": input_tokens / step_time, "samples_per_s": samples / step_time,
                        **mfu_fields(model_flops, peak, env.world_size, env.device, self.cfg.precision),
                        **roofline_fields(model_flops, *self.roofline, env.world_size, env.device)})

    # ------------------------------------------------------------------ eval & end
    def evaluate(self, final: bool = False) -> dict[str, Any]:
        """Held-out loss, candidate-scoring accuracy and, for nlu, scores by generation (``final``: every
        held-out row, + predictions.jsonl; train/held_out.py)."""
        return evaluate_held_out(self, final)

    def close(self) -> None:
        if getattr(self, "metrics", None) is not None:   # None when build() failed before the writer
            self.metrics.close()
        if getattr(self, "strategy", None) is not None:
            self.strategy.close()
        self.strategy = None
        self.loader = None


def train_in_session(cfg: TrainConfig, env: DistEnv, callbacks: Iterable[Any] = (),
                     extra_summary: Any = None) -> dict[str, Any]:
    """Build, train, evaluate and save one run inside an existing process group.

    ``extra_summary(run) -> dict`` may add fields to the summary before it is
    written (chapter 05 adds byte totals). Several runs can share one process
    group this way (chapter 05 trains a dozen methods in one torchrun launch).
    """
    run = TrainingRun(cfg, env, list(callbacks)).build()
    try:
        summary = run.fit()
        if extra_summary is not None:
            summary.update(extra_summary(run))
        save_run(run)
        if env.is_main:
            cfg.save(run.out_dir / "config.json")
        run.metrics.finish(summary)
    finally:
        run.close()
        del run
    return summary


def run_callbacks(cfg: TrainConfig, callbacks: Iterable[Any] = ()) -> list[Any]:
    """``callbacks`` plus the ones the config asks for: ``--dcp-dir`` (04), checkpoints, health, preemption (07)."""
    out = add_fault_tolerance_callbacks(cfg, [*callbacks, *sharded_model_callbacks(cfg)])
    return add_preemption_callbacks(cfg, out)


def validate_before_launch(cfg: TrainConfig) -> None:
    """``cfg.validate`` for ``$WORLD_SIZE`` processes, with the preset's shape when the model is a preset.

    Runs before the process group exists, so "tp=3 does not divide the 4
    heads of model 'tiny'" costs no start-up; a model from a directory or the
    hub is checked by :meth:`TrainingRun.build` once it is loaded.
    """
    preset = PRESETS.get(cfg.model)
    cfg.validate(n_head=preset.n_head if preset else None, n_layer=preset.n_layer if preset else None)


def run_training(cfg: TrainConfig, callbacks: Iterable[Any] = ()) -> dict[str, Any]:
    """Set up the process group, train, evaluate, save, tear down. Returns the summary (all ranks)."""
    validate_before_launch(cfg)
    callbacks = run_callbacks(cfg, callbacks)
    with distributed_session(timeout_s=cfg.timeout_s, seed=cfg.seed) as env:
        return train_in_session(cfg, env, callbacks)
