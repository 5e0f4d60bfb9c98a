"""``--loss-kernel``: the choice (``auto`` by device and measurement), the refusals, the fused kernels' glue.

The fused kernels themselves (liger-kernel, cut-cross-entropy) are Triton kernels: their equality with the
full-logits loss is checked on CUDA only (skipped here without a GPU). On a CPU the glue is checked against
stand-ins that follow each library's documented call (liger-kernel 0.8.5
``LigerFusedLinearCrossEntropyLoss.forward(lin_weight, _input, target, bias)``; cut-cross-entropy 25.1.1
``linear_cross_entropy(e, c, targets, ignore_index, softcap, reduction, shift)``), so a swapped argument or a
wrong reduction or shift fails here.
"""

from __future__ import annotations

import importlib.util
import json
import sys
import types
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

from ecomkit.config import TrainConfig, ZeroConfig
from ecomkit.errors import ConfigError
from ecomkit.hardware import gpu_kind
from ecomkit.models import loss as loss_mod
from ecomkit.models.bloom import build_model
from ecomkit.models.loss import (GPU_LOSS_KERNEL, TokenLoss, chunked_token_loss_sum, lm_loss_sum, pick_loss_kernel,
                                 token_loss_sum)
from ecomkit.models.loss_kernels import FUSED_LOSSES
from ecomkit.train.resolve import loss_kernel_choice
from ecomlab.derive.loss_kernel import fastest_loss_kernel

RESULTS = Path(__file__).resolve().parents[1] / "benchmarks" / "results"
VOCAB = 300


# ---------------------------------------------------------------------- the choice
def test_auto_keeps_the_chunked_loss_on_a_cpu_and_full_logits_when_chunks_are_off():
    assert pick_loss_kernel("auto", "cpu")[0] == "chunked"
    kernel, why = pick_loss_kernel("auto", "cpu", chunk_tokens=0)
    assert kernel == "full" and "--loss-chunk-tokens 0" in why
    assert pick_loss_kernel("cce", "cuda", "h200") == ("cce", "--loss-kernel cce as asked")
    assert pick_loss_kernel("full", "cpu")[0] == "full"


def test_auto_on_a_gpu_reads_the_measurement_of_its_kind_and_says_when_there_is_none():
    kernel, why = pick_loss_kernel("auto", "cuda", "h200", measured={})
    assert kernel == "chunked" and "unmeasured on this GPU (h200)" in why
    measured = {"h200": "liger", "a100-80g": "full"}
    assert pick_loss_kernel("auto", "cuda", "h200", measured=measured)[0] == "liger"
    assert pick_loss_kernel("auto", "cuda", "a100-80g", measured=measured)[0] == "full"
    assert pick_loss_kernel("auto", "cuda", "l40s", measured=measured)[0] == "chunked"
    kernel, why = pick_loss_kernel("auto", "cuda", "h200", measured=measured, installed=lambda k: False)
    assert kernel == "chunked" and "liger-kernel is not installed" in why and "ecomkit[gpu]" in why


def rows(**kernels: tuple[float, float]) -> list[dict]:
    """(step seconds, peak GiB) per kernel, two repeats each (the second 2 % slower)."""
    return [{"kernel": k, "status": "ok", "step_s": t * f, "peak_mem_bytes": gib * 2**30}
            for k, (t, gib) in kernels.items() for f in (1.0, 1.02)]


def test_fastest_kernel_is_the_fastest_within_the_chunked_losses_memory():
    assert fastest_loss_kernel(rows(chunked=(1.0, 20), full=(0.7, 40), liger=(0.8, 19), cce=(0.85, 18))) == "liger"
    # full logits are fastest but need twice the memory: not eligible
    assert fastest_loss_kernel(rows(chunked=(1.0, 20), full=(0.7, 40))) == "chunked"
    # a gain within LOSS_MIN_GAIN goes to the chunked loss
    assert fastest_loss_kernel(rows(chunked=(1.0, 20), cce=(0.97, 10))) == "chunked"
    assert fastest_loss_kernel(rows(chunked=(1.0, 20), full=(0.8, 21))) == "full"   # within the memory slack
    failed = rows(chunked=(1.0, 20)) + [{"kernel": "liger", "status": "out of memory"}]
    assert fastest_loss_kernel(failed) == "chunked"
    with pytest.raises(ValueError, match="chunked"):
        fastest_loss_kernel(rows(full=(1.0, 20)))


