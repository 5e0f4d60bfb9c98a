"""One description of a job: the planner reads the scripts' flags, defaults, config files and validation."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

from ecomkit.config import TrainConfig, parse_config
from ecomkit.models.attention import pick_attention
from ecomkit.models.bloom import model_length_limit
from ecomkit.planner.cli import main, read_job
from ecomkit.planner.job import PLANNER_FIELDS, Cluster, get_field, plan_input_from_config, planned_precision

ROOT = Path(__file__).resolve().parents[1]
ACCEPTANCE = ["--model", "ecomgpt-7b", "--gpus", "4", "--gpu", "rtx4090", "--strategy", "zero", "--zero-stage", "3",
              "--zero-offload-optimizer", "--zero-offload-param", "--precision", "bf16", "--seq-len", "512",
              "--micro-batch-size", "4"]
TRAINING_FLAGS = ACCEPTANCE[:2] + ACCEPTANCE[6:]   # without "--gpus 4 --gpu rtx4090", the cluster


def _script(name: str):
    spec = importlib.util.spec_from_file_location(name.replace("/", "_"), ROOT / name)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_every_planner_default_is_the_training_default():
    job = read_job([])
    ref = TrainConfig()
    for name in PLANNER_FIELDS:
        assert get_field(job.cfg, name) == get_field(ref, name), name
    inp = plan_input_from_config(job.cfg, job.cluster)
    planned = model_length_limit(ref.model)      # --seq-len auto is planned at the model's limit (an upper bound)
    assert ref.seq_len == "auto" and "--seq-len auto: planned at" in job.args.seq_len_note
    precision = planned_precision(ref.precision, job.cluster)   # --precision auto: as a run on the GPU resolves it
    assert ref.precision == "auto" and precision == "bf16"        # the default GPU has bf16
    assert (inp.attn, inp.loss_chunk_tokens, inp.micro_batch, inp.seq_len, inp.precision, inp.grad_accum,
            inp.strategy, inp.zero_bucket_elements) == (pick_attention(ref.attn, precision, "cuda", planned)[0],
                                                        ref.loss_chunk_tokens, ref.micro_batch_size,
                                                        planned, precision, ref.grad_accum, ref.strategy,
                                                        ref.zero.bucket_size)


def test_acceptance_plan_is_the_job_03_zero3_runs(capsys):
    """The planner's job for the training flags equals the job scripts/03_zero3.py parses from the same flags."""
    job = read_job(ACCEPTANCE)
    script = _script("scripts/03_zero3.py")
    cfg, _ = parse_config(TRAINING_FLAGS, defaults=script.script_defaults(),
                          extra=script.extra_flags)
    cluster = Cluster(gpus=4, gpu="rtx4090")
    assert plan_input_from_config(job.cfg, job.cluster) == plan_input_from_config(cfg, cluster)
    inp = plan_input_from_config(job.cfg, job.cluster)
    assert inp.attn == "sdpa" and inp.loss_chunk_tokens == 1024 and inp.strategy == "zero3"
    main(ACCEPTANCE)
    out = capsys.readouterr().out
    assert "→ fits on GeForce RTX 4090" in out.splitlines()[0]
    defaults_line = next(ln for ln in out.splitlines() if ln.startswith("defaults used"))
    assert "attn=auto" in defaults_line and "loss_chunk_tokens=1024" in defaults_line
    assert "seq_len" not in defaults_line and "precision" not in defaults_line   # given, so not a default


def test_old_planner_flags_are_aliases():
    old = read_job(["--model", "ecomgpt-7b", "--gpus", "8", "--zero", "3", "--offload-optimizer", "--offload-param",
                    "--micro-batch", "2", "--checkpointing"])
    new = read_job(["--model", "ecomgpt-7b", "--gpus", "8", "--strategy", "zero", "--zero-stage", "3",
                    "--zero-offload-optimizer", "--zero-offload-param", "--micro-batch-size", "2",
                    "--zero-activation-checkpointing"])
    assert plan_input_from_config(old.cfg, old.cluster) == plan_input_from_config(new.cfg, new.cluster)
    fsdp = read_job(["--model", "ecomgpt-7b", "--gpus", "8", "--strategy", "fsdp2", "--tp", "2", "--offload-param"])
    inp = plan_input_from_config(fsdp.cfg, fsdp.cluster)
    assert (inp.strategy, inp.tp, inp.dp, inp.offload_param) == ("tp", 2, 4, True)


def test_config_file_like_the_scripts(tmp_path):
    path = tmp_path / "job.yaml"
    path.write_text("model: seqgpt-560m\nseq_len: 256\nprecision: bf16\nzero:\n  stage: 2\nstrategy: zero\n")
    job = read_job(["--config", str(path), "--gpus", "4", "--seq-len", "512"])     # flags win over the file
    inp = plan_input_from_config(job.cfg, job.cluster)
    assert (inp.model, inp.seq_len, inp.strategy, inp.precision) == ("seqgpt-560m", 512, "zero2", "bf16")
    assert {"model", "seq_len", "zero.stage", "strategy"} <= job.given


@pytest.mark.parametrize("argv, words", [(["--precision", "fp8"], "Unknown precision"),
                                         (["--strategy", "zero", "--zero-stage", "2", "--zero-offload-param"],
                                          "offload"),
                                         (["--strategy", "pp", "--pp", "4", "--gpus", "4"], "blocks")])
def test_training_validation_applies(argv, words, capsys):
    with pytest.raises(SystemExit) as exc:
        main(argv)
    assert exc.value.code == 2 and words in capsys.readouterr().err
