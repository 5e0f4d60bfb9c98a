"""The guides' claims ledger: every verdict comes from its function, and the functions change their verdict
when the evidence changes (a fabricated GPU report, other benchmark rows)."""

from __future__ import annotations

import dataclasses
import inspect
import json
import os
import shutil
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import pytest

from ecomkit.errors import USER_ERROR_EXIT, ConfigError
from ecomlab import artifacts
from ecomlab.artifacts import REPO, REPO_RESULTS, RESULTS_ENV, results_dir
import ecomlab.claims as claims
from ecomlab.claims import ch02, ch03, ch05, ch06, ch06_memory, verdicts
from ecomlab.claims.__main__ import main as claims_main
from ecomlab.claims.evidence import Evidence, load_evidence
from ecomlab.claims.planner_comparisons import ECOMGPT_SETUP, SEQGPT_SETUP
from ecomlab.claims.render import counts_table, render_readme, stale
from ecomlab.claims.rules import amp_finding, memory_finding, padding_finding, speedup_finding, topk_cut_finding
from ecomlab.claims.verdicts import (CPU_ANALOGUE, IMPLAUSIBLE, NEEDS_GPU, NOT_MEASURABLE, REFUTED, REPRODUCED,
                                     VERDICTS, Finding, model_band)

ENTRY_MODULES = ("ch01", "ch02", "ch03", "ch04", "ch05", "ch06", "ch06_memory", "ch07")
VERDICT_NAMES = ("REPRODUCED", "CPU_ANALOGUE", "REFUTED", "IMPLAUSIBLE", "NEEDS_GPU", "NOT_MEASURABLE")
NO_GPU = Evidence()


A100, RTX4090 = "NVIDIA A100-SXM4-40GB", "NVIDIA GeForce RTX 4090"   # what torch.cuda.get_device_name returns


def gpu_report(section: str, rows: list[dict], gpu: str = A100, dry_run: bool = False) -> Evidence:
    """A fabricated GPU report holding one section, laid out as benchmarks/common.write_artifact writes it."""
    return Evidence({"gpu_bench": {"gpu": gpu, "rows": [], "extra": {"dry_run": dry_run, section: rows}}},
                    {"gpu_bench": "gpu_bench-fabricated.json"})


def scaling(model: str, strategy: str, one: float, four: float) -> list[dict]:
    """``scaling`` rows: samples/s of ``model`` on 1 and 4 GPUs."""
    return [{"model": model, "strategy": strategy, "gpus": g, "samples_per_s": s} for g, s in ((1, one), (4, four))]


# ---------------------------------------------------------------------- the ledger itself
def test_entries_carry_no_verdict():
    """A claim has no verdict field and no field holding a verdict; entry modules never name one."""
    fields = {f.name for f in dataclasses.fields(claims.Claim)}
    assert "verdict" not in fields and "decide" in fields
    for c in claims.LEDGER:
        assert callable(c.decide), c.id
        assert not any(getattr(c, f) in VERDICTS for f in fields - {"decide"}), c.id
    for name in ENTRY_MODULES:
        src = Path(inspect.getfile(getattr(claims, name))).read_text()
        assert not [v for v in VERDICTS if f'"{v}"' in src or f"'{v}'" in src], name
        assert not [n for n in VERDICT_NAMES if n in src], name
        assert "Finding(" not in src, name   # findings are built by the rules in verdicts.py only
        assert "holds(True" not in src and "holds(False" not in src, name   # a condition, not a constant


def test_ids_unique_and_issue_claims_present():
    ids = [c.id for c in claims.LEDGER]
    assert len(ids) == len(set(ids))
    # the issue's list: S0 single-GPU baseline … async checkpoints; S1 data parallel … version pin
    assert len([i for i in ids if i.startswith("S0-")]) >= 30 and len([i for i in ids if i.startswith("S1-")]) >= 17
    assert {c.chapter for c in claims.LEDGER} >= {2, 3, 4, 5, 6, 7}


