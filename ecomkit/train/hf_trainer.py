"""The same job through Hugging Face ``Trainer``, for a like-for-like comparison.

Used by chapter 02 (ecomkit's loop vs Trainer: throughput and loss) and by
chapter 03 (``TrainingArguments(deepspeed=<generated dict>)``). Model, data,
tokenizer, batch arithmetic, optimizer hyper-parameters and schedule come
from the same :class:`~ecomkit.config.TrainConfig`.

CPU trap: under torchrun on a machine without GPUs, ``TrainingArguments``
must get ``use_cpu=True``, otherwise Trainer believes the world size is 1 and
trains independent copies (see the shared CPU notes, trap 5).
"""

from __future__ import annotations

import time
from typing import Any

import torch
from transformers import Trainer, TrainerCallback, TrainingArguments
from transformers.trainer_callback import PrinterCallback

from ecomkit.config import TrainConfig
from ecomkit.dist import DistEnv, distributed_session
from ecomkit.metrics import MetricsWriter
from ecomkit.models.bloom import count_parameters, load_model
from ecomkit.parallel.zero.env import ensure_deepspeed_env
from ecomkit.train.loop import TrainingRun, validate_before_launch


class MetricsCallback(TrainerCallback):
    """Write Trainer's per-step logs into ecomkit's metrics.jsonl format (rank 0)."""

    def __init__(self, writer, samples_per_step: int):
        self.writer, self.samples_per_step = writer, samples_per_step
        self._t = None
        self.rows: list[dict[str, Any]] = []

    def on_step_begin(self, args, state, control, **kw):
        self._t = time.perf_counter()

    def on_step_end(self, args, state, control, **kw):
        self._last_dt = time.perf_counter() - self._t

    def on_log(self, args, state, control, logs=None, **kw):
        if not logs or "loss" not in logs:
            return
        dt = getattr(self, "_last_dt", float("nan"))
        # note: Trainer logs rank 0's loss (not the global mean that ecomkit logs)
        row = {"type": "train", "step": state.global_step, "loss": float(logs["loss"]),
               "lr": float(logs.get("learning_rate", float("nan"))), "grad_norm": float(logs.get("grad_norm", float("nan"))),
               "step_time_s": dt, "samples_per_s": self.samples_per_step / dt if dt else None}
        self.rows.append(row)
        self.writer.write(row)
        if self.writer.enabled and (state.global_step % max(1, state.max_steps // 10) == 0):
            print(f"hf-trainer {state.global_step}/{state.max_steps} loss={row['loss']:.4f}", flush=True)


def training_arguments(cfg: TrainConfig, env: DistEnv, grad_accum: int,
                       deepspeed: dict | None = None) -> TrainingArguments:
    """TrainingArguments equivalent to ``cfg`` (same batch, lr schedule, clipping, precision)."""
    if deepspeed is not None:
        ensure_deepspeed_env()  # TrainingArguments imports deepspeed when given a DeepSpeed dict
    return TrainingArguments(
        output_dir=str(cfg.output_dir),
        per_device_train_batch_size=cfg.micro_batch_size,
        gradient_accumulation_steps=grad_accum,
        max_steps=cfg.max_steps,
        learning_rate=cfg.lr,
        weight_decay=cfg.weight_decay,
        adam_beta1=cfg.beta1, adam_beta2=cfg.beta2, adam_epsilon=1e-8,
        max_grad_norm=cfg.max_grad_norm,
        warmup_steps=cfg.warmup_steps,
        lr_scheduler_type="cosine_with_min_lr",
        lr_scheduler_kwargs={"min_lr_rate": cfg.min_lr_ratio},
        optim="adamw_torch",
        bf16=cfg.precision == "bf16", fp16=cfg.precision == "fp16",
        use_cpu=env.device.type == "cpu",
        logging_steps=1, report_to=[], save_strategy="no", eval_strategy="no",
        disable_tqdm=True,  # progress comes from MetricsCallback's lines, like ecomkit's loop
        ddp_bucket_cap_mb=int(cfg.bucket_cap_mb) if deepspeed is None else None,
        ddp_find_unused_parameters=False,  # Trainer's default re-traverses the graph every step
        remove_unused_columns=False,
        seed=cfg.seed, data_seed=cfg.seed,
        deepspeed=deepspeed,
    )


class _ColumnsForModel:
    """Collate with ecomkit's padding, then keep only what BLOOM's forward takes."""

    def __init__(self, collate):
        self.collate = collate

    def __call__(self, features):
        batch = self.collate(features)
        return {k: batch[k] for k in ("input_ids", "attention_mask", "labels")}


def run_hf_trainer(cfg: TrainConfig, deepspeed: dict | None = None) -> dict[str, Any]:
    """Train with HF Trainer on ecomkit's model and data; returns a summary like ``run_training``."""
    validate_before_launch(cfg)
    with distributed_session(timeout_s=cfg.timeout_s, seed=cfg.seed) as env:
        run = TrainingRun(cfg, env)
        run.tokenizer = run.build_tokenizer()
        run.build_data()
        model = load_model(cfg.model, vocab_size=len(run.tokenizer), device=env.device, seed=cfg.seed)
        writer = MetricsWriter(cfg.output_dir, env.is_main)
        args = training_arguments(cfg, env, run.grad_accum, deepspeed)
        cb = MetricsCallback(writer, run.global_batch())
        train_ds = run.train_ds.remove_columns([c for c in run.train_ds.column_names if c not in ("input_ids", "labels")])
        trainer = Trainer(model=model, args=args, train_dataset=train_ds,
                          data_collator=_ColumnsForModel(run.collate), callbacks=[cb])
        trainer.remove_callback(PrinterCallback)  # it prints every log dict; our metrics file has them
        t0 = time.perf_counter()
        trainer.train()
        wall = time.perf_counter() - t0
        steady = cb.rows[1:] or cb.rows
        summary = {
            "strategy": "hf-trainer" + ("+deepspeed" if deepspeed else ""), "model": cfg.model,
            "params": count_parameters(model), "world_size": env.world_size, "global_batch": run.global_batch(),
            "steps": trainer.state.global_step,
            "first_loss": cb.rows[0]["loss"] if cb.rows else None, "final_loss": cb.rows[-1]["loss"] if cb.rows else None,
            "samples_per_s": sum(r["samples_per_s"] for r in steady) / max(len(steady), 1),
            "step_time_s": sum(r["step_time_s"] for r in steady) / max(len(steady), 1),
            "wall_s": wall, "output_dir": str(cfg.output_dir),
        }
        writer.finish(summary)
        del trainer, model, cb
        torch.cuda.empty_cache() if torch.cuda.is_available() else None
    return summary
