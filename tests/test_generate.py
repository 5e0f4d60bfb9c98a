"""Decoding held-out prompts (``ecomkit.train.generate``): batched and left-padded equals one prompt at a time,
greedy and beam search, with and without the KV cache, and under every strategy on 2 processes.

The worker half of this file runs under torchrun: every rank builds the same seeded tiny BLOOM (weights
re-drawn larger so different prompts give different continuations), decodes all prompts alone as the
1-process reference, then its own share under DDP, ZeRO-3, FSDP2, TP, TP + sequence parallel and PP, and
rank 0 prints one JSON line. The end-of-answer token is chosen so that the two ranks' shares finish at
different steps: under ZeRO-3 and FSDP2 (every forward a collective) decoding would hang without the
synced steps, and the subprocess timeout would fail the test.
"""

from __future__ import annotations

import gc
import json
import os
from pathlib import Path

import fastlaunch
import pytest
import torch

from ecomkit.config import TrainConfig
from ecomkit.dist import DistEnv
from ecomkit.errors import ConfigError
from ecomkit.models.bloom import build_model
from ecomkit.models.tokenizer import get_tokenizer
from ecomkit.parallel.base import Strategy
from ecomkit.train.generate import (DECODE_GENERATE, DECODE_UNCACHED, DecodeSettings, decode_mode, encode_prompts,
                                    generate_texts, left_pad)

REPO = Path(__file__).resolve().parents[1]
RESULT_PREFIX = "GENERATE_RESULT "
PROMPTS = ["输入: 红色连衣裙\n抽取: 品牌，颜色\n输出: [GEN]", "输入: 苹果手机 黑色 很好用\n分类: 正面，负面\n输出: [GEN]",
           "输入: 短\n分类: a，b\n输出: [GEN]", "输入: 华为 Mate 60 Pro 12GB 雅川青 全网通 手机\n抽取: 品牌\n输出: [GEN]",
           "输入: 李宁 运动鞋 白色 42码\n抽取: 品牌，颜色，尺码\n输出: [GEN]", "输入: 物流很慢\n分类: 正面，中性，负面\n输出: [GEN]",
           "输入: 小米 充电宝 20000mAh\n抽取: 品牌\n输出: [GEN]", "输入: 质量一般 价格便宜\n分类: 正面，负面\n输出: [GEN]"]
NEW_TOKENS = 8


class EosTokenizer:
    """The tokenizer with another end-of-answer id, so that decoding stops at a chosen, frequent token."""

    def __init__(self, tok, eos_id: int):
        self._tok, self.eos_token_id, self.pad_token_id = tok, eos_id, tok.pad_token_id

    def __call__(self, *a, **k):
        return self._tok(*a, **k)

    def decode(self, ids, **k):
        return self._tok.decode(ids, **k)


def tokenizer():
    return get_tokenizer("local", Path(os.environ["ECOMKIT_CACHE"]))


def varied_model(vocab: int) -> torch.nn.Module:
    """The tiny preset with larger random weights: continuations then differ from prompt to prompt."""
    model = build_model("tiny", vocab_size=vocab, seed=0)
    g = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for p in model.parameters():
            if p.dim() == 2:
                p.normal_(0, 0.3, generator=g)
    return model


def single(model) -> Strategy:
    s = Strategy(TrainConfig(precision="fp32"), DistEnv())
    s.setup(model, 10)
    return s


def reference(model, tok, prompt: str, beams: int = 1) -> str:
    """Plain transformers generate() on one unpadded prompt."""
    ids = torch.tensor([tok(prompt, add_special_tokens=False)["input_ids"]])
    out = model.generate(input_ids=ids, max_new_tokens=NEW_TOKENS, do_sample=False, num_beams=beams,
                         eos_token_id=tok.eos_token_id, pad_token_id=tok.pad_token_id)
    return tok.decode(out[0, ids.shape[1]:], skip_special_tokens=True)


