"""Every ``auto`` of a run resolved once, from the flags and the facts: a frozen configuration, each value and why.

Why one place: the ``auto`` settings depend on each other (packing on precision, loss on strategy, length on batch),
so :func:`resolve_run` applies the rules in one written order and returns a sealed :class:`ResolvedConfig` with a
:class:`Choice` per setting for the start-up report and ``summary.json``.
"""

from __future__ import annotations

import dataclasses
import importlib.util
import re
from dataclasses import dataclass
from types import MappingProxyType
from typing import Any, Callable, Mapping

from ecomkit.config import TrainConfig, data_parallel_size
from ecomkit.config.recipe import (AUTO, RecipeFacts, RecipeValue, length_by_epochs, resolve_global_batch, resolve_lr,
                                   resolve_recipe)
from ecomkit.config.validate_options import forward_loss_unsupported
from ecomkit.config.vocabulary import LOSS_KERNEL_PACKAGES
from ecomkit.data.build import BuildReport
from ecomkit.data.lengths import GEN_BUDGET_MARGIN, PACK_AUTO_MAX_ROW_SHARE, decide_packing, generation_budget
from ecomkit.dist import DistEnv, gather_objects, log
from ecomkit.errors import ModelNotFoundError
from ecomkit.hardware import NO_BF16_UNITS, cpu_bf16_units, device_kind
from ecomkit.models.attention import pick_attention
from ecomkit.models.bloom import (ModelSource, build_empty_model, count_parameters, load_model, model_config,
                                  model_length_limit, model_origin)
from ecomkit.models.loss import pick_loss_kernel
from ecomkit.models.precision import choose_precision

WHY_WIDTH = 64   # the start-up report's reasons are cut to this many characters (the full ones: --verbose)


@dataclass(frozen=True)
class Choice:
    """One resolved setting: its value, why (the start-up report's few words, the full reason), and who set it."""

    value: Any
    why: str
    given: bool = False
    detail: str = ""   # the full reason where ``why`` shortens it

    def to_dict(self) -> dict[str, Any]:
        return {"value": self.value, "reason": self.detail or self.why, "given": self.given}


@dataclass(frozen=True)
class ModelFacts:
    """What the model is, known before it is built (its config on the meta device)."""

    kind: str          # preset | local | hub (models.bloom.model_origin)
    n_params: int
    n_head: int
    n_layer: int
    hidden: int
    vocab: int

    @classmethod
    def of(cls, name: str, vocab_size: int | None) -> "ModelFacts":
        model_length_limit(name)   # a name that is no preset, folder or hub id fails here, with load_model's words
        try:
            config = model_config(name, vocab_size=vocab_size if name_is_preset(name) else None)
        except (OSError, ValueError):
            load_model(name, device="meta")   # raises the actionable "could not load" error (offline hub, typo)
            raise ModelNotFoundError(f"could not read the config of --model {name}") from None
        source = ModelSource(name, vocab_size=vocab_size if name_is_preset(name) else None)
        n_params = count_parameters(build_empty_model(source, device="meta"))
        return cls(model_origin(name)["kind"], n_params, config.n_head, config.n_layer, config.hidden_size,
                   config.vocab_size)


def name_is_preset(name: str) -> bool:
    return model_origin(name)["kind"] == "preset"


@dataclass(frozen=True)
class RunFacts:
    """What the choices depend on, known before the strategy and the model are built."""

    env: DistEnv
    precision: Choice                               # rank 0's answer, the same on every rank (precision_choice)
    model: ModelFacts
    data: BuildReport                               # seq_len (auto's pick), lengths, labels
    mean_row: float                                 # the mean training row as fit, in tokens
    train_examples: int
    steps_per_epoch: Callable[[bool, int], int]     # (packed, grad_accum) -> optimizer steps in one epoch


@dataclass(frozen=True)
class ResolvedConfig:
    """A run's configuration: the flags with every ``auto`` resolved (``cfg``, sealed), and why each value."""

    cfg: TrainConfig
    choices: Mapping[str, Choice]
    dp: int                 # data-parallel shards: the global batch is split into this many
    grad_accum: int
    packed: bool
    steps_per_epoch: int
    recommended_lr: float   # the recipe's lr for this model whatever --lr says (a missed baseline's retry)
    length_by_epochs: bool  # auto sized the run from the data: --max-train-minutes may shorten it

    @property
    def global_batch(self) -> int:
        return self.cfg.micro_batch_size * self.grad_accum * self.dp

    def to_dict(self) -> dict[str, dict[str, Any]]:
        """``summary.json``'s ``recipe``: every resolved setting, its value, full reason and whether given."""
        return {name: c.to_dict() for name, c in self.choices.items()}

    def rows(self, verbose: bool = False) -> list[tuple[str, str, str]]:
        """The start-up report's lines: (setting, value, why); ``verbose``: the full reasons."""
        out = []
        for name, c in self.choices.items():
            if name in UNPRINTED:
                continue
            why = "given" if c.given and not verbose else (c.detail or c.why) if verbose else brief(c.why)
            out.append((LABELS.get(name, name), show(name, c.value, self), why))
        return out


