"""Dashboards fed by the one metrics stream: TensorBoard, Weights & Biases, MLflow (``--report-to``).

Each ``metrics.jsonl`` row goes, as the same dict, to each sink on rank 0, so a dashboard cannot differ from the file.
A run loads this module only when ``--report-to`` names a sink (``ecomkit.metrics.REPORTING``).
"""

from __future__ import annotations

import json
import math
import os
from pathlib import Path
from typing import Any, Iterable, Protocol

from ecomkit.config import parse_report_to


class Sink(Protocol):
    def log(self, row: dict[str, Any]) -> None: ...
    def close(self) -> None: ...


def numeric_fields(row: dict[str, Any]) -> dict[str, float]:
    """The fields a dashboard can plot: numbers (bools as 0/1), finite, besides the step and the clock."""
    out = {}
    for key, value in row.items():
        if key in ("step", "time") or value is None or isinstance(value, str):
            continue
        if isinstance(value, (bool, int, float)) and math.isfinite(float(value)):
            out[key] = float(value)
    return out


def metric_name(row: dict[str, Any], key: str) -> str:
    """Training and eval rows share one flat namespace (``loss``, ``eval_loss``); other rows are prefixed by type."""
    kind = row.get("type", "train")
    return key if kind in ("train", "eval") else f"{kind}/{key}"