def newest_gpu_artifacts(bench: str) -> dict[str, dict]:
    """The newest non-dry-run artifact of ``bench`` per GPU kind (from its machine facts)."""
    newest: dict[str, dict] = {}
    for path in RESULTS.glob(f"{bench}-*.json"):
        doc = json.loads(path.read_text())
        gpu = doc.get("gpu")
        if not gpu or (doc.get("extra") or {}).get("dry_run"):
            continue
        kind = gpu_kind(gpu)
        if kind not in newest or doc["time_utc"] > newest[kind]["time_utc"]:
            newest[kind] = doc
    return newest


def test_gpu_table_is_the_committed_measurement_or_empty():
    """GPU_LOSS_KERNEL equals fastest_loss_kernel of the newest GPU gpu_bench artifact of each kind; none: empty."""
    measured = {kind: [r for r in doc["rows"] if r.get("part") == "loss_kernel"]
                for kind, doc in newest_gpu_artifacts("gpu_bench").items()}
    measured = {kind: fastest_loss_kernel(r) for kind, r in measured.items() if r}
    assert GPU_LOSS_KERNEL == measured
    if not measured:   # the fallback: auto on any GPU keeps the chunked loss and says it is unmeasured
        kernel, why = pick_loss_kernel("auto", "cuda", "h200")
        assert kernel == "chunked" and "unmeasured on this GPU" in why


def test_a_run_resolves_auto_once_with_its_reason():
    cfg = TrainConfig()
    choice = loss_kernel_choice(cfg, "cpu", "cpu")   # train/resolve.py: the run's one resolution of it
    assert choice.value == "chunked" and choice.why.startswith("auto: chunked") and cfg.loss_kernel == "auto"
    assert loss_kernel_choice(TrainConfig(strategy="zero"), "cpu", "cpu").value == "chunked"   # ZeRO holds the head
    tp = loss_kernel_choice(TrainConfig(strategy="tp"), "cpu", "cpu")
    assert tp.value == "full" and "no rank holds the LM head whole" in tp.why


# ---------------------------------------------------------------------- the refusals
def test_liger_and_cce_are_refused_without_their_package_or_without_a_gpu(monkeypatch):
    for kernel, pip_name in (("liger", "liger-kernel"), ("cce", "cut-cross-entropy")):
        if importlib.util.find_spec(loss_mod.LOSS_KERNEL_PACKAGES[kernel][0]) is None:
            with pytest.raises(ConfigError, match=f"needs the {pip_name} package.*ecomkit\\[gpu\\].*--loss-kernel auto"):
                TrainConfig(loss_kernel=kernel).validate(1)
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: object() if name in (
        "liger_kernel", "cut_cross_entropy") else real(name, *a))
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    for kernel in ("liger", "cce"):
        with pytest.raises(ConfigError, match=f"--loss-kernel {kernel} runs .*CUDA GPU.*--loss-kernel chunked"):
            TrainConfig(loss_kernel=kernel).validate(1)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    TrainConfig(loss_kernel="liger").validate(1)       # with both, nothing to refuse
    with pytest.raises(ConfigError, match="--strategy tp: .*shards the LM head's output"):
        TrainConfig(loss_kernel="liger", strategy="tp").validate(2)
    # ZeRO: liger at every stage (ZeRO-3 gathers the head for its forward); cce, whose backward reads the weight,
    # at stages 1 and 2 only
    for stage in (1, 2, 3):
        TrainConfig(loss_kernel="liger", strategy="zero", zero=ZeroConfig(stage=stage)).validate(2)
    TrainConfig(loss_kernel="cce", strategy="zero", zero=ZeroConfig(stage=2)).validate(2)
    with pytest.raises(ConfigError, match="cce cannot run with --strategy zero --zero-stage 3.*--loss-kernel liger"):
        TrainConfig(loss_kernel="cce", strategy="zero", zero=ZeroConfig(stage=3)).validate(2)


