"""The same job through Hugging Face ``Trainer``, for a like-for-like comparison (chapters 02 and 03).

Model, data, batch, optimizer and schedule come from the same :class:`~ecomkit.config.TrainConfig`; Trainer groups
by length by default (``sampling="random"`` measures its default), and is measured as ecomkit's loop is. CPU trap:
under torchrun without GPUs ``TrainingArguments`` needs ``use_cpu=True``, or Trainer trains independent copies.
"""

from __future__ import annotations

import time
from typing import Any

import torch
from transformers import Trainer, TrainerCallback, TrainingArguments
from transformers.trainer_callback import PrinterCallback

from ecomkit.config import TrainConfig
from ecomkit.dist import DistEnv, distributed_session, gather_objects, log
from ecomkit.errors import ConfigError
from ecomkit.metrics import MetricsWriter, peak_memory, slowest_rank_throughput, time_split
from ecomkit.models.bloom import count_parameters, load_model
from ecomkit.models.precision import autocast_context
from ecomkit.parallel.zero.env import ensure_deepspeed_env
from ecomkit.train.evaluate import evaluate_loss
from ecomkit.train.loop import TrainingRun, validate_before_launch

# Trainer's samplers (TrainingArguments.train_sampling_strategy); the first is the comparison's default.
HF_SAMPLING = ("group_by_length", "random", "batch_rebalance")


