"""The planner's view of a model: every parameter's exact shape, and how each strategy cuts them per rank.

Why exact: Ψ and the parameters come from the model built on the meta device, and each strategy's partition (ZeRO-1/2
flat groups with straddling gradients, ZeRO-3 per parameter, FSDP2 on dim 0, TP and PP as ``ecomkit.parallel`` cuts) is
emulated parameter by parameter; the tests compare it byte for byte with 2 real processes.
"""

from __future__ import annotations

import functools
import json
import math
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from transformers import AutoConfig, BloomConfig

from ecomkit.errors import ConfigError, ModelNotFoundError
from ecomkit.models.bloom import PRESETS, build_model, is_local_model_dir, preset_config
from ecomkit.models.optim import param_groups
from ecomkit.parallel.pipeline import stage_layer_ranges


@dataclass(frozen=True)
class ParamInfo:
    """One parameter: size, first dimension, optimizer group, and how tensor parallelism splits it."""

    name: str
    numel: int
    dim0: int
    group: int          # 0 = weight decay, 1 = no decay (ecomkit.models.optim.param_groups order)
    layer: int          # block index, -1 = embeddings side, n_layer = ln_f
    tp_split: str       # "col" (dim 0 split), "row" (dim 1 split) or "rep" (replicated)


@dataclass(frozen=True)
class ModelShape:
    """What the planner needs to know about a BLOOM: its dimensions and every parameter (tied ones once)."""

    name: str
    hidden: int
    n_layer: int
    n_head: int
    vocab: int
    params: tuple[ParamInfo, ...]

    @property
    def n_params(self) -> int:
        """Ψ: every parameter once (the tied LM head is the embedding)."""
        return sum(p.numel for p in self.params)

    @property
    def head_dim(self) -> int:
        return self.hidden // self.n_head

    def block_params(self, layer: int = 0) -> int:
        return sum(p.numel for p in self.params if p.layer == layer)

    @property
    def largest_leaf(self) -> int:
        """Largest single weight (what ZeRO-3 gathers at once in DeepSpeed's estimator): the embedding here."""
        return max(p.numel for p in self.params)

    @property
    def linear_weight_numel(self) -> int:
        """Weights that go through a matmul (autocast makes a 16-bit copy of each); includes the tied head."""
        blocks = sum(p.numel for p in self.params if p.layer >= 0 and p.dim0 != p.numel
                     and p.layer < self.n_layer)
        return blocks + self.vocab * self.hidden


def _tp_split(name: str) -> str:
    if "query_key_value" in name or "dense_h_to_4h" in name:
        return "col"
    if name.endswith(("self_attention.dense.weight", "dense_4h_to_h.weight")):
        return "row"
    return "rep"


def _layer_of(name: str, n_layer: int) -> int:
    parts = name.split(".")
    if "h" in parts:
        return int(parts[parts.index("h") + 1])
    return n_layer if "ln_f" in name else -1


def _shape_from_module(module: Any, name: str) -> ModelShape:
    cfg = module.config
    groups = param_groups(module, weight_decay=0.01)
    group_of = {id(p): i for i, g in enumerate(groups) for p in g["params"]}
    infos, seen = [], set()
    for pname, p in module.named_parameters():
        if id(p) in seen:
            continue
        seen.add(id(p))
        infos.append(ParamInfo(pname, p.numel(), p.shape[0] if p.dim() else 1, group_of.get(id(p), 1),
                               _layer_of(pname, cfg.n_layer), _tp_split(pname)))
    return ModelShape(name, cfg.hidden_size, cfg.n_layer, cfg.n_head, cfg.vocab_size, tuple(infos))


@functools.lru_cache(maxsize=32)
def _shape_from_config_json(config_json: str, name: str) -> ModelShape:
    cfg = BloomConfig.from_dict(json.loads(config_json))
    return _shape_from_module(build_model(cfg, device="meta"), name)


def model_shape(model: Any, vocab_size: int | None = None) -> ModelShape:
    """Exact shape of a BLOOM given as a preset name, ``BloomConfig``, directory with ``config.json``, or module.

    Built on the meta device (no weights); ``vocab_size`` fills in the toy presets' vocabulary.
    """
    if isinstance(model, ModelShape):
        return model
    if hasattr(model, "named_parameters") and hasattr(model, "config"):
        return _shape_from_module(model, getattr(model.config, "name_or_path", "") or type(model).__name__)
    if isinstance(model, BloomConfig):
        return _shape_from_config_json(model.to_json_string(use_diff=False), "config")
    if isinstance(model, str) and model in PRESETS:
        cfg = preset_config(model, vocab_size)
        return _shape_from_config_json(cfg.to_json_string(use_diff=False), model)
    if isinstance(model, (str, Path)) and is_local_model_dir(model):
        cfg = AutoConfig.from_pretrained(str(model), local_files_only=True)
        if getattr(cfg, "model_type", "") != "bloom":
            raise ConfigError(
                f"{model}/config.json describes a '{cfg.model_type}' model; the planner's activation formula is "
                "written for BLOOM (ALiBi, fused QKV). Plan a BLOOM checkpoint, or a preset.")
        return _shape_from_config_json(cfg.to_json_string(use_diff=False), str(model))
    raise ModelNotFoundError(
        f"The planner cannot read model '{model}': it is not a preset ({', '.join(PRESETS)}), a BloomConfig, "
        "nor a directory containing config.json. Pass one of those; the hub is not contacted.")