def test_every_row_verdict_is_what_its_function_returns(monkeypatch):
    """Walk the ledger once with each decide function wrapped: the row's verdict is exactly its return value."""
    returned: dict[str, Finding] = {}

    def spy(c):
        def decide(ev):
            returned[c.id] = c.decide(ev)
            return returned[c.id]
        return replace(c, decide=decide)

    monkeypatch.setattr(claims, "LEDGER", [spy(c) for c in claims.LEDGER])
    rows = claims.ledger_rows(evidence=load_evidence())
    assert len(rows) == len(returned) == len(claims.LEDGER)
    for r in rows:
        assert isinstance(returned[r["id"]], Finding)
        assert r["verdict"] == returned[r["id"]].verdict in VERDICTS
        assert r["reason"] and r["evidence"], r["id"]
        if r["verdict"] == NEEDS_GPU:        # a needs-GPU row names what will decide it
            assert "gpu_bench.py" in r["reason"] or "GPU" in r["reason"], r
    assert sum(claims.verdict_counts(rows).values()) == len(rows)


def test_finding_rejects_an_unknown_verdict():
    with pytest.raises(ValueError, match="unknown verdict"):
        Finding("probably true", "", "", "")


# ---------------------------------------------------------------------- speed-up
def test_speedup_without_gpu_report_uses_the_time_model_band():
    inp = replace(ECOMGPT_SETUP, world_size=4)
    assert speedup_finding(NO_GPU, 3.7, inp, 4, "nvlink-a100").verdict == REFUTED         # above the whole band
    assert speedup_finding(NO_GPU, 87 / 31, replace(SEQGPT_SETUP, world_size=4), 4, "pcie4-x16").verdict == NEEDS_GPU
    assert model_band(4.5, 4, 1.0, 3.0, evidence="", source="", gpu_measurement="x").verdict == IMPLAUSIBLE


def test_fabricated_gpu_report_flips_speedup_verdicts():
    rows = scaling("ecomgpt-7b", "zero2", 1.0, 3.6) + scaling("seqgpt-560m", "ddp", 10.0, 29.0)
    ecom = replace(ECOMGPT_SETUP, world_size=4)
    assert speedup_finding(gpu_report("scaling", rows), 3.7, ecom, 4, "nvlink-a100").verdict == REPRODUCED
    seq, ev = replace(SEQGPT_SETUP, world_size=4), gpu_report("scaling", rows, RTX4090)
    assert speedup_finding(ev, 87 / 31, seq, 4, "pcie4-x16").verdict == REPRODUCED     # 2.9× measured vs 2.81×
    assert speedup_finding(ev, 3.7, seq, 4, "pcie4-x16").verdict == REFUTED            # 2.9× is not 3.7×
    dry = gpu_report("scaling", rows, RTX4090, dry_run=True)
    assert speedup_finding(dry, 87 / 31, seq, 4, "pcie4-x16").verdict == NEEDS_GPU     # a CPU dry run decides nothing
    other_board = gpu_report("scaling", rows, "NVIDIA H100 80GB HBM3")
    assert speedup_finding(other_board, 87 / 31, seq, 4, "pcie4-x16").verdict == NEEDS_GPU   # nor does an H100


def test_gpu_report_file_on_disk_flips_a_ledger_row(tmp_path):
    """The ledger's S0-03 (3.7× on 4 GPUs) is refuted by the model, reproduced by a committed report showing 3.6×."""
    s0_03 = next(c for c in claims.LEDGER if c.id == "S0-03")
    assert s0_03.decide(load_evidence(tmp_path)).verdict == REFUTED
    rows = scaling("ecomgpt-7b", "zero2", 1.0, 3.6)
    doc = {"bench": "gpu_bench", "gpu": A100, "rows": [], "extra": {"dry_run": False, "scaling": rows}}
    (tmp_path / "gpu_bench-2026-12-01-a100-sxm4-40gb.json").write_text(json.dumps(doc))
    assert s0_03.decide(load_evidence(tmp_path)).verdict == REPRODUCED


# ---------------------------------------------------------------------- memory
def test_memory_claims():
    e8 = replace(ECOMGPT_SETUP, world_size=8)
    assert memory_finding(NO_GPU, 36.0, e8).verdict == NEEDS_GPU                        # within 20 % of the plan
    assert memory_finding(NO_GPU, 60.0, e8).verdict == REFUTED
    row = {"model": "ecomgpt-7b", "strategy": "zero2", "gpus": 8, "micro_batch": 4, "seq_len": 1024}
    assert memory_finding(gpu_report("memory", [{**row, "peak_bytes": 35e9}]), 36.0, e8).verdict == REPRODUCED
    assert memory_finding(gpu_report("memory", [{**row, "peak_bytes": 20e9}]), 36.0, e8).verdict == REFUTED
    assert ch03._minus_28(NO_GPU).verdict == IMPLAUSIBLE        # naive DP of 7B (16Ψ = 113 GB) fits no 40 GB card
    assert ch03._zero3(NO_GPU).verdict == IMPLAUSIBLE           # activations of batch 24 alone exceed 16.8 GB