def test_chunked_needs_chunks_and_unknown_kernels_are_named():
    with pytest.raises(ConfigError, match="--loss-kernel chunked with --loss-chunk-tokens 0.*--loss-kernel full"):
        TrainConfig(loss_kernel="chunked", loss_chunk_tokens=0).validate(1)
    with pytest.raises(ConfigError, match="Unknown loss_kernel 'ligr' \\(--loss-kernel\\).*Did you mean 'liger'"):
        TrainConfig(loss_kernel="ligr").validate(1)
    TrainConfig(loss_kernel="full", loss_chunk_tokens=0).validate(1)
    TrainConfig(loss_kernel="auto", loss_chunk_tokens=0).validate(1)


# ---------------------------------------------------------------------- the glue, against the documented calls
class FakeLiger(torch.nn.Module):
    """liger-kernel's ``LigerFusedLinearCrossEntropyLoss``: flat, already shifted rows; reduction as asked."""

    def __init__(self, ignore_index: int = -100, reduction: str = "mean", **_):
        super().__init__()
        self.ignore_index, self.reduction = ignore_index, reduction

    def forward(self, lin_weight, _input, target, bias=None):
        assert lin_weight.shape[0] == VOCAB and _input.dim() == 2 and target.dim() == 1
        return F.cross_entropy(F.linear(_input, lin_weight, bias).float(), target, ignore_index=self.ignore_index,
                               reduction=self.reduction)


def fake_cce(e, c, targets, ignore_index=-100, softcap=None, reduction="mean", shift=False, filter_eps="high",
             impl="cce"):
    """cut-cross-entropy's ``linear_cross_entropy``: ``F.cross_entropy((e @ c.T).float(), targets)``."""
    assert e.dtype == c.dtype and c.shape[0] == VOCAB
    if shift:
        e, targets = e[..., :-1, :], targets[..., 1:]
    return F.cross_entropy((e.flatten(0, -2) @ c.T).float(), targets.flatten(), ignore_index=ignore_index,
                           reduction=reduction)


@pytest.fixture
def fake_libraries(monkeypatch):
    liger = types.ModuleType("liger_kernel")
    sub = types.ModuleType("liger_kernel.transformers")
    flce = types.ModuleType("liger_kernel.transformers.fused_linear_cross_entropy")
    flce.LigerFusedLinearCrossEntropyLoss = FakeLiger
    cce = types.ModuleType("cut_cross_entropy")
    cce.linear_cross_entropy = fake_cce
    for name, mod in (("liger_kernel", liger), ("liger_kernel.transformers", sub),
                      ("liger_kernel.transformers.fused_linear_cross_entropy", flce), ("cut_cross_entropy", cce)):
        monkeypatch.setitem(sys.modules, name, mod)


def _data(batch: int = 3, seq: int = 20, hidden: int = 16):
    g = torch.Generator().manual_seed(0)
    h = torch.randn(batch, seq, hidden, generator=g, requires_grad=True)
    labels = torch.randint(0, VOCAB, (batch, seq), generator=g)
    labels[0, 12:] = -100          # right padding
    labels[2, :5] = -100           # an NLU prompt: loss on the answer only
    return h, labels, torch.nn.Linear(hidden, VOCAB, bias=False)


