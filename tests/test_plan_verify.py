"""``--verify``: the recommended launch lines, scaled down to twins, launch, train and save on 2 gloo processes."""

from __future__ import annotations

import contextlib
import io
import json
import shlex

import pytest

from ecomkit.config import TrainConfig
from ecomkit.plan import main as plan_main
from ecomkit.planner.job import Cluster
from ecomkit.planner.report import recommendation_json
from ecomkit.planner.twins import TWIN_MODEL, orders_agree

pytestmark = pytest.mark.dist

JOB = TrainConfig(model="seqgpt-560m", precision="bf16", seq_len=256)
CLUSTER = Cluster(gpus=8, gpu="a100-40g", link="nvlink-a100")   # top two: one DeepSpeed, one torch twin


@pytest.fixture(scope="module")
def verified(tmp_path_factory):
    """``python -m ecomkit.plan --recommend --verify`` for one small plan (2 twins, one launch each)."""
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        plan_main(["--model", "seqgpt-560m", "--precision", "bf16", "--seq-len", "256", "--gpus", "8", "--gpu",
                   "a100-40g", "--link", "nvlink-a100", "--recommend", "--verify", "--verify-top", "2",
                   "--verify-dir", str(tmp_path_factory.mktemp("twins")), "--json"])
    report = json.loads(out.getvalue())
    assert report["best"] == recommendation_json(JOB, CLUSTER, set())["best"]   # the CLI's job is JOB
    return report


def test_top_twins_launch_train_and_save(verified):
    v = verified["verify"]
    assert v["nproc"] == 2 and v["twin_model"] == TWIN_MODEL and len(v["twins"]) == 2
    for twin in v["twins"]:
        assert twin["ok"], twin
        assert twin["trained"] and twin["saved"] and twin["final_loss"] < twin["first_loss"] + 0.5


def test_the_twin_runs_the_printed_launch_line_scaled_down(verified):
    """Same script and strategy flags as the printed line; only model, sizes, steps and outputs differ."""
    printed = shlex.split(verified["launch"])
    twin = shlex.split(verified["verify"]["twins"][0]["command"])
    script = printed.index(next(a for a in printed if a.startswith("scripts/")))
    assert twin[twin.index(printed[script])] == printed[script]
    scaled = {"--model", "--seq-len", "--precision", "--nproc_per_node"}
    for flag in (a for a in printed[script + 1:] if a.startswith("--") and a not in scaled):
        assert flag in twin, flag
        value = printed[printed.index(flag) + 1]
        if not value.startswith("--") and flag not in scaled:
            assert twin[twin.index(flag) + 1] == value, flag


def test_memory_ordering_is_reported(verified):
    v = verified["verify"]
    measured = {t["candidate"]: t["measured_bytes"] for t in v["twins"]}
    assert all(measured.values())           # ZeRO and FSDP/TP twins count their model states per rank
    assert len({t["script"] for t in v["twins"]}) == 2                 # scripts/03_zero3.py and 04_mixed_parallel.py
    for t in v["twins"]:                    # the planner's bytes for the twin are what its ranks counted
        assert t["measured_bytes"] == pytest.approx(t["planned_bytes"], rel=0.02), t
    assert v["order_matches"] is orders_agree({t["candidate"]: t["planned_bytes"] for t in v["twins"]}, measured)


def test_orders_agree_sees_a_swap():
    assert orders_agree({"a": 1, "b": 2}, {"a": 10, "b": 20})
    assert not orders_agree({"a": 1, "b": 2}, {"a": 20, "b": 10})
    assert orders_agree({"a": 100, "b": 101}, {"a": 20, "b": 10})      # a planned tie orders nothing
