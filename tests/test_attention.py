"""``--attn sdpa|flex`` against BLOOM's own eager attention: logits, gradients, generation, the loop.

Equality is the acceptance criterion (issue 9): max |logit difference| <= 1e-5
in fp32, with left- and right-padded rows, from 1 to 2048 tokens, and the same
loss curve over 5 training steps of the real loop.
"""

from __future__ import annotations

import pytest
import torch
from torch._dynamo.testing import CompileCounter
from torch.nn.attention.flex_attention import flex_attention

import ecomkit.fast.flex as flex_module
from ecomkit.errors import ConfigError
from ecomkit.models.bloom import build_model, enable_activation_checkpointing
from ecomkit.models.attention import sdpa_mask_plan
from ecomkit.fast.attention import BloomEagerAttention, current_attention, install_attention
from ecomkit.fast.sdpa import BloomSdpaAttention

VOCAB = 512
TOL = 1e-5


def padded_batch(seq_len: int, batch: int = 3, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    """Row 0 unpadded, row 1 left-padded by a third, the last row right-padded by a half (when long enough)."""
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(3, VOCAB, (batch, seq_len), generator=g)
    mask = torch.ones(batch, seq_len, dtype=torch.long)
    if seq_len >= 3:
        mask[1, : seq_len // 3] = 0
        mask[-1, seq_len - seq_len // 2:] = 0
    return ids, mask


@pytest.fixture(scope="module")
def model():
    return build_model("tiny", vocab_size=VOCAB).eval()


def logits_with(model, impl: str, ids, mask, **kw) -> torch.Tensor:
    install_attention(model, impl, **kw)
    with torch.no_grad():
        return model(input_ids=ids, attention_mask=mask).logits


@pytest.mark.parametrize("seq_len", [1, 7, 128, 2048])
def test_sdpa_logits_equal_eager_with_left_and_right_padding(model, seq_len):
    ids, mask = padded_batch(seq_len)
    eager = logits_with(model, "eager", ids, mask)
    sdpa = logits_with(model, "sdpa", ids, mask)
    assert (sdpa - eager).abs().max().item() <= TOL  # every position, padding rows included
    install_attention(model, "eager")


def test_sdpa_without_padding_uses_is_causal_and_still_matches(model):
    ids = torch.randint(3, VOCAB, (2, 300))
    mask = torch.ones_like(ids)
    eager = logits_with(model, "eager", ids, mask)
    sdpa = logits_with(model, "sdpa", ids, mask)
    no_mask = logits_with(model, "sdpa", ids, None)  # BLOOM also accepts no mask at all
    assert (sdpa - eager).abs().max().item() <= TOL
    assert (no_mask - eager).abs().max().item() <= TOL
    install_attention(model, "eager")
    # the plan the forward used: pure causal → no mask tensor, is_causal=True
    alibi = torch.zeros(2 * 4, 1, 300)
    causal = torch.full((300, 300), torch.finfo(torch.float32).min).triu(1)[None, None].expand(2, 1, 300, 300)
    plan = sdpa_mask_plan(alibi, causal, 300)
    assert plan.attn_mask is None and plan.is_causal and not plan.has_empty_rows


@pytest.mark.parametrize("seq_len,padded", [(7, True), (300, True), (300, False)])
def test_flex_forward_matches_eager_on_real_tokens(model, seq_len, padded):
    pytest.importorskip("torch.nn.attention.flex_attention")
    ids, mask = padded_batch(seq_len)
    if not padded:
        mask[:] = 1  # the plain causal block mask path
    eager = logits_with(model, "eager", ids, mask)
    flex = logits_with(model, "flex", ids, mask, for_training=False)
    real = mask.bool()  # flex returns zeros for fully masked (left-padding) query rows; see module docstring
    assert (flex - eager)[real].abs().max().item() <= TOL
    install_attention(model, "eager")


def loss_and_grads(impl: str | None, mask_side: str, checkpointing: bool = False):
    """One backward of ``tiny`` with attention ``impl`` (None: transformers' own class, nothing installed)."""
    model = build_model("tiny", vocab_size=VOCAB)
    if impl is not None:
        install_attention(model, impl)
    model.train()
    if checkpointing:
        enable_activation_checkpointing(model, {"use_reentrant": False})  # transformers' own, per block
        assert model.transformer.h[0].gradient_checkpointing
    ids, mask = padded_batch(96, seed=1)
    if mask_side == "right":
        mask[1] = 1
    labels = ids.masked_fill(mask == 0, -100)
    out = model(input_ids=ids, attention_mask=mask, labels=labels)
    out.loss.backward()
    return out.loss.item(), {n: p.grad.clone() for n, p in model.named_parameters()}


@pytest.mark.parametrize("mask_side,checkpointing", [("right", False), ("right", True), ("both", False)])
def test_sdpa_gradients_equal_eager(mask_side, checkpointing):
    """Right padding (what ecomkit's collate makes) runs the fused kernel; left padding the exact math kernel."""
    loss_e, grads_e = loss_and_grads("eager", mask_side)
    loss_s, grads_s = loss_and_grads("sdpa", mask_side, checkpointing)
    assert abs(loss_s - loss_e) <= TOL * abs(loss_e)
    for name, g in grads_e.items():
        assert (grads_s[name] - g).abs().max().item() <= TOL, name


def test_eager_with_one_pass_qkv_split_is_bit_identical_to_transformers():
    """BloomEagerAttention changes only how the QKV gradient is assembled: the same bits, forward and backward."""
    loss_t, grads_t = loss_and_grads(None, "both")
    loss_e, grads_e = loss_and_grads("eager", "both")
    assert loss_e == loss_t
    for name, g in grads_t.items():
        assert torch.equal(grads_e[name], g), name


def test_generation_with_kv_cache_matches_eager(model):
    ids, mask = padded_batch(12, batch=2)
    mask[1] = 1
    mask[1, :4] = 0  # left padding, as generation uses (row 0 unpadded)
    outs = {}
    for impl in ("eager", "sdpa"):
        install_attention(model, impl)
        outs[impl] = model.generate(input_ids=ids, attention_mask=mask, max_new_tokens=6, do_sample=False,
                                    use_cache=True, pad_token_id=0, output_scores=True,
                                    return_dict_in_generate=True)
    install_attention(model, "eager")
    assert torch.equal(outs["eager"].sequences, outs["sdpa"].sequences)
    for e, s in zip(outs["eager"].scores, outs["sdpa"].scores):  # one decode step (q_length 1) each
        assert (e - s).abs().max().item() <= TOL


def test_output_attentions_falls_back_to_eager_probabilities(model):
    ids, mask = padded_batch(9)
    install_attention(model, "sdpa")
    with torch.no_grad():
        out = model(input_ids=ids, attention_mask=mask, output_attentions=True)
    install_attention(model, "eager")
    assert len(out.attentions) == model.config.n_layer
    assert out.attentions[0].shape == (3, model.config.n_head, 9, 9)


def test_install_swaps_classes_only_and_round_trips(tmp_path):
    model = build_model("tiny", vocab_size=VOCAB)
    keys = list(model.state_dict())
    assert install_attention(model, "sdpa") == model.config.n_layer
    assert current_attention(model) == "sdpa"
    assert isinstance(model.transformer.h[0].self_attention, BloomSdpaAttention)
    assert list(model.state_dict()) == keys
    model.save_pretrained(tmp_path)  # a plain BLOOM checkpoint: nothing of ecomkit in it
    assert "ecomkit" not in (tmp_path / "config.json").read_text()
    install_attention(model, "eager")
    assert current_attention(model) == "eager"
    assert type(model.transformer.h[0].self_attention) is BloomEagerAttention
    assert install_attention(torch.nn.Linear(2, 2), "eager") == 0   # another architecture: nothing to switch


def test_clear_errors():
    model = build_model("tiny", vocab_size=VOCAB)
    with pytest.raises(ConfigError, match="Choose one of"):
        install_attention(model, "flash")
    with pytest.raises(ConfigError, match="cannot train on CPU"):
        install_attention(model, "flex")
    with pytest.raises(ConfigError, match="no BloomAttention"):
        install_attention(torch.nn.Linear(2, 2), "sdpa")


def test_training_loop_loss_curve_is_the_same(tmp_path, monkeypatch):
    """Five steps of the real loop (``TrainConfig.attn``), one process, in this process, at fp32: there the two
    curves are bit-identical; under bf16 autocast they differ in the sixth digit, TOL's own (docs/testing.md)."""
    from ecomkit.config import TrainConfig
    from ecomkit.train import run_training

    for var in ("WORLD_SIZE", "RANK", "LOCAL_RANK"):
        monkeypatch.delenv(var, raising=False)
    curves = {}
    for impl in ("eager", "sdpa"):
        cfg = TrainConfig(model="tiny", n_rows=600, seq_len=64, max_steps=5, eval_interval=0, eval_batches=1,
                          warmup_steps=2, progress=False, save_model=False, attn=impl, precision="fp32",
                          output_dir=str(tmp_path / impl))
        summary = run_training(cfg)
        rows = [r for r in _read_jsonl(tmp_path / impl / "metrics.jsonl") if r.get("type") == "train"]
        curves[impl] = [r["loss"] for r in rows]
        assert summary["steps"] == 5
    assert len(curves["sdpa"]) == 5
    for e, s in zip(curves["eager"], curves["sdpa"]):
        assert abs(e - s) <= TOL * abs(e), curves


def _read_jsonl(path):
    import json

    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def test_flex_compiles_once_per_shape_with_one_score_mod_per_model(monkeypatch):
    """Two blocks × repeated calls compile one graph; a new length adds one (dynamic) recompilation, then none.

    Counted with dynamo's frame counter on CPU (the ``eager`` backend: dynamo's guards
    and recompilations are the same as under inductor, without inductor's minute of
    CPU code generation). Every layer and call must pass the very same ``score_mod``.
    """
    torch._dynamo.reset()
    counter = CompileCounter()
    compiled = torch.compile(flex_attention, backend=counter)
    score_mods: set[int] = set()

    def recording(*args, **kwargs):
        score_mods.add(id(kwargs["score_mod"]))
        return compiled(*args, **kwargs)

    monkeypatch.setattr(flex_module, "_flex_function", lambda device: recording)
    model = build_model("tiny", vocab_size=VOCAB).eval()
    n_layers = install_attention(model, "flex", for_training=False)
    frames = []
    with torch.no_grad():
        for seq_len in (16, 16, 16, 24, 24, 40):
            ids, mask = padded_batch(seq_len)
            model(input_ids=ids, attention_mask=mask)
            frames.append(counter.frame_count)
    assert n_layers == 2 and len(score_mods) == 1
    assert frames == [1, 1, 1, 2, 2, 2], frames  # 6 forwards × 2 layers = 12 calls, 2 compilations
    torch._dynamo.reset()


def test_sdpa_model_compiles_as_one_graph_with_the_training_step_s_dynamic_shapes():
    """``--compile`` (``dynamic=True``): the whole transformer is one graph; new lengths, padded or not, and the
    backward recompile nothing.

    The mask checks of :func:`sdpa_mask_plan` read tensor values; inside ``torch.compile`` they were a
    graph break in BloomModel's loop over blocks, so dynamo compiled every block apart and recompiled as
    lengths and grad modes changed. Counted with dynamo's frame counter (the ``eager`` backend: the
    same graphs and guards as inductor, without its code generation).
    """
    torch._dynamo.reset()
    counter = CompileCounter()
    model = build_model("tiny", vocab_size=VOCAB)
    install_attention(model, "sdpa")
    compiled = torch.compile(model.transformer, backend=counter, dynamic=True)
    for seq_len, padded in ((16, True), (24, True), (24, False), (40, True)):
        ids, mask = padded_batch(seq_len)
        mask = mask if padded else torch.ones_like(mask)   # no padding: the eager path's is_causal shortcut
        compiled(input_ids=ids, attention_mask=mask)[0].sum().backward()
        eager = model.transformer(input_ids=ids, attention_mask=mask)[0]
        assert (compiled(input_ids=ids, attention_mask=mask)[0] - eager).abs().max().item() <= TOL
    assert counter.frame_count == 1, counter.frame_count   # one graph, compiled once, for every batch
    torch._dynamo.reset()