UNPRINTED = ("epochs",)   # in the steps line already
LABELS = {"max_steps": "steps", "warmup_steps": "warm-up", "eval_interval": "evaluate every", "global_batch": "batch",
          "gen_max_new_tokens": "answer budget", "attn": "attention", "loss_kernel": "loss"}


def show(name: str, value: Any, resolved: ResolvedConfig) -> str:
    """A value as the report prints it."""
    if name == "global_batch":
        unit = "sequences" if resolved.packed else "rows"
        return (f"{value} {unit} = {resolved.cfg.micro_batch_size}/device × {resolved.dp} rank(s) × "
                f"{resolved.grad_accum} accumulated")
    if name == "max_steps":
        return f"{value:,} ({value / max(1, resolved.steps_per_epoch):.2f} epochs)"
    if name in ("warmup_steps", "eval_interval"):
        return f"{value} steps" if value else ("none" if name == "warmup_steps" else "the end only")
    if name == "packing":
        return "on" if value else "off"
    return f"{value:g}" if isinstance(value, float) else str(value)


def brief(reason: str) -> str:
    """A reason in a few words: its first clause, cut to :data:`WHY_WIDTH` characters at a word."""
    text = reason.split(";")[0].strip()
    if len(text) <= WHY_WIDTH:
        return text
    return text[:WHY_WIDTH].rsplit(" ", 1)[0].rstrip(",:") + " …"


# ---------------------------------------------------------------------- the facts a rule needs first
def precision_choice(flag: str, env: DistEnv) -> Choice:
    """``--precision``: as given, or ``auto``'s pick on rank 0's device, shared with every rank (a collective).
    Why rank 0: on a CPU the pick is a timing, and ranks timing at once on a shared machine could disagree."""
    if flag == "bf16" and env.device.type == "cpu" and env.is_main and cpu_bf16_units() is False:
        log.warning("--precision bf16 on a CPU without bf16 matmul units (%s): its GEMMs run converted, many "
                    "times slower than fp32; --precision auto picks fp32 here", NO_BF16_UNITS)
    if flag != AUTO:
        return Choice(flag, "--precision given", True)
    picked, why = choose_precision(env.device) if env.is_main else (None, None)
    picked, why = gather_objects((picked, why), env)[0]
    ratio = re.search(r"\(([\d.]+)x,", why)   # choose_precision's measured bf16 / fp32 GEMM rate
    short = f"auto: bf16 GEMMs {ratio.group(1)}× fp32's here" if ratio else f"auto: {why}"
    return Choice(picked, short, False, f"auto: {why}; --precision sets it")


