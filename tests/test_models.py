"""Model presets, exact meta-device parameter counts and load_model's error paths."""

from __future__ import annotations

import time
import warnings

import pytest
import torch

from ecomkit.errors import ModelNotFoundError
from ecomkit.models.bloom import (build_model, disable_activation_checkpointing, enable_activation_checkpointing,
                                  load_model, preset_parameter_count)
from ecomkit.fast.cpu_kernels import FusedBloomGelu, install_fused_gelu
from ecomkit.models.optim import adamw_kernel, clip_grad_norm


def test_real_shapes_have_exact_parameter_counts_on_meta():
    # bigscience/bloom-560m and bloom-7b1 report exactly these counts
    assert preset_parameter_count("seqgpt-560m") == 559_214_592
    assert preset_parameter_count("ecomgpt-7b") == 7_069_016_064


def test_real_shapes_keep_bloom_s_vocabulary_with_the_catalog_tokenizer():
    # the local catalog tokenizer has ~4,000 ids: the real shapes stay the models they name ...
    assert preset_parameter_count("seqgpt-560m", vocab_size=4003) == 559_214_592
    assert preset_parameter_count("ecomgpt-7b", vocab_size=4003) == 7_069_016_064
    # ... and grow only for a tokenizer larger than BLOOM's (tokens added); toy presets follow the tokenizer
    assert preset_parameter_count("seqgpt-560m", vocab_size=250_882) == 559_214_592 + 2 * 1024
    assert preset_parameter_count("tiny", vocab_size=4003) < preset_parameter_count("tiny", vocab_size=8000)


def test_meta_build_allocates_nothing():
    model = build_model("ecomgpt-7b", device="meta")
    assert all(p.device.type == "meta" for p in model.parameters())


def test_unknown_preset_is_one_clear_paragraph():
    with pytest.raises(ModelNotFoundError, match="Unknown model 'tinny'.*preset"):
        load_model("tinny")


def test_hub_id_offline_fails_fast_with_instructions():
    t = time.perf_counter()
    with pytest.raises(ModelNotFoundError, match="local-dir"):
        load_model("bigscience/bloom-560m")
    assert time.perf_counter() - t < 20


def test_dir_without_config_is_explained(tmp_path):
    with pytest.raises(ModelNotFoundError, match="no config.json"):
        load_model(str(tmp_path))


def test_local_dir_round_trip_gives_identical_logits(tmp_path):
    model = build_model("tiny", vocab_size=300)
    model.save_pretrained(tmp_path / "m")
    again = load_model(str(tmp_path / "m"))
    ids = torch.randint(0, 300, (2, 9))
    torch.testing.assert_close(model(ids).logits, again(ids).logits, rtol=0, atol=0)


@pytest.mark.parametrize("dtype, rtol, atol", [(torch.float32, 1e-5, 1e-5), (torch.bfloat16, 2e-2, 2e-2)])
def test_fused_gelu_gives_bloom_s_values_and_gradients(dtype, rtol, atol):
    """fast/cpu_kernels.py: ATen's tanh GELU is BloomGelu within rounding (inputs up to ~10: fp32 atol 1e-5)."""
    model = build_model("tiny", vocab_size=64)
    bloom = model.transformer.h[0].mlp.gelu_impl
    x = (torch.randn(4, 9, 64) * 3).to(dtype).requires_grad_()
    g = torch.randn(4, 9, 64).to(dtype)
    ref = bloom(x)
    (ref_grad,) = torch.autograd.grad(ref, x, g)
    assert install_fused_gelu(model) == model.config.n_layer and isinstance(bloom, FusedBloomGelu)
    got = bloom(x)
    (grad,) = torch.autograd.grad(got, x, g)
    torch.testing.assert_close(got, ref, rtol=rtol, atol=atol)
    torch.testing.assert_close(grad, ref_grad, rtol=rtol, atol=atol)
    assert install_fused_gelu(model, enabled=False) == model.config.n_layer and type(bloom) is not FusedBloomGelu
    assert install_fused_gelu(torch.nn.Linear(2, 2)) == 0   # not a BLOOM: nothing to switch


def test_adamw_is_fused_for_plain_parameters_and_loops_over_tensor_subclasses():
    plain = [{"params": [torch.nn.Parameter(torch.ones(3))]}]
    assert adamw_kernel(plain) == {"fused": True}

    class Wrapped(torch.Tensor):  # stands in for a DTensor
        pass

    assert adamw_kernel(plain + [{"params": [torch.ones(2).as_subclass(Wrapped)]}]) == {"foreach": False}
    assert adamw_kernel([{"params": [torch.nn.Parameter(torch.ones(3), requires_grad=False).long()]}]) == {
        "foreach": False}


@pytest.mark.parametrize("max_norm", [0.0, 1e-3, 0.447, 1.0, 1e6])
def test_clip_grad_norm_is_torch_s_bit_for_bit(max_norm):
    """The same norm and the same gradients as torch's clip_grad_norm_, clipping or not (0: only measure)."""
    torch.manual_seed(0)
    ours = [torch.nn.Parameter(torch.randn(100, 7)) for _ in range(3)]
    ref = [torch.nn.Parameter(p.detach().clone()) for p in ours]
    for p, q in zip(ours, ref):
        p.grad = torch.randn_like(p) * 0.01
        q.grad = p.grad.clone()
    expected = torch.nn.utils.clip_grad_norm_(ref, max_norm if max_norm > 0 else float("inf"))
    assert torch.equal(clip_grad_norm(ours, max_norm), expected)
    assert all(torch.equal(p.grad, q.grad) for p, q in zip(ours, ref))


def test_activation_checkpointing_switch_flags_every_block_under_this_transformers_name():
    """The installed transformers' switch, without its deprecated alias's warning; off again after."""
    model = build_model("tiny", vocab_size=64)
    with warnings.catch_warnings():
        warnings.simplefilter("error", FutureWarning)
        enable_activation_checkpointing(model, {"use_reentrant": False})
        assert all(block.gradient_checkpointing for block in model.transformer.h)
        disable_activation_checkpointing(model)
    assert not any(block.gradient_checkpointing for block in model.transformer.h)


class _BeforeRename:
    """A transformers < 5.23 model's checkpointing methods: only the ``gradient_checkpointing_*`` names."""

    def __init__(self) -> None:
        self.calls: list[tuple] = []

    def gradient_checkpointing_enable(self, gradient_checkpointing_kwargs=None, every_n_layers=1, offload=False):
        self.calls.append(("enable", gradient_checkpointing_kwargs))

    def gradient_checkpointing_disable(self):
        self.calls.append(("disable",))


def test_activation_checkpointing_switch_falls_back_to_the_name_before_5_23():
    model = _BeforeRename()
    enable_activation_checkpointing(model, {"use_reentrant": True})
    disable_activation_checkpointing(model)
    assert model.calls == [("enable", {"use_reentrant": True}), ("disable",)]
