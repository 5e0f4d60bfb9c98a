"""3-D parallelism: dp 2 × tp 2 × pp 2 on 8 processes trains as one process does, and resumes exactly.

What it holds: ``--strategy mixed`` with every degree above 1 gives the single process's
per-step losses within 1e-5 relative and gradient norms within 5e-4 (tests/test_mixed_parallel.py says why
those tolerances) over 20 steps; a second launch resumes from the step-16 checkpoint the first one wrote and
gives steps 17-20 the same losses as the uninterrupted run (the same layout, the same reduction order: equal
to 1e-12); the ``--dcp-dir`` shards of the 3-D run load into one plain process and equal its consolidated save;
each rank's measured model states are the planner's for its place in the mesh.

Kept small for the suite on 2 cores: the tiny preset (2 blocks: one per stage), 32-token rows, 8 rows per
step, no periodic evaluation and a final one of 8 examples.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from conftest import run_script
from ecomkit.planner.memory import PlanInput, state_bytes_of_rank
from ecomkit.planner.shapes import local_params, model_shape
from test_mixed_parallel import _assert_dcp_loads_at_world_size_one

SCRIPT = "04_mixed_parallel.py"
STEPS, RESUME_AT = 20, 16   # resumed for the last 4 steps: enough to carry the AdamW moments, cheap to rerun
COMMON = ["--model", "tiny", "--n-rows", "240", "--seq-len", "32", "--max-steps", str(STEPS), "--eval-interval", "0",
          "--eval-batches", "1", "--final-eval-samples", "8", "--warmup-steps", "2", "--no-progress"]
THREE_D = ["--micro-batch-size", "4", "--dp", "2", "--tp", "2", "--pp", "2", "--parallel-pp-microbatches", "2",
           "--fault-checkpoint-interval", str(RESUME_AT)]
LOSS_RTOL, NORM_RTOL, RESUME_RTOL = 1e-5, 5e-4, 1e-12


def train_rows(out: Path) -> list[dict]:
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    return [r for r in rows if r.get("type") == "train"]


@pytest.mark.dist
@pytest.mark.slow
def test_dp2_tp2_pp2_equals_one_process_and_resumes(tmp_path):
    single, full, resumed = tmp_path / "single", tmp_path / "3d", tmp_path / "3d-resumed"
    run_script(SCRIPT, COMMON + ["--micro-batch-size", "8", "--output-dir", str(single), "--no-save-model"])
    run_script(SCRIPT, COMMON + THREE_D + ["--output-dir", str(full), "--dcp-dir", str(full / "dcp")], nproc=8,
               timeout=600)
    ref, got = train_rows(single), train_rows(full)
    assert len(got) == len(ref) == STEPS
    for g, r in zip(got, ref):
        assert abs(g["loss"] - r["loss"]) <= LOSS_RTOL * abs(r["loss"]), (g["step"], g["loss"], r["loss"])
        assert abs(g["grad_norm"] - r["grad_norm"]) <= NORM_RTOL * abs(r["grad_norm"]), (g["step"], g, r)
    assert ref[-1]["loss"] < 0.95 * ref[0]["loss"]   # it learns: the comparison is not between flat curves
    _assert_layout_is_three_d(full)
    _assert_states_as_planned(full)
    _assert_dcp_loads_at_world_size_one(full)   # the 8 ranks' shards = the consolidated final/ save

    # the second launch finds the first one's step-16 checkpoint and trains steps 17-20 again
    run_script(SCRIPT, COMMON + THREE_D + ["--output-dir", str(resumed), "--no-save-model",
                                           "--fault-checkpoint-dir", str(full / "checkpoints")], nproc=8, timeout=600)
    again = train_rows(resumed)
    assert [r["step"] for r in again] == list(range(RESUME_AT + 1, STEPS + 1))
    for a, g in zip(again, got[RESUME_AT:]):
        assert abs(a["loss"] - g["loss"]) <= RESUME_RTOL * abs(g["loss"]), (a["step"], a["loss"], g["loss"])
    summary = json.loads((resumed / "summary.json").read_text())
    assert summary["checkpoint"]["resumed_from_step"] == RESUME_AT


def _assert_layout_is_three_d(out: Path) -> None:
    """Each rank's coordinates, its stage's blocks under their unsplit names, sharded over dp and tp."""
    layout = json.loads((out / "parallel_layout.json").read_text())
    assert layout["dims"] == {"dp": 2, "tp": 2, "pp": 2, "world_size": 8}
    for rank in layout["ranks"]:
        params = {p["name"]: p for p in rank["params"]}
        stage = rank["coords"]["pp"]
        qkv = params[f"transformer.h.{stage}.self_attention.query_key_value.weight"]
        assert qkv["mesh_dims"] == ["dp", "tp"] and qkv["local_shape"][0] * 4 == qkv["global_shape"][0], qkv
        assert not any(f"transformer.h.{1 - stage}." in name for name in params)
        assert ("lm_head.weight" in params) == (stage == 1)
        assert ("transformer.word_embeddings.weight" in params) == (stage == 0)


def _assert_states_as_planned(out: Path) -> None:
    """Every rank's measured bytes of weights, gradients and AdamW moments are the planner's for its (pp, dp, tp)
    place: FSDP2's dim-0 shard of its stage's tp slice, 16 bytes per element (1e-3: the AdamW step counters)."""
    layout = json.loads((out / "parallel_layout.json").read_text())
    vocab = next(p["global_shape"][0] for p in layout["ranks"][0]["params"] if p["name"].endswith("embeddings.weight"))
    shape = model_shape("tiny", vocab)
    inp = PlanInput(model="tiny", world_size=8, strategy="tp", tp=2, pp=2, precision="fp32", vocab_size=vocab)
    for rank in layout["ranks"]:
        c = rank["coords"]
        planned = state_bytes_of_rank(inp, local_params(shape, 2, 2, c["pp"]), c["dp"])
        formula = planned["params"] + planned["grads"] + planned["optimizer"]
        assert abs(rank["memory"]["total"] / formula - 1) <= 1e-3, (rank["rank"], rank["memory"], formula)