# ---------------------------------------------------------------------- the rules, in their order
def resolve_run(flags: TrainConfig, facts: RunFacts) -> ResolvedConfig:
    """The flags with every ``auto`` resolved from ``facts``, in the order the rules depend on each other."""
    env, data = facts.env, facts.data
    device_type, gpu = env.device.type, device_kind(env.device)
    precision = facts.precision.value
    seq_len = data.seq_len
    choices: dict[str, Choice] = {"precision": facts.precision}
    choices["seq_len"] = Choice(seq_len, _seq_len_why(flags.seq_len, data), flags.seq_len != AUTO,
                                data.seq_len_reason)
    packed, why = decide_packing(flags.packing, facts.mean_row, seq_len, device_type, precision)
    choices["packing"] = Choice(packed, _packing_why(flags.packing, packed, facts.mean_row, seq_len, precision),
                                flags.packing != AUTO, why)
    dp = data_parallel_size(flags, env.world_size)
    batch = resolve_global_batch(flags.global_batch_size, flags.grad_accum, flags.micro_batch_size, dp, flags.task,
                                 flags.data != "synthetic", length_auto=flags.max_steps == AUTO and not flags.epochs)
    grad_accum = batch.value // (flags.micro_batch_size * dp)
    choices["global_batch"] = _from_recipe(batch)
    spe = facts.steps_per_epoch(packed, grad_accum)
    recipe_facts = RecipeFacts(model_kind=facts.model.kind, n_params=facts.model.n_params, peft=flags.peft,
                               task=flags.task, user_data=flags.data != "synthetic",
                               train_examples=facts.train_examples, steps_per_epoch=spe)
    recipe = resolve_recipe(flags.lr, flags.warmup_steps, flags.max_steps, flags.epochs, recipe_facts,
                            flags.eval_interval)
    for name in ("max_steps", "lr", "warmup_steps", "eval_interval", "epochs"):
        if name in recipe.values:
            choices[name] = _from_recipe(recipe.values[name])
    if flags.task == "nlu":
        budget, why = generation_budget(flags.gen_max_new_tokens, data.lengths["train"])
        choices["gen_max_new_tokens"] = Choice(budget, "given" if flags.gen_max_new_tokens != AUTO else
                                               f"auto: the longest training answer + {GEN_BUDGET_MARGIN}",
                                               flags.gen_max_new_tokens != AUTO, why)
    attn, why = pick_attention(flags.attn, precision, device_type, seq_len, gpu_kind=gpu)
    choices["attn"] = Choice(attn, why, flags.attn != AUTO)
    choices["loss_kernel"] = loss_kernel_choice(flags, device_type, gpu)
    values = {name: c.value for name, c in choices.items() if name not in ("global_batch", "packing", "epochs")}
    cfg = dataclasses.replace(flags, **values, packing="on" if packed else "off", grad_accum=grad_accum,
                              global_batch_size=_global_batch_field(flags, batch, dp))
    return ResolvedConfig(cfg=cfg.sealed(), choices=MappingProxyType(choices), dp=dp, grad_accum=grad_accum,
                          packed=packed, steps_per_epoch=spe, recommended_lr=resolve_lr(AUTO, recipe_facts).value,
                          length_by_epochs=not recipe.values["max_steps"].given and length_by_epochs(recipe_facts))


def _from_recipe(value: RecipeValue) -> Choice:
    return Choice(value.value, ("auto: " if not value.given else "") + value.reason, value.given)


def _global_batch_field(flags: TrainConfig, batch: RecipeValue, dp: int) -> int:
    """``--global-batch-size`` as the resolved config keeps it: the flag, or auto's value where it differs from
    micro × ranks (so ``cfg.resolve_grad_accum(dp)`` gives the resolved accumulation)."""
    if flags.global_batch_size > 0 or batch.value != flags.micro_batch_size * dp * flags.grad_accum:
        return batch.value
    return flags.global_batch_size


def _seq_len_why(flag: Any, data: BuildReport) -> str:
    if flag != AUTO:
        return "given"
    if data.seq_len_at_limit:
        return "auto: the model's limit; longer rows are cut"
    longest = max((s.row.max for s in data.lengths.values()), default=0)
    return f"auto: holds every row (longest {longest})"


def _packing_why(flag: str, packed: bool, mean_row: float, seq_len: int, precision: str) -> str:
    if flag != AUTO:
        return "given"
    share = mean_row / seq_len if seq_len else 1.0
    if packed or share > PACK_AUTO_MAX_ROW_SHARE:
        return f"auto: the mean row fills {share:.0%} of seq_len"
    return f"auto: not measured faster on CPU at {precision}, seq_len {seq_len}"


def loss_kernel_choice(flags: TrainConfig, device_type: str, gpu: str) -> Choice:
    """``--loss-kernel``: full logits where the strategy runs no loss in the forward, else the measured rule."""
    why_not = forward_loss_unsupported(flags)
    if why_not is not None:
        return Choice("full", f"{flags.strategy}: no rank holds the LM head whole (tensor or pipeline parallelism)",
                      flags.loss_kernel not in (AUTO, "chunked"), f"full logits: {why_not}")
    picked, why = pick_loss_kernel(flags.loss_kernel, device_type, gpu, flags.loss_chunk_tokens,
                                   installed=_installed)
    return Choice(picked, why, flags.loss_kernel != AUTO)


def _installed(kernel: str) -> bool:
    return importlib.util.find_spec(LOSS_KERNEL_PACKAGES[kernel][0]) is not None


__all__ = ["Choice", "ModelFacts", "ResolvedConfig", "RunFacts", "brief", "loss_kernel_choice", "precision_choice",
           "resolve_run"]