# ---------------------------------------------------------------------- Top-K
def test_topk_claims():
    assert topk_cut_finding(0.75, 0.25).verdict == IMPLAUSIBLE      # values + indices: at most −50 % at k = 25 %
    assert topk_cut_finding(0.40, 0.25).verdict == REFUTED          # possible for sparse Top-K, not the guide's code
    assert topk_cut_finding(0.0, 0.25).verdict == CPU_ANALOGUE      # its dense all-reduce saves nothing
    assert ch05.outlier_survives_topk() is True                     # Top-K keeps the anomalous gradient
    assert ch05._sync_time(NO_GPU).verdict == IMPLAUSIBLE


# ---------------------------------------------------------------------- padding
PADDING = [{"measure": "padding", "task": "lm", "shape": "8 x 1 x 1", "bucketed %": 1.5, "random %": 43.0}]


def test_padding_claim_flips_with_the_artifact():
    assert padding_finding(PADDING, 38, 12, "x").verdict == CPU_ANALOGUE
    worse = [{**PADDING[0], "bucketed %": 20.0}]
    assert padding_finding(worse, 38, 12, "x").verdict == REFUTED
    assert padding_finding(None, 38, 12, "x").verdict == NOT_MEASURABLE
    assert ch06_memory._frees_26(NO_GPU).verdict == IMPLAUSIBLE      # model states do not shrink with padding


# ---------------------------------------------------------------------- mixed precision
def test_amp_claims():
    inp = replace(SEQGPT_SETUP, precision="fp16")
    assert amp_finding(NO_GPU, 1.15, 0.20, inp).verdict == NEEDS_GPU
    assert amp_finding(NO_GPU, 2.5, 0.20, inp).verdict == IMPLAUSIBLE      # above the 4090's fp16/fp32 peak ratio
    assert amp_finding(NO_GPU, 1.15, 0.60, inp).verdict == IMPLAUSIBLE     # fp32 model states stay under autocast
    rows = [{"model": "seqgpt-560m", "precision": "fp32", "tokens_per_s": 1000.0, "peak_bytes": 10e9},
            {"model": "seqgpt-560m", "precision": "fp16", "tokens_per_s": 1160.0, "peak_bytes": 8.1e9}]
    assert amp_finding(gpu_report("precision", rows, RTX4090), 1.15, 0.20, inp).verdict == REPRODUCED
    rows[1] = {**rows[1], "tokens_per_s": 1800.0}
    assert amp_finding(gpu_report("precision", rows, RTX4090), 1.15, 0.20, inp).verdict == REFUTED


# ---------------------------------------------------------------------- other rules
def test_clipping_claim_needs_a_difference_beyond_the_seed_spread():
    base = {"eval_loss": 1.0, "acc_sentiment": 0.9, "acc_category": 0.9, "majority_sentiment": 0.5,
            "majority_category": 0.2, "clip_min": 1.0, "clip_max": 1.0, "clipped_fraction": 0.5}
    rows = [{**base, "policy": p, "seed": s, "acc_category": 0.9 + 0.001 * s + (0.05 if p == "sentiment" else 0)}
            for p in ("fixed", "sentiment") for s in range(3)]
    assert ch02.clipping_findings(rows, "x").verdict == CPU_ANALOGUE
    same = [{**r, "acc_category": 0.9 + 0.001 * r["seed"]} for r in rows]
    assert ch02.clipping_findings(same, "x").verdict == REFUTED


def test_cost_and_baseline_rows():
    assert ch06._cost(NO_GPU).verdict == IMPLAUSIBLE      # 7.2 × 14.9 % = 1.07× the cost per run, same loss
    low, high = ch06.step_time_band()
    assert 0 < low <= high


def test_load_evidence_takes_the_newest_artifact(tmp_path):
    for date, value in (("2026-01-01", 1), ("2026-02-01", 2)):
        (tmp_path / f"bench_x-{date}-cpu2.json").write_text(json.dumps({"rows": [{"v": value}]}))
    ev = load_evidence(tmp_path)
    assert ev.rows("bench_x") == [{"v": 2}] and ev.where("bench_x").endswith("2026-02-01-cpu2.json")
    assert ev.rows("bench_missing") is None and ev.gpu_rows("scaling") == []


