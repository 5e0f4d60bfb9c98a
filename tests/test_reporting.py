"""--report-to: every metrics.jsonl row reaches TensorBoard (and W&B / MLflow when installed) as the same numbers.

The 2-process round trip reads the event files of test_fault_tolerance.py's uninterrupted run (TensorBoard is
the default); here: the writer on its own, the config's validation, and the optional sinks offline."""

from __future__ import annotations

import importlib.util
import json
import math

import pytest

from ecomkit.config import TrainConfig, parse_report_to
from ecomkit.errors import ConfigError
from ecomkit.metrics import MetricsWriter
from ecomkit.reporting import flat_config, numeric_fields, read_tensorboard_scalars, tensorboard_tags

ROWS = [{"type": "eval", "step": 0, "eval_loss": 5.5},
        {"type": "train", "step": 1, "loss": 5.123456789012345, "lr": 3e-4, "grad_norm": 1.25, "skipped": False,
         "mem_kind": "cpu_peak_rss", "comm_exposed_s": None, "tokens_per_s": 1234.5678},
        {"type": "train", "step": 2, "loss": 4.987654321098765, "lr": 2.9e-4, "grad_norm": float("nan"),
         "acc_category": 0.4},
        {"type": "eval", "step": 2, "eval_loss": 4.9, "acc_category": 0.5, "macro_f1_category": 0.33}]


def test_every_numeric_field_reaches_tensorboard_bit_for_bit(tmp_path):
    w = MetricsWriter(tmp_path, True, report_to="tensorboard", hparams=TrainConfig().to_dict())
    for row in ROWS:
        w.write(row)
    w.close()
    got = read_tensorboard_scalars(tmp_path)
    rows = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    for row in rows:
        for key, value in numeric_fields(row).items():
            assert (row["step"], value) in got[key], (key, got.get(key))
    assert got["loss"] == [(1, ROWS[1]["loss"]), (2, ROWS[2]["loss"])]  # doubles: equal, not close
    assert got["eval_loss"] == [(0, 5.5), (2, 4.9)] and got["skipped"] == [(1, 0.0)]
    assert "grad_norm" in got and got["grad_norm"] == [(1, 1.25)]  # NaN left out, not logged as a number
    assert "mem_kind" not in got and "comm_exposed_s" not in got and "time" not in got
    tags = tensorboard_tags(tmp_path)
    assert tags["plugin:text"] == ["config/text_summary"]  # the config, once, as text and as hyperparameters
    assert "_hparams_/session_start_info" in tags["plugin:hparams"]
    assert {"loss", "lr", "eval_loss", "acc_category", "macro_f1_category"} <= set(tags["plugin:scalars"])


def test_report_to_is_validated():
    assert parse_report_to("tensorboard, wandb") == ["tensorboard", "wandb"]
    assert parse_report_to("none") == [] and parse_report_to("") == [] and parse_report_to(["mlflow"]) == ["mlflow"]
    with pytest.raises(ConfigError, match="Did you mean 'tensorboard'"):
        parse_report_to("tensorbord")
    with pytest.raises(ConfigError, match="'none' cannot be combined"):
        parse_report_to("none,wandb")
    for name in ("wandb", "mlflow"):
        if importlib.util.find_spec(name) is None:
            cfg = TrainConfig()
            cfg.report_to = name
            with pytest.raises(ConfigError, match=rf"pip install 'ecomkit\[{name}\]'"):
                cfg.validate(1)


def test_config_is_flattened_for_hyperparameters():
    flat = flat_config(TrainConfig().to_dict())
    assert flat["fault.keep_last"] == 2 and flat["model"] == "tiny" and flat["report_to"] == "tensorboard"
    assert all(isinstance(v, (bool, int, float, str)) for v in flat.values())


@pytest.mark.skipif(importlib.util.find_spec("wandb") is None, reason="wandb not installed (ecomkit[wandb])")
def test_wandb_offline_logs_the_rows(tmp_path, monkeypatch):
    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_SILENT", "true")
    w = MetricsWriter(tmp_path, True, report_to="wandb", hparams={"lr": 3e-4})
    for row in ROWS:
        w.write(row)
    w.close()
    assert list((tmp_path / "wandb").glob("offline-run-*/run-*.wandb"))


@pytest.mark.skipif(importlib.util.find_spec("mlflow") is None, reason="mlflow not installed (ecomkit[mlflow])")
def test_mlflow_local_store_has_the_same_losses(tmp_path, monkeypatch):
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    w = MetricsWriter(tmp_path, True, report_to="mlflow", hparams={"lr": 3e-4})
    for row in ROWS:
        w.write(row)
    w.close()
    import mlflow
    client = mlflow.tracking.MlflowClient(tracking_uri=(tmp_path / "mlruns").resolve().as_uri())
    run = client.search_runs([client.get_experiment_by_name("ecomkit").experiment_id])[0]
    history = client.get_metric_history(run.info.run_id, "loss")
    assert sorted((m.step, m.value) for m in history) == [(1, ROWS[1]["loss"]), (2, ROWS[2]["loss"])]
    assert run.data.params["lr"] == "0.0003"
    assert not math.isnan(run.data.metrics["loss"])
