"""``--attn eager`` under bf16 autocast on CPU: the mask and softmax in bf16 (``fast/attention.py``).

Against transformers' own ``BloomAttention`` under the same autocast: the same logits (the probabilities
are the same values, rounded once), gradients within bf16's rounding, finite rows where every key is masked,
and transformers' forward wherever the path does not apply (fp32, ``output_attentions``).
"""

from __future__ import annotations

import pytest
import torch
from transformers.models.bloom.modeling_bloom import BloomAttention

import ecomkit.fast.attention as attention_module
from ecomkit.fast.attention import install_attention
from ecomkit.fast.attention import low_precision_mask
from ecomkit.models.bloom import build_model

VOCAB = 512


def batch(left: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """4 rows of 48 tokens: one unpadded, two right-padded (what ecomkit's collate makes), one left-padded."""
    ids = torch.randint(3, VOCAB, (4, 48), generator=torch.Generator().manual_seed(0))
    mask = torch.ones_like(ids)
    mask[1, 30:] = 0
    mask[2, 10:] = 0
    if left:
        mask[3, :12] = 0
    return ids, mask


def run(impl: str | None, ids: torch.Tensor, mask: torch.Tensor, autocast: bool = True):
    """Loss, logits and gradients of one fwd+bwd of ``tiny`` (impl None: transformers' own attention class)."""
    model = build_model("tiny", vocab_size=VOCAB, seed=0).train()
    if impl is None:
        for m in model.modules():
            if isinstance(m, BloomAttention):
                m.__class__ = BloomAttention
    else:
        install_attention(model, impl)
    with torch.autocast("cpu", dtype=torch.bfloat16, enabled=autocast):
        out = model(input_ids=ids, attention_mask=mask, labels=ids.masked_fill(mask == 0, -100))
    out.loss.backward()
    return out.logits.detach().float(), {n: p.grad.clone() for n, p in model.named_parameters()}


@pytest.fixture
def calls(monkeypatch) -> list[int]:
    """How many times the bf16 path ran."""
    seen: list[int] = []
    real = attention_module.eager_attend

    def counted(*args, **kwargs):
        seen.append(1)
        return real(*args, **kwargs)
    monkeypatch.setattr(attention_module, "eager_attend", counted)
    return seen


@pytest.mark.parametrize("left", [False, True])
def test_bf16_path_gives_transformers_logits_and_gradients_within_bf16(calls, left):
    ids, mask = batch(left)
    logits_t, grads_t = run(None, ids, mask)
    assert not calls
    logits_e, grads_e = run("eager", ids, mask)
    assert len(calls) == 2   # tiny's two blocks
    assert torch.isfinite(logits_e).all()
    scale = logits_t.abs().max().item()
    # the same probabilities, so the same logits; a few bf16 ulps of slack for kernels that round differently
    assert (logits_e - logits_t).abs().max().item() <= 4 * 2**-8 * scale
    for name, g in grads_t.items():
        # the backward multiplies by bf16 probabilities instead of fp32 ones: bf16-sized differences
        assert (grads_e[name] - g).norm().item() <= 2e-2 * g.norm().item() + 1e-12, name


def test_fp32_and_output_attentions_run_transformers_forward(calls):
    ids, mask = batch(left=True)
    logits_t, grads_t = run(None, ids, mask, autocast=False)
    logits_e, grads_e = run("eager", ids, mask, autocast=False)
    assert not calls and torch.equal(logits_e, logits_t)
    model = build_model("tiny", vocab_size=VOCAB, seed=0).eval()
    install_attention(model, "eager")
    with torch.autocast("cpu", dtype=torch.bfloat16), torch.no_grad():
        out = model(input_ids=ids, attention_mask=mask, output_attentions=True)
    assert not calls and len(out.attentions) == 2 and out.attentions[0].shape == (4, 4, 48, 48)


def test_mask_clamped_to_bf16_and_converted_once_per_mask():
    m = torch.zeros(2, 1, 4, 4)
    m[..., -1] = torch.finfo(torch.float32).min
    low = low_precision_mask(m, torch.bfloat16)
    assert low.dtype == torch.bfloat16 and torch.isfinite(low).all()
    assert low[..., -1].eq(torch.finfo(torch.bfloat16).min).all() and low[..., :-1].eq(0).all()
    assert low_precision_mask(m, torch.bfloat16) is low
