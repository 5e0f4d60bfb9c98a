"""ZeRO checkpoints: sharded save / resume with the engine, and consolidation into one HF directory.

Sharded engine checkpoints are the only exact resume (fp32 masters, Adam moments, schedule, data position); a
consolidated ``save_pretrained`` folder loads without DeepSpeed.
"""

from __future__ import annotations

import os
import re
from pathlib import Path
from typing import Any

import torch
from transformers import AutoModelForCausalLM

from ecomkit.config import TrainConfig
from ecomkit.dist import log, restart_attempt
from ecomkit.errors import ConfigError
from ecomkit.models.bloom import model_config
from ecomkit.parallel.zero.env import ensure_deepspeed_env

TAG_PATTERN = re.compile(r"^step(\d+)$")
EMBEDDING_KEY = "transformer.word_embeddings.weight"   # BLOOM's input embedding: its rows are the vocabulary


def consolidated_save_pretrained(config: Any, state_dict: dict[str, torch.Tensor], out_dir: str | os.PathLike) -> None:
    """Write ``state_dict`` as a ``save_pretrained`` directory, building the model on the meta device.

    Under ZeRO-3 the training model's parameters are empty placeholders, so a fresh meta model adopts the gathered ones.
    """
    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(config)
    missing, unexpected = model.load_state_dict(state_dict, strict=False, assign=True)
    tied = set(getattr(model, "_tied_weights_keys", None) or [])
    missing = [k for k in missing if k not in tied and not k.endswith("lm_head.weight")]
    if missing or unexpected:
        raise RuntimeError(f"gathered state dict does not match the model: missing {missing}, unexpected {unexpected}")
    model.tie_weights()
    model.save_pretrained(out_dir, safe_serialization=True)


def consolidate_checkpoint(ckpt_dir: str | os.PathLike, config: Any, out_dir: str | os.PathLike,
                           tag: str | None = None) -> None:
    """Offline: merge a sharded DeepSpeed checkpoint into a ``save_pretrained`` directory (one process)."""
    consolidated_save_pretrained(config, fp32_state_dict(ckpt_dir, tag), out_dir)


def fp32_state_dict(ckpt_dir: str | os.PathLike, tag: str | None = None) -> dict[str, torch.Tensor]:
    """The full fp32 weights merged from every rank's partition of a sharded checkpoint (DeepSpeed's zero_to_fp32)."""
    ensure_deepspeed_env()
    from deepspeed.utils.zero_to_fp32 import get_fp32_state_dict_from_zero_checkpoint  # lazy: heavy optional dependency

    return get_fp32_state_dict_from_zero_checkpoint(str(ckpt_dir), tag=tag)


def consolidate_run(cfg: TrainConfig, out_dir: str | os.PathLike) -> tuple[Path, str]:
    """``--consolidate-to DIR``: merge the checkpoint named by ``--zero-resume-from`` into ``DIR``; (ckpt dir, tag).

    The vocabulary size comes from the checkpoint's embedding, the record of the tokenizer the run used.
    """
    if not cfg.zero.resume_from:
        raise ConfigError("--consolidate-to needs --zero-resume-from DIR (the sharded checkpoint to merge).")
    ckpt_dir, tag = resolve_resume(cfg.zero.resume_from)
    state = fp32_state_dict(ckpt_dir, tag)
    config = model_config(cfg.model, vocab_size=int(state[EMBEDDING_KEY].shape[0]))
    consolidated_save_pretrained(config, state, out_dir)
    return ckpt_dir, tag


def latest_tag(ckpt_dir: str | os.PathLike) -> str | None:
    """The tag DeepSpeed recorded in ``latest``, or None when the directory holds no checkpoint."""
    latest = Path(ckpt_dir) / "latest"
    return latest.read_text().strip() if latest.is_file() else None


def restart_resume_dir(ckpt_dir: str | os.PathLike, allowed: bool = True) -> str | None:
    """``ckpt_dir`` when torchrun restarted this launch's workers and the attempt before left a checkpoint there.

    A first attempt never resumes by itself: a rerun of a finished run starts fresh.
    """
    return str(ckpt_dir) if allowed and restart_attempt() > 0 and latest_tag(ckpt_dir) else None


class ZeroCheckpointCallback:
    """Save a sharded checkpoint every ``interval`` steps; optionally resume from one at start.

    The client state holds what the engine does not know: the loop's step, epoch and the sampler's position.
    """

    def __init__(self, ckpt_dir: str | os.PathLike, interval: int = 0, resume_from: str | None = None):
        self.ckpt_dir = Path(ckpt_dir)
        self.interval = interval
        self.resume_from = resume_from
        self.resuming = resume_from is not None   # the loop appends to metrics.jsonl instead of truncating
        self.saved: list[str] = []
        self.resumed_step: int | None = None

    def on_train_start(self, run) -> None:
        if self.resume_from is None:
            return
        ckpt_dir, tag = resolve_resume(self.resume_from)
        client = run.strategy.load_checkpoint(str(ckpt_dir), tag)
        missing = {"step", "epoch", "sampler"} - set(client)
        if missing:
            raise ConfigError(f"Checkpoint {ckpt_dir}/{tag} was not written by ecomkit (client state lacks "
                              f"{sorted(missing)}); it cannot restore the data position. Resume from a directory "
                              "written with --zero-checkpoint-interval.")
        run.step, run.epoch = int(client["step"]), int(client["epoch"])
        run.sampler.load_state_dict(client["sampler"])
        self.resumed_step = run.step
        if run.env.is_main:
            log.info("resumed from %s/%s at step %d (epoch %d)", ckpt_dir, tag, run.step, run.epoch)

    def on_step_end(self, run, row: dict[str, Any]) -> None:
        if self.interval and run.step % self.interval == 0:
            tag = f"step{run.step}"
            state = {"step": run.step, "epoch": run.epoch, "sampler": run.sampler.state_dict()}
            run.strategy.save_checkpoint(str(self.ckpt_dir), tag, state)
            self.saved.append(tag)

    def on_train_end(self, run, summary: dict[str, Any]) -> None:
        """The same ``checkpoint`` block the DCP callback writes, so one reader serves both."""
        summary["checkpoint"] = {"interval": self.interval, "dir": str(self.ckpt_dir.resolve()),
                                 "saved_steps": [int(t.removeprefix("step")) for t in self.saved],
                                 "resumed_from_step": self.resumed_step}


def resolve_resume(path: str) -> tuple[Path, str]:
    """``--resume-from DIR`` (latest tag in DIR) or ``DIR/stepN`` (that tag)."""
    p = Path(path)
    if TAG_PATTERN.match(p.name) and p.is_dir():
        return p.parent, p.name
    tag = latest_tag(p)
    if tag is None:
        raise ConfigError(f"--resume-from {path}: no DeepSpeed checkpoint there (no 'latest' file and not a "
                          "'stepN' folder). Pass the --zero-checkpoint-dir of an earlier run, or one of its "
                          "stepN subfolders.")
    return p, tag
