"""The time model against real 2-process steps, from inputs measured apart from the runs it predicts.

Unit tests cover the pure parts (the α-β fit, the measured "GPU" and links,
the prediction assembly). The 2-process job that checks the predictions of DDP,
ZeRO-2 and FSDP2 steps against training runs of chapter 02's loop, within 25 %
with one rerun on a miss, is notebook 06's calibration cell (run serially by make test).
"""

from __future__ import annotations

import copy

import pytest
import torch

from ecomkit.config import TrainConfig
from ecomkit.models.bloom import build_model, flops_per_token, preset_config
from ecomkit.models.loss import TokenLoss
from ecomkit.planner.shapes import model_shape
from ecomkit.planner.step_time import all_gather_s, all_reduce_s, reduce_scatter_s
from ecomlab.measure.activations import causal_lm_loss
from ecomlab.measure.calibration import (ComputeMeasurement, LinkFit, allowed_error, calibrate_with_one_rerun,
                                         calibration_rows, fit_alpha_beta, input_drift, measured_device, measured_links,
                                         predict_cpu_step, training_loss, worst_ratio_error)


@pytest.mark.parametrize("kind, formula", [("all_reduce", all_reduce_s), ("all_gather", all_gather_s),
                                           ("reduce_scatter", reduce_scatter_s)])
@pytest.mark.parametrize("n", [2, 4])
def test_the_fit_recovers_alpha_and_bandwidth_of_its_own_ring_formula(kind, formula, n):
    truth = measured_links(LinkFit(n, {kind: (80e-6, 0.7e9)}))[kind]
    samples = [(s, formula(s, n, truth)) for s in (2**10 * 4**i for i in range(9))]
    alpha, bus = fit_alpha_beta(samples, n, kind)
    assert alpha == pytest.approx(80e-6, rel=1e-6) and bus == pytest.approx(0.7e9, rel=1e-6)
    with pytest.raises(ValueError):
        fit_alpha_beta(samples[:1], n, kind)


def _inputs():
    cfg = TrainConfig(model="small", precision="fp32", seq_len=32, micro_batch_size=4, grad_accum=2)
    model_config = preset_config("small", vocab_size=4003)
    psi = model_shape(model_config).n_params
    flops = 4 * 32 * flops_per_token(psi, model_config.n_layer, model_config.hidden_size, 32)
    m = ComputeMeasurement(4, 32, psi, fwd_bwd_s=0.6, optimizer_s=0.3, model_flops=flops)
    fit = LinkFit(2, {"all_reduce": (100e-6, 0.8e9), "all_gather": (2e-3, 0.15e9), "reduce_scatter": (4e-4, 0.2e9)})
    return cfg, model_config, psi, m, fit


def test_the_prediction_is_the_planners_with_measured_inputs_only():
    cfg, model_config, psi, m, fit = _inputs()
    device = measured_device(m)
    assert device.peak_flops("fp32") == pytest.approx(m.model_flops / m.fwd_bwd_s)
    links = measured_links(fit)
    ddp = predict_cpu_step(m, fit, "ddp", cfg, model_config)
    assert ddp.compute_s == pytest.approx(2 * m.fwd_bwd_s)              # the measured micro-step, × accumulation
    assert ddp.optimizer_s == pytest.approx(m.optimizer_s)               # all Ψ on every rank
    assert ddp.comm_s == pytest.approx(all_reduce_s(4 * psi, 2, links["all_reduce"]))
    assert ddp.comm_exposed_s == pytest.approx(ddp.comm_s)               # overlap 0 on this CPU
    fsdp = predict_cpu_step(m, fit, "fsdp2", cfg, model_config)
    assert fsdp.optimizer_s == pytest.approx(m.optimizer_s / 2)          # half the parameters per rank
    expected = (2 * all_gather_s(2 * 4 * psi, 2, links["all_gather"])   # fwd + bwd gathers of two micro-steps
                + reduce_scatter_s(4 * psi, 2, links["reduce_scatter"]))
    assert fsdp.comm_s == pytest.approx(expected)
    zero2 = predict_cpu_step(m, fit, "zero2", cfg, model_config)
    assert zero2.comm_s == pytest.approx(all_reduce_s(2 * 4 * psi, 2, links["all_reduce"])   # DeepSpeed's bucket
                                         + all_gather_s(4 * psi, 2, links["all_gather"]))     # all-reduce
    with pytest.raises(ValueError, match="parameters"):
        predict_cpu_step(ComputeMeasurement(4, 32, psi + 1, 0.6, 0.3, 3e9), fit, "ddp", cfg, model_config)


