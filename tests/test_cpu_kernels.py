"""ecomkit's fused CPU kernels (GeLU, cross-entropy) against ATen: values, gradients, ignored rows, tails, fallbacks.

The kernels are built from source on first use (``make install`` builds them); without a compiler every test
here is skipped with the build's reason. A CPU without AVX-512 runs the scalar build of the same arithmetic,
which these tests check too (training then uses ATen's kernels; ``kernels_for`` says so).
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from ecomkit.models.bloom import build_model
from ecomkit.fast.cpu_kernels import (FusedBloomGelu, KernelBloomGelu, cross_entropy_sum, gelu_tanh, install_fused_gelu,
                                      kernel_applies, kernel_cross_entropy_sum, kernels_for, load_cpu_kernels)
from ecomkit.models.loss import TokenLoss, lm_loss_sum
from ecomkit.models.loss import cross_entropy_sum as ce_sum

STATUS = load_cpu_kernels()
pytestmark = pytest.mark.skipif(not STATUS.available, reason=f"ecomkit CPU kernels: {STATUS.reason}")


def _gelu_grad(fn, x: torch.Tensor, g: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    x = x.detach().requires_grad_()
    y = fn(x)
    (dx,) = torch.autograd.grad(y, x, g)
    return y.detach(), dx


@pytest.mark.parametrize("n", [1, 15, 16, 17, 4099])   # masked tails of the 16-wide loop
def test_gelu_matches_aten_in_fp32(n):
    gen = torch.Generator().manual_seed(n)
    x = torch.randn(n, generator=gen) * 4
    x[0] = 0.0
    g = torch.randn(n, generator=gen)
    yk, dk = _gelu_grad(lambda t: gelu_tanh(t, True), x, g)
    ya, da = _gelu_grad(lambda t: F.gelu(t, approximate="tanh"), x, g)
    assert (yk - ya).abs().max().item() <= 2e-6
    assert ((dk - da).abs() <= 2e-6 * (1 + g.abs() * 4)).all()


def test_gelu_in_bf16_is_the_fp32_value_rounded_once():
    gen = torch.Generator().manual_seed(1)
    x = (torch.randn(8, 33, 64, generator=gen) * 3).bfloat16()
    g = torch.randn(8, 33, 64, generator=gen).bfloat16()
    yk, dk = _gelu_grad(lambda t: gelu_tanh(t, True), x, g)
    assert yk.dtype == dk.dtype == torch.bfloat16
    ref_y = F.gelu(x.float(), approximate="tanh")
    eps = 2.0 ** -8   # half a bf16 ulp, relative; plus the kernel's ~1e-7 absolute
    assert ((yk.float() - ref_y).abs() <= eps * ref_y.abs() + 1e-6).all()
    _, ref_d = _gelu_grad(lambda t: F.gelu(t, approximate="tanh"), x.float(), g.float())
    assert ((dk.float() - ref_d).abs() <= eps * ref_d.abs() + 1e-5).all()


def test_gelu_saturates_and_propagates_nan():
    x = torch.tensor([-60.0, -12.0, 12.0, 60.0, float("nan")])
    y = gelu_tanh(x, True)
    assert torch.equal(y[:4], torch.tensor([0.0, 0.0, 12.0, 60.0]))   # -0.0 == 0.0
    assert torch.isnan(y[4])


def _ce(fn, z: torch.Tensor, y: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    z = z.detach().requires_grad_()
    loss = fn(z, y)
    (dz,) = torch.autograd.grad(loss * 0.5, z)   # a non-unit upstream gradient
    return loss.detach(), dz


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("vocab", [5, 16, 4700])
def test_cross_entropy_matches_aten_with_ignored_rows(dtype, vocab):
    gen = torch.Generator().manual_seed(vocab)
    z = (torch.randn(37, vocab, generator=gen) * 4).to(dtype)
    y = torch.randint(0, vocab, (37,), generator=gen)
    y[::4] = -100
    lk, dk = _ce(lambda t, yy: cross_entropy_sum(t, yy, True), z, y)
    la, da = _ce(lambda t, yy: F.cross_entropy(t.float(), yy, ignore_index=-100, reduction="sum"), z, y)
    assert lk.dtype == torch.float32 and dk.dtype == dtype
    assert abs(lk.item() - la.item()) <= 1e-6 * abs(la.item())
    tol = 1e-6 if dtype == torch.float32 else 2.0 ** -8 * da.float().abs().max().item()
    assert (dk.float() - da.float()).abs().max().item() <= tol
    assert dk[::4].abs().max().item() == 0.0   # ignored rows: no gradient


def test_cross_entropy_of_only_ignored_rows_is_zero_and_refuses_bad_targets():
    z = torch.randn(4, 10)
    assert cross_entropy_sum(z, torch.full((4,), -100), True).item() == 0.0
    with pytest.raises(RuntimeError, match="out of"):
        cross_entropy_sum(z, torch.tensor([0, 1, 2, 10]), True)


def test_fallbacks_use_aten():
    assert not kernel_applies(torch.zeros(3, dtype=torch.float16))
    assert not kernel_applies(torch.zeros(3, device="meta"))
    assert not kernels_for(torch.device("cpu"), enabled=False)
    assert kernels_for(torch.device("cpu"), enabled=True) == STATUS.vectorized


def test_bloom_with_kernels_trains_like_aten():
    """The chunked loss and the GeLU module through the kernels: the same loss and gradients as ATen's, fp32."""
    results = []
    for kernel in (False, True):
        model = build_model("tiny", vocab_size=300)
        install_fused_gelu(model, True, cpu_kernel=kernel)
        assert type(model.transformer.h[0].mlp.gelu_impl) is (KernelBloomGelu if kernel else FusedBloomGelu)
        ids = torch.randint(3, 300, (4, 40), generator=torch.Generator().manual_seed(0))
        labels = ids.clone()
        labels[:, :10] = -100
        loss_fn = TokenLoss("chunked", 64, cross_entropy=kernel_cross_entropy_sum if kernel else ce_sum)
        loss = lm_loss_sum(model, loss_fn, ids, torch.ones_like(ids), labels)
        loss.backward()
        results.append((loss.item(), {n: p.grad.clone() for n, p in model.named_parameters()}))
    (l0, g0), (l1, g1) = results
    assert abs(l0 - l1) <= 1e-6 * abs(l0)
    for name, g in g0.items():
        assert (g1[name] - g).abs().max().item() <= 1e-5 * (1 + g.abs().max().item()), name