# ---------------------------------------------------------------------- rendering
def test_readme_counts_block_and_stale_detection(tmp_path):
    counts = {v: i for i, v in enumerate(VERDICTS)}
    text = "# x\n<!-- claims:counts -->\nold\n<!-- /claims:counts -->\n"
    out = render_readme(text, counts)
    assert counts_table(counts) in out and "old" not in out
    with pytest.raises(ValueError, match="claims:counts"):
        render_readme("# no markers\n", counts)
    page, readme = tmp_path / "claims.md", tmp_path / "README.md"
    page.write_text("page"), readme.write_text(out)
    assert stale("page", out, page, readme) == []
    assert stale("page", render_readme(text, {**counts, REFUTED: 99}), page, readme) == [str(readme)]
    assert stale("new page", out, page, readme) == [str(page)]
    assert verdicts.VERDICTS == VERDICTS


# ---------------------------------------------------------------------- where the artifacts are
def _artifact(folder: Path, value: str) -> Path:
    folder.mkdir(parents=True)
    path = folder / "bench_x-2026-01-01-cpu2.json"
    path.write_text(json.dumps({"rows": [{"v": value}]}))
    return path


def test_the_artifacts_folder_is_the_flag_then_the_environment_then_the_repositorys(tmp_path, monkeypatch):
    monkeypatch.delenv(RESULTS_ENV, raising=False)
    assert results_dir() == REPO_RESULTS == REPO / "benchmarks" / "results"
    assert load_evidence().where("bench_ddp").startswith("benchmarks/results/bench_ddp-")   # named in the repository
    env = _artifact(tmp_path / "env", "env")
    _artifact(tmp_path / "flag", "flag")
    monkeypatch.setenv(RESULTS_ENV, str(env.parent))
    assert load_evidence().rows("bench_x") == [{"v": "env"}] and load_evidence().where("bench_x") == str(env)
    assert load_evidence(tmp_path / "flag").rows("bench_x") == [{"v": "flag"}]
    assert claims.ledger_rows() and claims.chapter_rows(2)      # every claim decides on a folder without its benches


def test_a_missing_artifacts_folder_is_an_error_naming_it_and_how_to_point_elsewhere(tmp_path, monkeypatch, capsys):
    monkeypatch.delenv(RESULTS_ENV, raising=False)
    installed = tmp_path / "site-packages" / "benchmarks" / "results"     # an installed package: no checkout around it
    monkeypatch.setattr(artifacts, "REPO_RESULTS", installed)
    with pytest.raises(ConfigError) as err:
        claims.ledger_rows()
    assert str(installed) in str(err.value) and "--results DIR" in str(err.value)
    assert f"{RESULTS_ENV}=DIR" in str(err.value)
    monkeypatch.setenv(RESULTS_ENV, str(tmp_path / "nowhere"))
    with pytest.raises(ConfigError, match=rf"{tmp_path / 'nowhere'} \(\${RESULTS_ENV}\)"):
        load_evidence()
    with pytest.raises(SystemExit) as done:
        claims_main(["--check", "--results", str(tmp_path / "gone")])
    assert done.value.code == USER_ERROR_EXIT and f"{tmp_path / 'gone'} (--results)" in capsys.readouterr().err


def test_an_installed_copy_reads_the_folder_it_is_given_and_names_the_one_it_lacks(tmp_path):
    """The packages copied without the repository, as pip installs them, in a fresh process."""
    site = tmp_path / "site"
    for package in ("ecomkit", "ecomlab"):
        shutil.copytree(REPO / package, site / package, ignore=shutil.ignore_patterns("__pycache__"))
    code = ("import os\nfrom ecomkit.errors import ConfigError\nfrom ecomlab.artifacts import results_dir\n"
            f"given = os.environ.pop({RESULTS_ENV!r})\n"
            "try:\n    results_dir()\nexcept ConfigError as e:\n    print('ERROR', e)\n"
            f"os.environ[{RESULTS_ENV!r}] = given\n"
            "from ecomlab.claims import ledger_rows\nprint('ROWS', len(ledger_rows()))\n")
    env = {**os.environ, "PYTHONPATH": str(site), RESULTS_ENV: str(REPO_RESULTS)}
    out = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, env=env, capture_output=True, text=True,
                         timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    assert f"ERROR no benchmark artifacts at {site / 'benchmarks' / 'results'}" in out.stdout, out.stdout
    assert f"ROWS {len(claims.LEDGER)}" in out.stdout, out.stdout