def test_fsdp2_and_zero2_are_priced_with_their_own_one_rank_engines():
    """FSDP2's and DeepSpeed's CPU work, measured on a one-rank group, replace plain compute for them only."""
    cfg, model_config, psi, m, fit = _inputs()
    zero_before = predict_cpu_step(m, fit, "zero2", cfg, model_config)
    assert zero_before.compute_s == pytest.approx(2 * m.fwd_bwd_s)       # not measured: plain compute
    m.fsdp_fwd_bwd_s, m.fsdp_optimizer_s = 0.9, 0.5
    m.zero_fwd_bwd_s, m.zero_optimizer_s = 0.8, 0.7
    fsdp = predict_cpu_step(m, fit, "fsdp2", cfg, model_config)
    assert fsdp.compute_s == pytest.approx(2 * 0.9) and fsdp.optimizer_s == pytest.approx(0.5 / 2)
    zero2 = predict_cpu_step(m, fit, "zero2", cfg, model_config)
    assert zero2.compute_s == pytest.approx(2 * 0.8) and zero2.optimizer_s == pytest.approx(0.7 / 2)
    assert zero2.comm_s == pytest.approx(zero_before.comm_s)             # the engine changes no traffic
    ddp = predict_cpu_step(m, fit, "ddp", cfg, model_config)
    assert ddp.compute_s == pytest.approx(2 * m.fwd_bwd_s) and ddp.optimizer_s == pytest.approx(m.optimizer_s)
    assert m.for_strategy("zero1") == (m.fwd_bwd_s, m.optimizer_s)


def test_fsdp2_collectives_are_priced_by_their_own_sweep_when_there_is_one():
    cfg, model_config, psi, m, fit = _inputs()
    plain = predict_cpu_step(m, fit, "fsdp2", cfg, model_config)
    fit.fits |= {"fsdp_all_gather": (3e-3, 0.1e9), "fsdp_reduce_scatter": (5e-4, 0.1e9)}
    links = measured_links(fit)
    fsdp = predict_cpu_step(m, fit, "fsdp2", cfg, model_config)
    assert fsdp.comm_s == pytest.approx(2 * all_gather_s(2 * 4 * psi, 2, links["fsdp_all_gather"])
                                        + reduce_scatter_s(4 * psi, 2, links["fsdp_reduce_scatter"]))
    assert fsdp.comm_s > plain.comm_s
    zero2 = predict_cpu_step(m, fit, "zero2", cfg, model_config)   # DeepSpeed's all-gather: the plain sweep
    assert zero2.comm_s == pytest.approx(all_reduce_s(2 * 4 * psi, 2, links["all_reduce"])
                                         + all_gather_s(4 * psi, 2, links["all_gather"]))


def test_the_probe_times_the_loss_the_loop_runs():
    """Given the run's chunked loss the probe goes through it (its backward recomputes the head), same value."""
    torch.manual_seed(0)
    model = build_model("tiny", vocab_size=300)
    ids = torch.randint(3, 300, (2, 16))
    mask = torch.ones_like(ids)
    chunked = copy.deepcopy(model)
    calls = []
    chunked.lm_head.register_forward_hook(lambda *a: calls.append(1))
    loss = training_loss(chunked, ids, mask, TokenLoss("chunked", 8))
    loss.backward()
    assert len(calls) >= 2 * 2          # two chunks, each head forward run again in backward
    assert float(loss.detach()) == pytest.approx(float(causal_lm_loss(model, ids, mask).detach()), rel=1e-5)
    assert float(training_loss(model, ids, mask).detach()) == pytest.approx(float(loss.detach()), rel=1e-5)