# ---------------------------------------------------------------------- worker (torchrun)
def worker() -> None:
    import torch.distributed as dist

    from ecomkit.dist import setup_distributed, teardown
    from ecomkit.parallel import build_strategy
    from ecomkit.train.gen_eval import shard_range

    env = setup_distributed(seed=0)
    tok = tokenizer()
    ref_model = varied_model(len(tok))
    ref = single(ref_model)
    settings = DecodeSettings(max_new_tokens=NEW_TOKENS, batch_size=2)
    ids = [encode_prompts(tok, [p], settings)[0][0] for p in PROMPTS]
    # the end-of-answer id: the 3rd new token of prompt 0 (rank 0's share ends early, rank 1's later or never)
    first = ref_model.generate(input_ids=torch.tensor([ids[0]]), max_new_tokens=3, do_sample=False,
                               pad_token_id=tok.pad_token_id, eos_token_id=-1)[0, -1].item()
    etok = EosTokenizer(tok, int(first))
    expected, _ = generate_texts(ref, etok, PROMPTS, DistEnv(), settings)
    lengths = [len(tok(t, add_special_tokens=False)["input_ids"]) for t in expected]
    out = {"expected": expected, "lengths": lengths, "modes": {}, "texts": {}}
    layouts = {"ddp": {}, "zero3": {"strategy": "zero"}, "fsdp": {"strategy": "fsdp"}, "tp": {"strategy": "tp"},
               "tp_sp": {"strategy": "tp"}, "pp": {"strategy": "pp"}}
    for name, kw in layouts.items():
        cfg = TrainConfig(**{"strategy": "ddp", "precision": "fp32", **kw})   # exact comparisons: fp32
        if name == "zero3":
            cfg.zero.stage, cfg.zero.param_persistence_threshold = 3, 0
        if name == "tp_sp":
            cfg.parallel.sequence_parallel = True
        if name == "pp":
            cfg.parallel.pp, cfg.parallel.pp_microbatches = 2, 2
        strategy = build_strategy(cfg, env)
        strategy.setup(varied_model(len(tok)), 10)
        index, count = strategy.data_shard()
        start, end = shard_range(len(PROMPTS), index, count)
        n_batches = -(-(-(-len(PROMPTS) // count)) // settings.batch_size)
        texts, _ = generate_texts(strategy, etok, PROMPTS[start:end], env, settings, n_batches)
        parts = [None] * env.world_size
        dist.all_gather_object(parts, (index, texts))
        out["texts"][name] = [t for i, ts in sorted(dict(parts).items()) for t in ts]
        out["modes"][name] = decode_mode(strategy)
        strategy.close()
        del strategy
        gc.collect()
    if env.is_main:
        print(RESULT_PREFIX + json.dumps(out, ensure_ascii=False), flush=True)
    teardown()


# ---------------------------------------------------------------------- tests
@pytest.fixture(scope="module")
def tok():
    return tokenizer()


@pytest.fixture(scope="module")
def model(tok):
    return varied_model(len(tok))


@pytest.mark.parametrize("beams", [1, 3])
def test_batched_left_padded_decoding_equals_plain_generate_one_prompt_at_a_time(tok, model, beams):
    texts, cut = generate_texts(single(model), tok, PROMPTS, DistEnv(),
                                DecodeSettings(max_new_tokens=NEW_TOKENS, batch_size=4, num_beams=beams))
    assert cut == 0
    assert texts == [reference(model, tok, p, beams) for p in PROMPTS]
    assert len(set(texts)) > 2   # the prompts give different answers, so the comparison says something


def test_without_the_kv_cache_the_answers_are_the_same(tok, model):
    s = single(model)
    cached, _ = generate_texts(s, tok, PROMPTS, DistEnv(), DecodeSettings(max_new_tokens=NEW_TOKENS, batch_size=3))
    plain, _ = generate_texts(s, tok, PROMPTS, DistEnv(),
                              DecodeSettings(max_new_tokens=NEW_TOKENS, batch_size=3, use_cache=False))
    assert plain == cached


def test_left_padding_and_prompt_cutting():
    ids, mask = left_pad([[5, 6, 7], [8]], pad_id=0, device="cpu")
    assert ids.tolist() == [[5, 6, 7], [0, 0, 8]] and mask.tolist() == [[1, 1, 1], [0, 0, 1]]
    tok = tokenizer()
    long = "输入: " + "很好用" * 200 + "\n分类: 正面，负面\n输出: [GEN]"
    rows, cut = encode_prompts(tok, [long, PROMPTS[0]], DecodeSettings(max_new_tokens=16, max_length=64))
    assert cut == 1 and len(rows[0]) == 64 - 1       # cut only as training cuts a row of the shortest answer
    assert rows[1] == tok(PROMPTS[0], add_special_tokens=False)["input_ids"]   # a prompt that fits: as it is
    assert tok.decode(rows[0]).endswith("\n分类: 正面，负面\n输出: [GEN]")   # label line and cue kept, as in training
    from ecomkit.data.prompt_ids import encode_prompt_answer
    trained, labels = encode_prompt_answer(tok, long, "", 64)          # a training row whose answer is its EOS
    assert trained[:-1] == rows[0]                                       # the very ids training saw


def test_beam_search_is_refused_where_decoding_is_greedy_only():
    with pytest.raises(ConfigError, match="gen-num-beams 3.*pipeline"):
        TrainConfig(strategy="pp", gen_num_beams=3).validate(2)
    TrainConfig(strategy="fsdp", gen_num_beams=3).validate(2)
    with pytest.raises(ConfigError, match="--gen-batch-size 0"):
        TrainConfig(gen_batch_size=0).validate(1)


@pytest.mark.dist
def test_every_strategy_decodes_its_share_and_together_equals_one_process(tmp_path):
    env = {**os.environ, "OMP_NUM_THREADS": "1", "TMPDIR": str(tmp_path), "PYTHONPATH": str(REPO)}
    proc = fastlaunch.run(__file__, [], 2, env=env, cwd=tmp_path, timeout=240)
    assert proc.returncode == 0, proc.stderr[-5000:]
    line = next(l for l in proc.stdout.splitlines() if l.startswith(RESULT_PREFIX))
    out = json.loads(line[len(RESULT_PREFIX):])
    half = len(PROMPTS) // 2
    # the shares finish at different steps: one rank is done while the other still decodes
    assert max(out["lengths"][:half]) != max(out["lengths"][half:]), out["lengths"]
    for name, texts in out["texts"].items():
        assert texts == out["expected"], name
    assert out["modes"] == {"ddp": DECODE_GENERATE, "zero3": DECODE_GENERATE, "fsdp": DECODE_GENERATE,
                            "tp": DECODE_GENERATE, "tp_sp": DECODE_UNCACHED, "pp": DECODE_UNCACHED}


if __name__ == "__main__":
    worker()