N_PARAMS_PIECES = 10_000   # tensors a bare Ψ is cut into: ZeRO-1/2 straddlers add ~2/10,000 of Ψ per rank


def shape_for_n_params(n_params: int) -> ModelShape:
    """A model known only by its parameter count (``--n-params``): Ψ cut into equal weight-decay tensors.

    Model states only (the ZeRO paper's table): without hidden size, layers or vocabulary, activations cannot be
    planned.
    """
    if n_params < 1:
        raise ConfigError(f"--n-params {n_params}: give the number of parameters (Ψ), e.g. 7.5e9.")
    pieces = min(N_PARAMS_PIECES, n_params)
    size, rest = divmod(n_params, pieces)
    infos = tuple(ParamInfo(f"w{i}", size + (1 if i < rest else 0), size + (1 if i < rest else 0), 0, i, "rep")
                  for i in range(pieces))
    return ModelShape("--n-params", 0, pieces, 1, 0, infos)


def local_params(shape: ModelShape, tp: int = 1, pp: int = 1, stage: int = 0, head_blocks: float = 0.0
                 ) -> list[ParamInfo]:
    """Parameters one rank holds before data-parallel sharding: its tp slice of its pipeline stage.

    Stage 0 has the embeddings, the last stage ``ln_f`` and its own copy of the tied head; TP splits as
    ``ecomkit.parallel.tensor`` does (QKV and ``dense_h_to_4h`` by rows, ``dense``/``dense_4h_to_h`` by columns).
    """
    lo, hi = stage_layer_ranges(shape.n_layer, pp, head_blocks)[stage] if pp > 1 else (0, shape.n_layer)
    first, last = stage == 0, stage == pp - 1
    out = []
    for p in shape.params:
        owned = (lo <= p.layer < hi) or (p.layer < 0 and first) or (p.layer == shape.n_layer and last)
        if not owned:
            continue
        if p.tp_split == "col" and tp > 1:
            p = replace(p, numel=p.numel // tp, dim0=p.dim0 // tp)
        elif p.tp_split == "row" and tp > 1:
            p = replace(p, numel=p.numel // tp)
        out.append(p)
    if pp > 1 and last and not first:   # the untied copy of the embedding that serves as LM head
        emb = next(p for p in shape.params if p.layer < 0 and p.numel == shape.vocab * shape.hidden)
        out.append(replace(emb, name="lm_head.weight"))
    return out


def deepspeed_partition(params: list[ParamInfo], n: int, rank: int) -> tuple[int, int]:
    """(elements of the rank's flat partition, elements of the gradients it keeps) under ZeRO-1/2.

    Per group: flatten, pad to a multiple of ``2·n``, cut in ``n``; a parameter straddling a boundary keeps its whole
    gradient on both neighbours (measured).
    """
    partition = grads = 0
    for group in (0, 1):
        sizes = [p.numel for p in params if p.group == group]
        if not sizes:
            continue
        aligned = math.ceil(sum(sizes) / (2 * n)) * (2 * n)
        size = aligned // n
        partition += size
        lo, hi, offset = rank * size, (rank + 1) * size, 0
        for s in sizes:
            if offset < hi and offset + s > lo:
                grads += s
            offset += s
    return partition, grads


def fsdp2_shard(params: list[ParamInfo], n: int, rank: int) -> int:
    """Elements of the rank's FSDP2 shards: each parameter split on dim 0 in ``torch.chunk`` pieces."""
    total = 0
    for p in params:
        rows = math.ceil(p.dim0 / n)
        mine = max(0, min(rows, p.dim0 - rank * rows))
        total += mine * (p.numel // max(p.dim0, 1))
    return total


def zero3_partition(params: list[ParamInfo], n: int) -> int:
    """Elements of a ZeRO-3 rank's partition: every parameter is cut separately into ``ceil(numel / n)``."""
    return sum(math.ceil(p.numel / n) for p in params)


__all__ = ["ParamInfo", "ModelShape", "model_shape", "shape_for_n_params", "local_params", "deepspeed_partition", "fsdp2_shard",
           "zero3_partition"]