@pytest.mark.parametrize("kernel", ["liger", "cce"])
def test_fused_glue_sums_the_shifted_labeled_positions(fake_libraries, kernel):
    h, labels, head = _data()
    ref = token_loss_sum(head(h), labels)
    ref_grads = torch.autograd.grad(ref, [h, head.weight])
    got = chunked_token_loss_sum(h, head, labels, 1024, fused=FUSED_LOSSES[kernel])
    grads = torch.autograd.grad(got, [h, head.weight])
    assert torch.allclose(got, ref, rtol=1e-6, atol=0)
    for g, r in zip(grads, ref_grads):
        assert torch.allclose(g, r, rtol=1e-5, atol=1e-7)


def test_cce_multiplies_in_the_autocast_dtype_and_returns_fp32(fake_libraries):
    h, labels, head = _data()
    seen = []
    real = sys.modules["cut_cross_entropy"].linear_cross_entropy
    sys.modules["cut_cross_entropy"].linear_cross_entropy = lambda e, c, *a, **k: seen.append((e.dtype, c.dtype)) \
        or real(e, c, *a, **k)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        got = chunked_token_loss_sum(h, head, labels, 1024, fused=FUSED_LOSSES["cce"])
    got.backward()
    assert seen == [(torch.bfloat16, torch.bfloat16)] and got.dtype == torch.float32
    assert head.weight.grad.dtype == torch.float32


@pytest.mark.parametrize("kernel", ["liger", "cce"])
def test_a_fused_token_loss_gives_the_full_logits_loss_through_the_model(fake_libraries, kernel):
    torch.manual_seed(0)
    model = build_model("tiny", vocab_size=VOCAB)
    ids = torch.randint(3, VOCAB, (2, 16))
    mask = torch.ones_like(ids)
    mask[1, 11:] = 0
    labels = ids.masked_fill(mask == 0, -100)
    ref = token_loss_sum(model(input_ids=ids, attention_mask=mask).logits, labels)
    got = lm_loss_sum(model, TokenLoss(kernel), ids, mask, labels)
    assert torch.allclose(got, ref, rtol=1e-5, atol=0)
    with pytest.raises(ConfigError, match="choose full, chunked or liger or cce"):
        TokenLoss("fused")


# ---------------------------------------------------------------------- the real kernels (CUDA)
def _cuda_with(package: str) -> bool:
    return torch.cuda.is_available() and importlib.util.find_spec(package) is not None


@pytest.mark.parametrize("kernel, package", [("liger", "liger_kernel"), ("cce", "cut_cross_entropy")])
@pytest.mark.parametrize("precision", ["fp32", "bf16"])
def test_fused_kernel_equals_full_logits_on_cuda(kernel, package, precision):
    if not _cuda_with(package):
        pytest.skip(f"needs a CUDA GPU and {package} (pip install 'ecomkit[gpu]')")
    torch.manual_seed(0)
    device = torch.device("cuda")
    hidden, vocab = 256, 250_880          # BLOOM's vocabulary
    h = torch.randn(4, 128, hidden, device=device, requires_grad=True)
    labels = torch.randint(0, vocab, (4, 128), device=device)
    labels[0, 90:] = -100
    labels[3, :40] = -100
    head = torch.nn.Linear(hidden, vocab, bias=False, device=device)
    ctx = torch.autocast("cuda", dtype=torch.bfloat16) if precision == "bf16" else torch.autocast("cuda", enabled=False)
    with ctx:
        ref = token_loss_sum(head(h), labels)
    ref_grads = torch.autograd.grad(ref, [h, head.weight])
    with ctx:
        got = chunked_token_loss_sum(h, head, labels, 1024, fused=FUSED_LOSSES[kernel])
    grads = torch.autograd.grad(got, [h, head.weight])
    tol = 1e-4 if precision == "fp32" else 2e-2
    assert torch.allclose(got.float(), ref.float(), rtol=tol, atol=0), (got, ref)
    for g, r in zip(grads, ref_grads):
        assert torch.allclose(g.float(), r.float(), rtol=tol, atol=tol * r.abs().max().item()), kernel
