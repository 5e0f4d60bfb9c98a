"""The chunked LM-head loss (``ecomkit.models.loss``): same loss and gradients as the full logits, fewer bytes; a
function of the last hidden states that no module installs into the model (no replaced ``forward``).

Distributed checks (DDP and FSDP2 with several chunks per micro-batch against one
unchunked process) live in test_train_ddp.py and test_mixed_parallel.py, ZeRO's in test_zero_loss.py.
"""

from __future__ import annotations

import ast
import json
from pathlib import Path

import pytest
import torch

from ecomkit.config import TrainConfig
from ecomkit.dist import DistEnv
from ecomkit.errors import ConfigError
from ecomkit.models import loss as loss_module
from ecomkit.models.bloom import build_model
from ecomkit.models.loss import TokenLoss, chunked_token_loss_sum, head_rows, last_hidden_state, lm_loss_sum
from ecomkit.models.loss import token_loss_sum
from ecomkit.parallel import build_strategy
from ecomkit.fast import install_fast_paths

PACKAGE = Path(__file__).resolve().parents[1] / "ecomkit"

VOCAB = 300


def _data(batch: int = 3, seq: int = 20, hidden: int = 16, seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    h = torch.randn(batch, seq, hidden, generator=g, requires_grad=True)
    labels = torch.randint(0, VOCAB, (batch, seq), generator=g)
    labels[0, 12:] = -100          # right padding
    labels[2, :5] = -100           # an NLU prompt: loss on the answer only
    head = torch.nn.Linear(hidden, VOCAB, bias=False)
    return h, labels, head


@pytest.mark.parametrize("chunk", [1, 7, 10_000])
def test_chunked_loss_and_gradients_equal_full_logits(chunk):
    h, labels, head = _data()
    ref = token_loss_sum(head(h), labels)
    ref_grads = torch.autograd.grad(ref, [h, head.weight])
    got = chunked_token_loss_sum(h, head, labels, chunk)
    grads = torch.autograd.grad(got, [h, head.weight])
    assert torch.allclose(got, ref, rtol=1e-6, atol=0)  # fp32: only the summation order differs
    for g, r in zip(grads, ref_grads):
        assert torch.allclose(g, r, rtol=1e-5, atol=1e-7)


@pytest.mark.parametrize("chunk", [5, 10_000])
def test_rows_topped_up_to_a_multiple_give_the_same_loss_and_gradients_in_that_many_rows(chunk):
    """bf16 on CPU: the head sees a bounded set of row counts (unlabeled rows add 0), and nothing else changes."""
    h, labels, head = _data()
    n_labeled = int((labels[:, 1:] != -100).sum())
    ref = chunked_token_loss_sum(h, head, labels, chunk)
    ref_grads = torch.autograd.grad(ref, [h, head.weight])
    rows: list[int] = []
    hook = head.register_forward_hook(lambda mod, args, out: rows.append(args[0].size(0)))
    got = chunked_token_loss_sum(h, head, labels, chunk, row_multiple=16)
    hook.remove()  # (the backward recomputes each checkpointed chunk: counted once, in the forward)
    grads = torch.autograd.grad(got, [h, head.weight])
    assert n_labeled % 16 and sum(rows) == -(-n_labeled // 16) * 16, (n_labeled, rows)
    assert torch.allclose(got, ref, rtol=1e-6, atol=0)
    for g, r in zip(grads, ref_grads):
        assert torch.allclose(g, r, rtol=1e-5, atol=1e-7)
    # never more rows than positions: a multiple beyond them takes every position, labeled or not
    rows.clear()
    hook = head.register_forward_hook(lambda mod, args, out: rows.append(args[0].size(0)))
    chunked_token_loss_sum(h, head, labels, 10_000, row_multiple=1000)
    assert rows == [labels.numel()]


@pytest.mark.parametrize("row_multiple", [None, 16])
def test_a_host_counted_label_count_selects_the_same_positions_without_nonzero(row_multiple):
    """``label_count`` (counted by the collator on the host): ``nonzero_static``, no value-sized result."""
    h, labels, head = _data()
    count = int((labels[:, 1:] != -100).sum())
    ref = chunked_token_loss_sum(h, head, labels, 7, row_multiple=row_multiple)
    with torch.profiler.profile() as prof:
        got = chunked_token_loss_sum(h, head, labels, 7, row_multiple=row_multiple, label_count=count)
    assert "aten::nonzero" not in {e.name for e in prof.events()}
    assert torch.equal(got, ref)


def test_every_position_labeled_still_tops_up_to_whole_tiles():
    """B × (T − 1) labeled positions (8 × 127 = 1016) go to the head as B × T rows (1024): a multiple of 16 when T
    is, since oneDNN's bf16 GEMM runs about 20 % slower on 1016 rows than on 1024. The loss is unchanged."""
    torch.manual_seed(0)
    h, head = torch.randn(8, 128, 32, requires_grad=True), torch.nn.Linear(32, 50, bias=False)
    labels = torch.randint(0, 50, (8, 128))
    rows: list[int] = []
    hook = head.register_forward_hook(lambda mod, args, out: rows.append(args[0].size(0)))
    got = chunked_token_loss_sum(h, head, labels, 10_000, row_multiple=16)
    hook.remove()
    assert rows == [1024]
    assert torch.allclose(got, token_loss_sum(head(h), labels), rtol=1e-6, atol=0)


@pytest.mark.parametrize("chunk", [4, 10_000])
@pytest.mark.parametrize("bias", [False, True])
def test_gradients_computed_in_the_forward_equal_the_chunked_loss_s(chunk, bias):
    """ZeRO-3's chunked loss (the head gathered once, no chunk recomputed in backward): the same loss and gradients."""
    h, labels, head = _data()
    if bias:
        head = torch.nn.Linear(h.size(-1), VOCAB)
    params = [h, *head.parameters()]
    ref = chunked_token_loss_sum(h, head, labels, chunk)
    ref_grads = torch.autograd.grad(2.0 * ref, params)        # a scale on the way back is applied, not lost
    calls: list[int] = []
    head.register_forward_hook(lambda *a: calls.append(1))
    got = TokenLoss("chunked", chunk, grads_in_forward=True)(h, head, labels)
    grads = torch.autograd.grad(2.0 * got, params)
    assert not calls                                          # the weight is read, the module never called
    assert torch.allclose(got, ref, rtol=1e-6, atol=0)
    for g, r in zip(grads, ref_grads):
        assert torch.allclose(g, r, rtol=1e-5, atol=1e-7)
    labels[:] = -100                                          # no label: zero, and a zero gradient for every input
    empty = TokenLoss("chunked", chunk, grads_in_forward=True)(h, head, labels)
    assert empty.item() == 0 and all(g.abs().max() == 0 for g in torch.autograd.grad(empty, params))


def test_micro_batch_without_labels_gives_zero_that_backpropagates():
    h, labels, head = _data()
    labels[:] = -100
    loss = chunked_token_loss_sum(h, head, labels, 4)
    loss.backward()
    assert loss.item() == 0 and h.grad is not None and head.weight.grad is not None
    assert h.grad.abs().max() == 0


def test_chunks_keep_the_peak_of_autograd_saved_tensors_small():
    """Forward of many chunks saves only the inputs, not one logits tensor per chunk."""
    h, labels, head = _data(batch=4, seq=64)
    saved: list[int] = []

    def pack(t):
        saved.append(t.numel())
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        chunked_token_loss_sum(h, head, labels, 8)
    assert max(saved) < labels.numel() * VOCAB / 4  # full logits would be batch·T·vocab


@pytest.fixture()
def tiny():
    torch.manual_seed(0)
    return build_model("tiny", vocab_size=VOCAB)


def test_the_loss_from_the_model_s_hidden_states_equals_the_logits_loss(tiny):
    """``lm_loss_sum``: BLOOM's forward to its last hidden states (no logits), then the chunked loss on them."""
    ids = torch.randint(3, VOCAB, (2, 24))
    mask = torch.ones_like(ids)
    mask[1, 18:] = 0
    labels = ids.masked_fill(mask == 0, -100)
    ref = token_loss_sum(tiny(input_ids=ids, attention_mask=mask).logits, labels)
    ref.backward()
    ref_grads = {n: p.grad.clone() for n, p in tiny.named_parameters()}
    tiny.zero_grad(set_to_none=True)
    hidden = last_hidden_state(tiny, ids, mask)
    assert torch.equal(hidden, tiny.transformer(input_ids=ids, attention_mask=mask).last_hidden_state)
    loss = lm_loss_sum(tiny, TokenLoss("chunked", 5), ids, mask, labels)
    loss.backward()
    assert torch.allclose(loss, ref, rtol=1e-6)
    for n, p in tiny.named_parameters():
        assert torch.allclose(p.grad, ref_grads[n], rtol=1e-4, atol=1e-6), n
    assert torch.equal(lm_loss_sum(tiny, TokenLoss(), ids, mask, labels), ref.detach())   # full: the logits


def test_clear_errors():
    with pytest.raises(ConfigError, match="loss-chunk-tokens 0"):
        TokenLoss("chunked", 0)
    with pytest.raises(ConfigError, match="choose full, chunked"):
        TokenLoss("chunky")


# ---------------------------------------------------------------------- no module patches the model
def _forward_assignments(path: Path) -> list[str]:
    """Lines of ``path`` that assign some object's ``forward`` or bind a function to one with ``MethodType``."""
    found, where = [], path.name if not path.is_relative_to(PACKAGE) else path.relative_to(PACKAGE.parent)
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        targets = node.targets if isinstance(node, ast.Assign) else [node.target] if isinstance(
            node, (ast.AnnAssign, ast.AugAssign)) else []
        if any(isinstance(t, ast.Attribute) and t.attr == "forward" for t in targets):
            found.append(f"{where}:{node.lineno}: assigns .forward")
        if isinstance(node, ast.Call) and ast.unparse(node.func).endswith("MethodType"):
            found.append(f"{where}:{node.lineno}: types.MethodType")
        if isinstance(node, ast.Call) and ast.unparse(node.func) == "setattr" and len(node.args) >= 2 and \
                isinstance(node.args[1], ast.Constant) and node.args[1].value == "forward":
            found.append(f"{where}:{node.lineno}: setattr(..., 'forward', ...)")
    return found


def test_no_module_of_ecomkit_replaces_a_forward():
    """A static scan of the package: no ``x.forward = ...``, ``setattr(x, "forward", ...)`` or ``MethodType``."""
    found = [line for p in sorted(PACKAGE.rglob("*.py")) for line in _forward_assignments(p)]
    assert not found, "\n".join(found)


def test_the_scan_finds_a_replaced_forward(tmp_path):
    """The scan bites: each way of replacing a forward (the old chunked loss's included) is reported."""
    bad = tmp_path / "ecomkit" / "bad.py"
    bad.parent.mkdir()
    bad.write_text("import types\nmodel.forward = types.MethodType(f, model)\nsetattr(block, 'forward', g)\n")
    lines = [line.split(": ", 1)[1] for line in _forward_assignments(bad)]
    assert sorted(lines) == sorted(["assigns .forward", "types.MethodType", "setattr(..., 'forward', ...)"])


def test_a_built_training_model_runs_its_class_s_forward(tmp_path):
    """A run's model, built and sped up as the loop does it (attention, GeLU and loss kernels, the chunked loss,
    ``--compile``): its forward is its class's, it has no instance ``forward``, and it saves as a plain BLOOM."""
    cfg = TrainConfig(model="tiny", precision="bf16", attn="sdpa", loss_kernel="chunked", compile=True,
                      output_dir=str(tmp_path))
    strategy = build_strategy(cfg, DistEnv())
    model = build_model("tiny", vocab_size=VOCAB)
    cls = type(model)
    install_fast_paths(model, cfg, torch.device("cpu"), strategy, packed=False)
    assert strategy.token_loss.kernel == "chunked"
    for m in model.modules():
        assert "forward" not in m.__dict__, type(m).__name__
        assert m.forward.__func__ is type(m).forward, type(m).__name__
    assert type(model) is cls
    model.save_pretrained(tmp_path)
    assert json.loads((tmp_path / "config.json").read_text())["architectures"] == ["BloomForCausalLM"]


def test_head_rows_overshoot_at_most_an_eighth_and_leave_a_few_counts_per_doubling():
    """The head's row counts under bf16 on CPU: never fewer than the labels, at most 12.5 % (or one multiple) more,
    a multiple of 16 unless capped at every position, and few distinct counts (each a oneDNN primitive kept)."""
    positions = 4 * 1088
    counts = {head_rows(n, 16, positions) for n in range(1, positions + 1)}
    for n in range(1, positions + 1):
        rows = head_rows(n, 16, positions)
        assert n <= rows <= positions and (rows == positions or rows % 16 == 0)
        assert rows - n < 16 or rows - n <= n / 8, (n, rows)
    assert len(counts) <= 8 * (positions.bit_length() - 3), len(counts)     # multiples of 16 alone: 272


def test_only_a_compiled_head_loss_marks_the_rows_unbacked(monkeypatch):
    """The uncompiled head + loss (TokenLoss's default, every run without --compile) is called as it is; only another
    (the compiled one) goes through _unbacked_rows, whose marks are for dynamo alone."""
    calls = []
    real = loss_module._unbacked_rows
    monkeypatch.setattr(loss_module, "_unbacked_rows", lambda *a: calls.append(a[0]) or real(*a))
    h, labels, head = _data()
    TokenLoss("chunked", chunk_tokens=8)(h, head, labels).backward()
    assert calls == []

    def other_head_loss(*args):   # stands in for the compiled one
        return loss_module.head_loss_sum(*args)

    TokenLoss("chunked", chunk_tokens=8, head_loss=other_head_loss)(h, head, labels)
    assert calls and all(c is other_head_loss for c in calls)