class StepRecorder(TrainerCallback):
    """Per-step wall time and what the step trained on, on this rank.
    Step k runs from the end of step k-1 to the end of step k, so steps add up to the wall time; split into
    ``data_s``, ``fwd_bwd_s``, ``optim_s`` and ``other_s``. Times come from :class:`Measured` and ``on_step_end``."""

    def __init__(self) -> None:
        self.rows: list[dict[str, Any]] = []
        self.losses: dict[int, dict[str, float]] = {}
        self._new_step()
        self._prev_end: float | None = None

    def _new_step(self) -> None:
        self._fetch_start = self._fetch_s = None
        self._fwd_bwd_s, self._last_micro_end = 0.0, None
        self._samples = self._tokens = self._padded = 0

    def fetch(self, start: float, end: float) -> None:
        if self._fetch_start is None:
            self._fetch_start, self._fetch_s = start, end - start

    def micro_step(self, inputs: dict[str, Any], start: float, end: float) -> None:
        ids = inputs["input_ids"]
        mask = inputs.get("attention_mask")
        self._samples += int(ids.size(0))
        self._padded += int(ids.numel())
        self._tokens += int(mask.sum()) if mask is not None else int(ids.numel())
        self._fwd_bwd_s += end - start
        self._last_micro_end = end

    def on_step_end(self, args, state, control, **kw):
        now = time.perf_counter()
        start = self._prev_end if self._prev_end is not None else self._fetch_start
        step = now - start
        optim = now - self._last_micro_end
        data = self._fetch_s or 0.0
        self.rows.append({"type": "train", "step": state.global_step, "samples": self._samples,
                          "tokens": self._tokens, "padded_tokens": self._padded, "step_time_s": step,
                          "data_s": data, "fwd_bwd_s": self._fwd_bwd_s, "optim_s": optim,
                          "other_s": step - data - self._fwd_bwd_s - optim})
        self._prev_end = now
        self._new_step()

    def on_log(self, args, state, control, logs=None, **kw):
        if not logs or "loss" not in logs:
            return
        # note: Trainer logs rank 0's loss (not the global mean that ecomkit logs)
        self.losses[state.global_step] = {"loss": float(logs["loss"]),
                                          "lr": float(logs.get("learning_rate", float("nan"))),
                                          "grad_norm": float(logs.get("grad_norm", float("nan")))}
        if args.process_index == 0 and state.global_step % max(1, state.max_steps // 10) == 0:
            print(f"hf-trainer {state.global_step}/{state.max_steps} loss={logs['loss']:.4f}", flush=True)


class Measured:
    """Mixin for a ``Trainer`` class: reports its fetches and micro-steps to a :class:`StepRecorder`."""

    def __init__(self, *args, recorder: StepRecorder, **kwargs):
        super().__init__(*args, **kwargs)
        self.recorder = recorder
        self.add_callback(recorder)

    def get_batch_samples(self, epoch_iterator, num_batches, device):
        start = time.perf_counter()
        out = super().get_batch_samples(epoch_iterator, num_batches, device)
        self.recorder.fetch(start, time.perf_counter())
        return out

    def training_step(self, model, inputs, num_items_in_batch=None):
        start = time.perf_counter()
        loss = super().training_step(model, inputs, num_items_in_batch)
        self.recorder.micro_step(inputs, start, time.perf_counter())
        return loss


class MeasuredTrainer(Measured, Trainer):
    """``Trainer`` that reports its fetches and micro-steps to a :class:`StepRecorder`; training is unchanged."""


def training_arguments(cfg: TrainConfig, env: DistEnv, grad_accum: int,
                       deepspeed: dict | str | None = None, sampling: str = HF_SAMPLING[0],
                       arguments_class: type = TrainingArguments, **extra: Any) -> TrainingArguments:
    """TrainingArguments equivalent to ``cfg`` (same batch, lr schedule, clipping, precision, steps or epochs).
    ``deepspeed``: a dict, or the path of a JSON file (whose ``"auto"`` values Trainer fills in from these arguments).
    ``arguments_class`` and ``extra``: a subclass such as TRL's ``SFTConfig`` and its own fields."""
    if sampling not in HF_SAMPLING:
        raise ValueError(f"sampling must be one of {HF_SAMPLING}, got {sampling!r}")
    if deepspeed is not None:
        ensure_deepspeed_env()  # TrainingArguments imports deepspeed when given a DeepSpeed dict
    return arguments_class(
        output_dir=str(cfg.output_dir),
        per_device_train_batch_size=cfg.micro_batch_size,
        gradient_accumulation_steps=grad_accum,
        max_steps=cfg.max_steps if cfg.max_steps > 0 else -1,   # -1: Trainer counts num_train_epochs
        num_train_epochs=cfg.epochs if cfg.max_steps == 0 else 1.0,
        learning_rate=cfg.lr,
        weight_decay=cfg.weight_decay,
        adam_beta1=cfg.beta1, adam_beta2=cfg.beta2, adam_epsilon=1e-8,
        max_grad_norm=cfg.max_grad_norm,
        warmup_steps=cfg.warmup_steps,
        lr_scheduler_type="cosine_with_min_lr",
        lr_scheduler_kwargs={"min_lr_rate": cfg.min_lr_ratio},
        optim="adamw_torch",
        bf16=cfg.precision == "bf16", fp16=cfg.precision == "fp16",
        torch_compile=cfg.compile,  # --compile: Trainer compiles the model itself (torch.compile, inductor)
        use_cpu=env.device.type == "cpu",
        logging_steps=1, report_to=[], save_strategy="no", eval_strategy="no",
        disable_tqdm=True,  # progress comes from StepRecorder's lines, like ecomkit's loop
        ddp_bucket_cap_mb=int(cfg.bucket_cap_mb) if deepspeed is None else None,
        ddp_find_unused_parameters=False,  # Trainer's default re-traverses the graph every step
        remove_unused_columns=False,
        train_sampling_strategy=sampling, length_column_name="length",  # lengths precomputed by ecomkit
        seed=cfg.seed, data_seed=cfg.seed,
        deepspeed=deepspeed,
        **extra,
    )


class _ColumnsForModel:
    """Collate with ecomkit's padding, then keep only what BLOOM's forward takes."""

    def __init__(self, collate):
        self.collate = collate

    def __call__(self, features):
        batch = self.collate(features)
        return {k: batch[k] for k in ("input_ids", "attention_mask", "labels")}


def global_step_rows(per_rank: list[list[dict[str, Any]]], losses: dict[int, dict[str, float]]) -> list[dict[str, Any]]:
    """One row per step from every rank's rows: counts summed over ranks, times from this rank (rank 0)."""
    rows = []
    for k, mine in enumerate(per_rank[0]):
        steps = [rank_rows[k] for rank_rows in per_rank]
        row = {**mine, **{key: sum(r[key] for r in steps) for key in ("samples", "tokens", "padded_tokens")},
               **losses.get(mine["step"], {})}
        row["samples_per_s"] = row["samples"] / row["step_time_s"]   # per-step facts; the summary divides totals
        row["tokens_per_s"] = row["tokens"] / row["step_time_s"]
        rows.append(row)
    return rows


class _EvalModel:
    """What :func:`ecomkit.train.evaluate.evaluate_loss` needs of a strategy: the model and its forward."""

    def __init__(self, model: torch.nn.Module, cfg: TrainConfig, env: DistEnv):
        self.model, self.cfg, self.env = model, cfg, env

    def forward_logits(self, input_ids: torch.Tensor, attention_mask: torch.Tensor,
                       positions: torch.Tensor | None = None) -> torch.Tensor:
        """As ``Strategy.forward_logits``: ``positions`` keeps only those positions' logits."""
        keep = {} if positions is None else {"logits_to_keep": positions}
        with autocast_context(self.cfg.precision, self.env.device):
            return self.model(input_ids=input_ids, attention_mask=attention_mask, **keep).logits


def _trl():
    from trl import SFTConfig, SFTTrainer  # lazy: TRL is only the packing benchmark's comparison (pip install trl)
    return SFTConfig, SFTTrainer


def _arguments(cfg: TrainConfig, env: DistEnv, grad_accum: int, deepspeed: dict | str | None, sampling: str,
               trl_packing: bool) -> TrainingArguments:
    """Trainer's arguments, or TRL's ``SFTConfig`` packing to ``seq_len`` by best-fit decreasing."""
    if not trl_packing:
        return training_arguments(cfg, env, grad_accum, deepspeed, sampling)
    return training_arguments(cfg, env, grad_accum, deepspeed, sampling, arguments_class=_trl()[0], packing=True,
                              packing_strategy="bfd", max_length=cfg.seq_len, dataset_num_proc=1)


def _trainer(run: TrainingRun, model, args: TrainingArguments, recorder: StepRecorder, trl_packing: bool):
    """Trainer on ecomkit's padded rows, or TRL's SFTTrainer, which packs the same rows itself."""
    keep = ("input_ids", "labels", "length")
    train_ds = run.train_ds.remove_columns([c for c in run.train_ds.column_names if c not in keep])
    if not trl_packing:
        return MeasuredTrainer(model=model, args=args, train_dataset=train_ds,
                               data_collator=_ColumnsForModel(run.collate), recorder=recorder)
    rows = train_ds.remove_columns(["length"])   # ids and labels: TRL keeps a dataset's own labels, and packs them
    measured = type("MeasuredSFTTrainer", (Measured, _trl()[1]), {})
    return measured(model=model, args=args, train_dataset=rows, processing_class=run.tokenizer, recorder=recorder)


def run_hf_trainer(cfg: TrainConfig, deepspeed: dict | str | None = None,
                   sampling: str = HF_SAMPLING[0], trl_packing: bool = False) -> dict[str, Any]:
    """Train with HF Trainer on ecomkit's model and data; returns a summary like ``run_training``.
    ``trl_packing``: TRL's ``SFTTrainer(packing=True)`` packs the same rows (on BLOOM its packed rows attend to each
    other); ``eval_loss`` is always ecomkit's held-out loss on the unpacked rows."""
    if cfg.peft != "none":
        raise ConfigError(f"--peft {cfg.peft}: the HF Trainer comparison path has no LoRA step (its saving and "
                          "checkpoints are Trainer's own). Train LoRA with scripts/02_data_parallel.py --peft lora "
                          "(or 03_zero3.py / 04_mixed_parallel.py --strategy fsdp).")
    validate_before_launch(cfg)
    with distributed_session(timeout_s=cfg.timeout_s, seed=cfg.seed) as env:
        run = TrainingRun(cfg, env)
        cfg = run.resolve().cfg   # the loop's facts and rules: precision, data, batch, lr, length (train/resolve.py)
        if env.is_main:
            log.info("resolved: %s", " | ".join(f"{name} {value} ({why})" for name, value, why in run.resolved.rows()))
        # Arguments first: with a ZeRO-3 config they activate DeepSpeed's HF integration (HfDeepSpeedConfig), so
        # from_pretrained of a local checkpoint builds the model under deepspeed.zero.Init (partitioned at once).
        args = _arguments(cfg, env, run.grad_accum, deepspeed, sampling, trl_packing)
        model = load_model(cfg.model, vocab_size=len(run.tokenizer), device=env.device, seed=cfg.seed)
        writer = MetricsWriter(cfg.output_dir, env.is_main)
        recorder = StepRecorder()
        trainer = _trainer(run, model, args, recorder, trl_packing)
        trainer.remove_callback(PrinterCallback)  # it prints every log dict; our metrics file has them
        t0 = time.perf_counter()
        trainer.train()
        wall = time.perf_counter() - t0
        # Every rank's per-step counts (one gather after training, none during it), and the slowest rank's pace.
        rows = global_step_rows(gather_objects(recorder.rows, env), recorder.losses)
        for row in rows:
            writer.write(row)
        eval_loss = evaluate_loss(_EvalModel(trainer.model, cfg, env), run.eval_ds, run.collate, env,
                                  cfg.micro_batch_size, cfg.eval_batches)
        summary = {
            "strategy": "hf-trainer" + ("+deepspeed" if deepspeed else "") + ("+trl-packing" if trl_packing else ""),
            "sampling": "trl-packing (bfd)" if trl_packing else sampling, "eval_loss": eval_loss,
            "steps_per_epoch": len(trainer.get_train_dataloader()) // max(1, run.grad_accum),
            "model": cfg.model, "recipe": run.resolved.to_dict(), "params": count_parameters(model),
            "world_size": env.world_size,
            "global_batch": run.global_batch(), "steps": trainer.state.global_step,
            "seq_len": cfg.seq_len, "peak_mem_bytes": peak_memory(env.device)[0],   # as ecomkit's summary has them
            "first_loss": rows[0].get("loss") if rows else None, "final_loss": rows[-1].get("loss") if rows else None,
            **slowest_rank_throughput(recorder.rows, env, cfg.untimed_steps, rows),
            "time_split": time_split(rows, cfg.untimed_steps),
            "wall_s": wall, "output_dir": str(cfg.output_dir),
        }
        writer.finish(summary)
        del trainer, model, recorder
        torch.cuda.empty_cache() if torch.cuda.is_available() else None
    return summary