def test_rows_carry_the_ratio_and_the_worst_error():
    cfg, model_config, _, m, fit = _inputs()
    ddp = predict_cpu_step(m, fit, "ddp", cfg, model_config).total_s
    rows = calibration_rows(m, fit, {"ddp": ddp * 1.25, "fsdp2": 10.0}, cfg, model_config)
    assert [r["strategy"] for r in rows] == ["ddp", "fsdp2"]
    assert rows[0]["ratio"] == pytest.approx(0.8) and rows[0]["measured_s"] == pytest.approx(ddp * 1.25)
    assert worst_ratio_error(rows) == pytest.approx(max(0.2, abs(rows[1]["ratio"] - 1)))


def test_a_second_job_runs_only_when_a_claimed_row_misses():
    def jobs(*ratios_per_attempt):
        calls = []

        def job(attempt):
            calls.append(attempt)
            return {"rows": [{"strategy": s, "ratio": r} for s, r in ratios_per_attempt[attempt].items()]}
        return job, calls

    job, calls = jobs({"ddp": 0.9, "zero2": 1.2})           # every row within: no rerun
    report, reports = calibrate_with_one_rerun(job, 0.25)
    assert calls == [0] and reports == [report]
    job, calls = jobs({"ddp": 0.9, "fsdp2": 0.6}, {"ddp": 0.9, "fsdp2": 0.8})   # any row's miss reruns
    report, reports = calibrate_with_one_rerun(job, 0.25)
    assert calls == [0, 1] and report["rows"][1]["ratio"] == 0.8
    job, calls = jobs({"ddp": 0.74}, {"ddp": 1.1})           # a miss: one fresh job, same tolerance
    report, reports = calibrate_with_one_rerun(job, 0.25)
    assert calls == [0, 1] and report["rows"][0]["ratio"] == 1.1 and len(reports) == 2
    job, calls = jobs({"ddp": 0.7}, {"ddp": 0.7})            # a second miss is returned for the caller to fail
    report, reports = calibrate_with_one_rerun(job, 0.25)
    assert calls == [0, 1] and report["rows"][0]["ratio"] == 0.7


def test_input_drift_is_how_far_the_prediction_moves_with_its_inputs_timed_again():
    """Either direction counts; the measured step plays no part (it is what the drift bounds the check against)."""
    row, again = {"predicted_s": 0.5, "measured_s": 9.0}, {"predicted_s": 0.4, "measured_s": 1.0}
    assert input_drift(row, again) == pytest.approx(0.2)
    assert input_drift({"predicted_s": 0.6}, {"predicted_s": 1.2}) == pytest.approx(1.0)
    assert input_drift({"predicted_s": 0.6}, {"predicted_s": 0.6}) == 0.0


def test_the_bound_is_the_tolerance_plus_the_rows_own_drift_and_a_miss_still_reruns():
    assert allowed_error({"ratio": 1.0}, 0.25) == 0.25                    # a row without a second timing
    assert allowed_error({"ratio": 1.0, "input_drift": 0.3}, 0.25) == pytest.approx(0.55)
    reports = iter([{"rows": [{"ratio": 1.5, "input_drift": 0.3}]}, {"rows": [{"ratio": 1.1, "input_drift": 0.0}]}])
    report, all_reports = calibrate_with_one_rerun(lambda attempt: next(reports), 0.25)
    assert len(all_reports) == 1 and report["rows"][0]["ratio"] == 1.5    # 50 % off, inside 25 % + 30 % drift
    reports = iter([{"rows": [{"ratio": 1.0, "input_drift": 0.5}, {"ratio": 1.3, "input_drift": 0.0}]},
                    {"rows": [{"ratio": 1.1, "input_drift": 0.0}]}])
    report, all_reports = calibrate_with_one_rerun(lambda attempt: next(reports), 0.25)
    assert len(all_reports) == 2 and report["rows"][0]["ratio"] == 1.1    # one row's drift widens no other row