def flat_config(config: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    """``{"fault": {"keep_last": 2}}`` -> ``{"fault.keep_last": 2}``; values other than numbers/str/bool as JSON."""
    out: dict[str, Any] = {}
    for key, value in config.items():
        name = f"{prefix}{key}"
        if isinstance(value, dict) and value:
            out.update(flat_config(value, name + "."))
        elif isinstance(value, (bool, int, float, str)):
            out[name] = value
        else:
            out[name] = json.dumps(value, ensure_ascii=False, default=str)
    return out


class TensorBoardSink:
    """Scalars (double precision) and the config (text and the HParams tab) into ``log_dir``'s event file."""

    def __init__(self, log_dir: Path, config: dict[str, Any] | None):
        from torch.utils.tensorboard import SummaryWriter  # lazy: ~0.7 s to import, only rank 0 needs it
        from torch.utils.tensorboard.summary import hparams  # lazy: as above

        self.writer = SummaryWriter(log_dir=str(log_dir))
        if config:
            flat = flat_config(config)
            self.writer.add_text("config", "```json\n" + json.dumps(config, indent=2, default=str) + "\n```")
            for summary in hparams(flat, {}):
                self.writer.file_writer.add_summary(summary)

    def log(self, row: dict[str, Any]) -> None:
        step = int(row.get("step", 0))
        for key, value in numeric_fields(row).items():
            self.writer.add_scalar(metric_name(row, key), value, step, new_style=True, double_precision=True)
        self.writer.flush()  # a crash loses nothing, a dashboard sees the step now

    def close(self) -> None:
        self.writer.close()


class WandbSink:
    """One W&B run per launch, offline without an account; the config as the run's config."""

    def __init__(self, out_dir: Path, config: dict[str, Any] | None):
        import wandb  # lazy: optional extra (ecomkit[wandb]), imported only when asked for

        mode = os.environ.get("WANDB_MODE") or ("online" if os.environ.get("WANDB_API_KEY") else "offline")
        self.wandb = wandb
        self.run = wandb.init(project=os.environ.get("WANDB_PROJECT", "ecomkit"), name=out_dir.name,
                              dir=str(out_dir), config=flat_config(config or {}), mode=mode, reinit=True)

    def log(self, row: dict[str, Any]) -> None:
        values = {metric_name(row, k): v for k, v in numeric_fields(row).items()}
        if values:
            self.run.log(values, step=int(row.get("step", 0)))

    def close(self) -> None:
        self.run.finish()


class MlflowSink:
    """An MLflow run in ``<out_dir>/mlruns`` (or ``MLFLOW_TRACKING_URI``); the config as params."""

    def __init__(self, out_dir: Path, config: dict[str, Any] | None):
        import mlflow  # lazy: optional extra (ecomkit[mlflow]), imported only when asked for

        self.mlflow = mlflow
        uri = os.environ.get("MLFLOW_TRACKING_URI")
        if not uri:  # a plain folder; MLflow 3 asks for this opt-in to its file store
            uri = (out_dir / "mlruns").resolve().as_uri()
            os.environ.setdefault("MLFLOW_ALLOW_FILE_STORE", "true")
        self.client = mlflow.tracking.MlflowClient(tracking_uri=uri)
        experiment = os.environ.get("MLFLOW_EXPERIMENT_NAME", "ecomkit")
        found = self.client.get_experiment_by_name(experiment)
        exp_id = found.experiment_id if found else self.client.create_experiment(experiment)
        self.run_id = self.client.create_run(exp_id, run_name=out_dir.name).info.run_id
        params = [mlflow.entities.Param(k, str(v)[:6000]) for k, v in flat_config(config or {}).items()]
        for i in range(0, len(params), 100):
            self.client.log_batch(self.run_id, params=params[i:i + 100])

    def log(self, row: dict[str, Any]) -> None:
        step, ts = int(row.get("step", 0)), int(float(row.get("time", 0)) * 1000)
        metrics = [self.mlflow.entities.Metric(metric_name(row, k), v, ts, step)
                   for k, v in numeric_fields(row).items()]
        if metrics:
            self.client.log_batch(self.run_id, metrics=metrics)

    def close(self) -> None:
        self.client.set_terminated(self.run_id)


def read_tensorboard_scalars(log_dir: str | os.PathLike) -> dict[str, list[tuple[int, float]]]:
    """``{tag: [(step, value), ...]}`` read back from the event files in ``log_dir`` (every launch's, in order)."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator  # lazy: tensorboard, heavy
    from tensorboard.util.tensor_util import make_ndarray  # lazy: as above

    acc = EventAccumulator(str(log_dir), size_guidance={"tensors": 0, "scalars": 0})
    acc.Reload()
    out: dict[str, list[tuple[int, float]]] = {}
    for tag in acc.Tags().get("tensors", []):
        events = acc.Tensors(tag)
        if events and events[0].tensor_proto.dtype in (1, 2) and not events[0].tensor_proto.tensor_shape.dim:
            out[tag] = [(e.step, float(make_ndarray(e.tensor_proto).item())) for e in events]
    for tag in acc.Tags().get("scalars", []):
        out[tag] = [(e.step, float(e.value)) for e in acc.Scalars(tag)]
    return out


def tensorboard_tags(log_dir: str | os.PathLike) -> dict[str, list[str]]:
    """Every tag by kind (``tensors``, ``scalars``, ...), e.g. to check the config and hparams were written."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator  # lazy: tensorboard, heavy

    acc = EventAccumulator(str(log_dir))
    acc.Reload()
    tags = {k: list(v) for k, v in acc.Tags().items() if isinstance(v, list)}
    for plugin in ("hparams", "text", "scalars"):
        try:
            tags[f"plugin:{plugin}"] = list(acc.PluginTagToContent(plugin))
        except KeyError:
            tags[f"plugin:{plugin}"] = []
    return tags


SINKS = {"tensorboard": TensorBoardSink, "wandb": WandbSink, "mlflow": MlflowSink}


def open_sinks(report_to: str | Iterable[str], out_dir: Path, config: dict[str, Any] | None) -> list[Sink]:
    """The sinks ``report_to`` names (``"none"``: none); only rank 0 calls this (MetricsWriter enabled)."""
    return [SINKS[name](Path(out_dir), config) for name in parse_report_to(report_to)]


__all__ = ["SINKS", "MlflowSink", "TensorBoardSink", "WandbSink", "flat_config", "metric_name", "numeric_fields",
           "open_sinks", "read_tensorboard_scalars", "tensorboard_tags"]
