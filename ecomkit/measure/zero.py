"""Model-state memory per rank under ZeRO: measured, by formula, and by DeepSpeed's own estimators.

Why measure by counting tensors: on CPU there is no ``max_memory_allocated``,
and process RSS mixes in Python, libraries and activations. What the ZeRO
paper's formulas talk about is the bytes of parameters, gradients and
optimizer states a rank holds, and those are tensors we can enumerate: the
module's parameters (under ZeRO-3 their ``ds_tensor`` partitions), their
gradients, and every tensor the DeepSpeed optimizer object keeps (fp32 master
partitions, Adam moments, gradient partitions, communication buckets).
Tensors are de-duplicated by *storage* and each storage counted at its full
size, so views (ZeRO's flat buffers) are counted once and padding is included.
On GPU the loop's ``peak_mem_bytes`` (``max_memory_allocated``) adds
activations and temporaries on top.

The formulas (mixed-precision Adam: 2-byte params and grads, 12 bytes of
fp32 master + momentum + variance per parameter; Ψ parameters, N ranks):
stage 0 ``16Ψ``, stage 1 ``4Ψ + 12Ψ/N``, stage 2 ``2Ψ + 14Ψ/N``, stage 3
``16Ψ/N``. :func:`formula_bytes` generalises them to fp32 training, where
params and grads take 4 bytes and DeepSpeed *still* keeps a separate fp32
master partition (a clone, 4 bytes) besides the 8 bytes of Adam moments.
"""

from __future__ import annotations

from typing import Any, Callable, Iterable, Iterator

import torch

CATEGORIES = ("params", "grads", "optimizer", "buffers")
_SKIP_TYPES = (torch.nn.Module,)
_MAX_DEPTH = 12  # deep enough for optimizer.param_groups[i]["params"][j]; containers are visited once


# ---------------------------------------------------------------------- formulas
def formula_bytes(stage: int, psi: int, n: int, param_bytes: int = 2, master_bytes: int = 4,
                  adam_bytes: int = 8) -> dict[str, float]:
    """Per-rank model-state bytes of ZeRO ``stage`` (0 = DDP), split into params / grads / optimizer.

    Defaults are mixed precision (bf16/fp16 weights and grads, fp32 master and
    moments): the 16Ψ, 4Ψ+12Ψ/N, 2Ψ+14Ψ/N, 16Ψ/N of the ZeRO paper. For fp32
    training under DeepSpeed use ``param_bytes=4`` (master_bytes stays 4: the
    ZeRO optimizer clones its fp32 partition even when the weights are fp32);
    for plain torch DDP in fp32 use ``param_bytes=4, master_bytes=0``.
    """
    opt = (master_bytes + adam_bytes) * psi
    params = param_bytes * psi / (n if stage >= 3 else 1)
    grads = param_bytes * psi / (n if stage >= 2 else 1)
    optimizer = opt / (n if stage >= 1 else 1)
    return {"params": params, "grads": grads, "optimizer": optimizer, "total": params + grads + optimizer}


def formula_label(stage: int, param_bytes: int = 2, master_bytes: int = 4, adam_bytes: int = 8) -> str:
    """The formula as text, e.g. ``4Ψ + 12Ψ/N`` (mixed precision, stage 1) or ``20Ψ/N`` (DeepSpeed fp32, stage 3)."""
    p, o = param_bytes, master_bytes + adam_bytes
    return {0: f"{2 * p + o}Ψ", 1: f"{2 * p}Ψ + {o}Ψ/N", 2: f"{p}Ψ + {p + o}Ψ/N", 3: f"{2 * p + o}Ψ/N"}[stage]


def deepspeed_estimates(psi: int, largest_layer: int, n_gpus: int, n_nodes: int = 1) -> dict[str, dict[str, int]]:
    """DeepSpeed's own model-state estimators (the numbers its ``*_all_cold`` functions print), per GPU / CPU.

    The printing ``estimate_zero{2,3}_model_states_mem_needs_all_cold`` call
    these functions for each offload option; we call them directly to get the
    numbers. Their assumptions differ from the paper's formulas (see
    :data:`ESTIMATOR_NOTES`).
    """
    from ecomkit.parallel.zero.config import ensure_deepspeed_env

    ensure_deepspeed_env()
    from deepspeed.runtime.zero.stage3 import estimate_zero3_model_states_mem_needs
    from deepspeed.runtime.zero.stage_1_and_2 import estimate_zero2_model_states_mem_needs

    out: dict[str, dict[str, int]] = {}
    for offload in (False, True):
        cpu, gpu = estimate_zero2_model_states_mem_needs(psi, n_gpus, n_nodes, cpu_offload=offload)
        out[f"zero2{'+offload_opt' if offload else ''}"] = {"gpu": gpu, "cpu": cpu}
    for offload, offload_params in ((False, False), (True, False), (True, True)):
        cpu, gpu, _ = estimate_zero3_model_states_mem_needs(psi, largest_layer, n_gpus, n_nodes,
                                                           cpu_offload=offload, cpu_offload_params=offload_params)
        key = "zero3" + ("+offload_opt" if offload else "") + ("+offload_param" if offload_params else "")
        out[key] = {"gpu": gpu, "cpu": cpu}
    return out


ESTIMATOR_NOTES = {
    "zero2": "DeepSpeed: 2Ψ + 18Ψ/N. Its source itemises the 18 as 2 (16-bit grads) + 4 (fp32 grads: inside "
             "step() the gradient partition is copied to fp32 for the optimizer) + 4 (fp32 master) + 8 (Adam). The "
             "paper's 2Ψ+14Ψ/N has no fp32 gradient copy; the 'inside step()' count above does.",
    "zero3": "DeepSpeed: 4·L + 18Ψ/N, L = the largest layer's parameters (its gathered 16-bit params and grads, "
             "2+2 bytes, live at once). The 18 is not itemised in its source; against the measured 16 (2 params + "
             "2 grads + 4 master + 8 Adam) the extra 2 are of the order of the fp32 gradient copy made inside "
             "step() (4 bytes, per sub-group of sub_group_size elements). The paper's 16Ψ/N has no working-set "
             "term and no transient copies.",
    "offload": "With offload the estimators move the fp32 partitions, Adam states (and with offload_param the "
               "16-bit params) to CPU memory, multiplied by additional_buffer_factor=1.5 for pinned staging buffers.",
}


def largest_layer_params(model: torch.nn.Module) -> int:
    """Parameters of the largest leaf module (what ZeRO-3 gathers at once), as DeepSpeed's estimator counts them."""
    best = 0
    for m in model.modules():
        if next(m.children(), None) is None:
            best = max(best, sum(getattr(p, "ds_numel", p.numel()) for p in m.parameters(recurse=False)))
    return best


# ---------------------------------------------------------------------- measurement
def _storage(t: torch.Tensor) -> tuple[int, int] | None:
    """(data pointer, bytes) of the storage behind ``t``; None for empty or meta tensors."""
    if t.device.type == "meta":
        return None
    st = t.untyped_storage()
    return (st.data_ptr(), st.nbytes()) if st.nbytes() else None


def _walk(obj: Any, path: str, depth: int, seen: set[int]) -> Iterator[tuple[str, torch.Tensor]]:
    """Yield (attribute path, tensor) for tensors reachable from a DeepSpeed optimizer object."""
    if id(obj) in seen or depth > _MAX_DEPTH:
        return
    seen.add(id(obj))
    if torch.is_tensor(obj):
        yield path, obj
        if obj.grad is not None:
            yield path + ".grad", obj.grad
        return
    if isinstance(obj, _SKIP_TYPES):
        return
    if isinstance(obj, dict):
        items: Iterable = obj.items()
    elif isinstance(obj, (list, tuple, set)):
        items = enumerate(obj)
    elif isinstance(obj, torch.optim.Optimizer) or type(obj).__module__.startswith("deepspeed"):
        items = vars(obj).items() if hasattr(obj, "__dict__") else ()
        if isinstance(obj, torch.optim.Optimizer):
            items = list(items) + [("state", obj.state)]
    else:
        return
    for i, (key, value) in enumerate(items):
        name = key if isinstance(key, (str, int)) else i   # optimizer.state is keyed by tensors
        yield from _walk(value, f"{path}.{name}" if path else str(name), depth + 1, seen)


def _classify(path: str) -> str:
    low = path.lower()
    if "ipg" in low or "bucket" in low:
        return "buffers"   # communication buckets, sized by reduce_bucket_size, not by Ψ
    if "grad" in low:
        return "grads"
    return "optimizer"


def zero_state_bytes(engine: Any) -> dict[str, Any]:
    """Bytes of params / grads / optimizer states (+ comm buffers) this rank holds under a DeepSpeed engine.

    Parameters win over other categories when storages are shared (ZeRO-1/2's
    flat 16-bit buffer *is* the module's parameters). ``breakdown`` names the
    attribute each counted storage was found under, to explain differences
    from the formulas.
    """
    counted: dict[int, str] = {}
    sizes: dict[int, int] = {}
    on_host: dict[int, bool] = {}
    breakdown: dict[str, int] = {}

    def add(t: torch.Tensor, category: str, where: str) -> None:
        key = _storage(t)
        if key is None or key[0] in counted:
            return
        counted[key[0]], sizes[key[0]], on_host[key[0]] = category, key[1], t.device.type == "cpu"
        label = f"{category}:{where}"
        breakdown[label] = breakdown.get(label, 0) + key[1]

    module = engine.module
    for p in module.parameters():
        ds_tensor = getattr(p, "ds_tensor", None)
        add(ds_tensor if ds_tensor is not None else p.data, "params", "ds_tensor" if ds_tensor is not None else "module")
    for p in module.parameters():
        if p.grad is not None:
            add(p.grad, "grads", "param.grad")
    for path, t in _walk(engine.optimizer, "", 0, set()):
        add(t, _classify(path), _short(path))
    out: dict[str, Any] = {c: 0 for c in CATEGORIES}
    for ptr, cat in counted.items():
        out[cat] += sizes[ptr]
    out["total"] = out["params"] + out["grads"] + out["optimizer"]
    # where the bytes live: with a GPU, offload moves them to host RAM; on a CPU-only machine all are host
    out["host_bytes"] = sum(sizes[k] for k in counted if on_host[k])
    out["accelerator_bytes"] = sum(sizes[k] for k in counted if not on_host[k])
    out["breakdown"] = dict(sorted(breakdown.items(), key=lambda kv: -kv[1]))
    if torch.cuda.is_available():
        out["cuda_allocated"] = int(torch.cuda.memory_allocated())
        out["cuda_max_allocated"] = int(torch.cuda.max_memory_allocated())
    return out


def _short(path: str) -> str:
    """``single_partition_of_fp32_groups.0`` → ``single_partition_of_fp32_groups``; keep ``.grad``."""
    parts = [p for p in path.split(".") if not p.isdigit()]
    name = parts[0] if parts else path
    if name == "optimizer" and len(parts) > 1:
        name = "optimizer." + parts[1]
    if parts and parts[-1] == "grad":
        name += ".grad"
    return name.replace("_DeepSpeedZeroOptimizer_Stage3__", "")


# ---------------------------------------------------------------------- the probe callback
class MemoryProbeCallback:
    """Counts model-state bytes just before each optimizer step, for any strategy; gathers them per rank.

    Before the step is when gradients are still alive and (from step 2 on)
    optimizer states exist, so it is the moment of peak *resident* model
    state (after each backward too, which catches ZeRO-1's full gradients
    between accumulation micro-steps). A separate count is taken inside the
    torch optimizer's ``step()`` (a step pre-hook), where DeepSpeed holds
    transient fp32 copies of the gradient partition: DeepSpeed's estimators
    include those, the paper's formulas do not. The largest snapshots are
    kept; at the end rank 0 writes ``memory.json`` with every rank's numbers
    (``per_rank``) and the run's Ψ and world size.
    """

    def __init__(self, out_path: str | None = None):
        self.out_path = out_path
        self.best: dict[str, Any] = {}      # resident model states (after backward / before the step)
        self.in_step: dict[str, Any] = {}   # the largest count taken inside the torch optimizer's step()
        self.per_rank: list[dict[str, Any]] = []

    def on_train_start(self, run) -> None:
        strategy = run.strategy
        step: Callable = strategy.clip_and_step
        backward: Callable = strategy.backward

        def probed_step(max_norm: float):
            self._sample(strategy, "before optimizer step")
            return step(max_norm)

        def probed_backward(loss):
            out = backward(loss)
            self._sample(strategy, "after backward")  # catches stage 1's full gradients between micro-steps
            return out

        strategy.clip_and_step = probed_step
        strategy.backward = probed_backward
        base = getattr(strategy.optimizer, "optimizer", strategy.optimizer)  # DeepSpeed wraps a torch optimizer
        if isinstance(base, torch.optim.Optimizer):
            base.register_step_pre_hook(lambda *_: self._sample_in_step(strategy))

    def _sample(self, strategy, moment: str) -> None:
        snap = strategy.memory_report()
        if snap.get("total", 0) >= self.best.get("total", -1):
            self.best = {**snap, "moment": moment}

    def _sample_in_step(self, strategy) -> None:
        """Inside the optimizer step DeepSpeed holds transient fp32 copies of the gradient partition."""
        snap = strategy.memory_report()
        if snap.get("total", 0) >= self.in_step.get("total", -1):
            self.in_step = snap

    def on_train_end(self, run, summary: dict[str, Any]) -> None:
        import json
        from pathlib import Path

        import torch.distributed as dist

        mine = {**self.best, "in_step": {k: v for k, v in self.in_step.items() if k != "breakdown"},
                "in_step_breakdown": self.in_step.get("breakdown", {})}
        if run.env.distributed:
            gathered: list[Any] = [None] * run.env.world_size
            dist.all_gather_object(gathered, mine)
        else:
            gathered = [mine]
        self.per_rank = gathered
        summary["model_state_bytes_per_rank"] = [g.get("total") for g in gathered]
        if run.env.is_main and self.out_path:
            report = {"strategy": run.strategy.name, "stage": _stage_of(run), "world_size": run.env.world_size,
                      "psi": run.n_params, "precision": run.cfg.precision, "per_rank": gathered,
                      "offload_optimizer": run.cfg.zero.offload_optimizer and run.cfg.strategy == "zero",
                      "offload_param": run.cfg.zero.offload_param and run.cfg.strategy == "zero",
                      "largest_layer": largest_layer_params(run.strategy.raw_model),
                      "param_numels": [getattr(p, "ds_numel", p.numel()) for p in run.strategy.raw_model.parameters()]}
            Path(self.out_path).parent.mkdir(parents=True, exist_ok=True)
            Path(self.out_path).write_text(json.dumps(report, indent=2))


def _stage_of(run) -> int:
    return run.cfg.zero.stage if run.cfg.strategy == "zero" else 0


# ---------------------------------------------------------------------- comparison tables
def state_bytes_per_element(strategy: str, precision: str) -> dict[str, int]:
    """What each parameter costs in bytes for a strategy and precision (inputs to :func:`formula_bytes`).

    - ecomkit DDP: fp32 weights (autocast computes in bf16 but stores fp32),
      fp32 grads, torch AdamW's two fp32 moments, no separate master: 4+4+8.
    - DeepSpeed in bf16/fp16: 2-byte weights and grads, fp32 master + moments: 2+2+12.
    - DeepSpeed in fp32: 4-byte weights and grads, and the ZeRO optimizer still
      clones its fp32 partition as a "master": 4+4+12.
    """
    if strategy == "ddp":
        return {"param_bytes": 4, "master_bytes": 0, "adam_bytes": 8}
    return {"param_bytes": 4 if precision == "fp32" else 2, "master_bytes": 4, "adam_bytes": 8}


def zero3_padding_elements(numels: Iterable[int], n: int) -> int:
    """Per-rank elements of padding under ZeRO-3: each parameter is cut into N equal pieces of ceil(numel/N)."""
    return sum(-(-k // n) for k in numels) - sum(numels) / n


def memory_row(report: dict[str, Any], label: str) -> dict[str, Any]:
    """One variant's measured bytes (largest rank) beside its precision-matched formula and the paper's."""
    ranks = report["per_rank"]
    measured = {c: max(r.get(c, 0) for r in ranks) for c in (*CATEGORIES, "total")}
    stage, n, psi = report["stage"], report["world_size"], report["psi"]
    per_elem = state_bytes_per_element(report["strategy"], report["precision"])
    formula = formula_bytes(stage, psi, n, **per_elem)
    return {"label": label, "strategy": report["strategy"], "stage": stage, "world_size": n, "psi": psi,
            "precision": report["precision"], "offload": bool(report.get("offload_optimizer")),
            "measured": measured, "formula": formula, "paper": formula_bytes(stage, psi, n),
            "formula_label": formula_label(stage, **per_elem), "ratio": measured["total"] / formula["total"],
            "breakdown": ranks[0].get("breakdown", {}), "moment": ranks[0].get("moment"),
            "in_step_total": max(r.get("in_step", {}).get("total", 0) for r in ranks),
            "in_step_breakdown": ranks[0].get("in_step_breakdown", {}),
            "largest_layer": report.get("largest_layer", 0)}


def explain_row(row: dict[str, Any]) -> list[str]:
    """Name the cause of every gap between the measured bytes and the formula, with the bytes involved."""
    notes: list[str] = []
    m, f, br = row["measured"], row["formula"], row["breakdown"]
    if row["strategy"] == "zero" and row["precision"] == "fp32":
        notes.append("fp32 training: 4-byte params and grads, and DeepSpeed still keeps a cloned fp32 master "
                     "partition (4 bytes/param) next to the weights, so its totals are 20Ψ-based, not 16Ψ.")
    if row["strategy"] == "ddp":
        notes.append("torch DDP keeps fp32 weights (autocast only computes in bf16) and AdamW's two moments: "
                     "4+4+8 = 16 bytes/param whatever --precision says; no separate master copy.")
    if m["buffers"]:
        notes.append(f"{m['buffers']:,} B of communication buckets (reduce/all-gather buffers sized by "
                     "reduce_bucket_size, capped at Ψ here; allocated up front, not part of any formula)"
                     + (". Stage 1/2 with overlap_comm keep two of them." if row["stage"] in (1, 2) else "."))
    extra_grads = int(m["grads"] - f["grads"])
    if row["stage"] in (1, 2) and extra_grads > 0.01 * f["grads"]:
        if row["offload"]:
            notes.append(f"+{extra_grads:,} B of gradients: with optimizer offload ZeRO-1/2 keep an fp32 copy of the "
                         "gradient partition for the CPU optimizer plus staging buffers for the copy.")
        else:
            notes.append(f"+{extra_grads:,} B of gradients: the contiguous gradient buffer holds the WHOLE gradient of "
                         "every parameter that touches this rank's partition, so a parameter straddling the partition "
                         "boundary (here the embedding, the largest tensor) is held in full by both ranks.")
    if row["stage"] == 1 and m["grads"] >= 0.99 * row["paper"]["grads"] * (2 if row["precision"] == "fp32" else 1):
        notes.append(f"stage 1 keeps full gradients between micro-steps (measured {row['moment']}): only the "
                     "optimizer states are partitioned.")
    if row["stage"] == 3 and row["offload"] and extra_grads > 0:
        notes.append(f"+{extra_grads:,} B: with optimizer offload ZeRO-3 keeps an fp32 gradient partition for the "
                     "CPU optimizer.")
    transient = int(row.get("in_step_total", 0) - m["total"])
    if row["strategy"] == "zero" and transient > 0.01 * m["total"]:
        notes.append(f"inside step() the rank briefly holds {transient:+,} B more: an fp32 copy of the gradient "
                     "partition, made for the optimizer one parameter group at a time. DeepSpeed's estimators count "
                     "such a copy, the formulas do not.")
    small = int(round(m["total"] - f["total"] - (extra_grads if extra_grads > 0.01 * f["grads"] else 0)))
    if 0 < abs(small) < 1024:
        notes.append(f"{small:+,} B: scalars (Adam step counters, the grad-norm and overflow trackers).")
    return notes


def extrapolate(psi: int, world_sizes: Iterable[int], stages: Iterable[int] = (0, 1, 2, 3)) -> list[dict[str, Any]]:
    """Mixed-precision per-GPU model-state bytes of ``psi`` parameters for each stage and world size."""
    return [{"stage": s, "world_size": n, "formula": formula_label(s), **formula_bytes(s, psi, n)}
            for n in world_sizes for s in stages]


def guide_plausibility(psi: int, dp_gb: float = 38.2, dp_batch: int = 12, z3_gb: float = 16.8, z3_batch: int = 24,
                       n_gpus: int = 4, largest_layer: int = 0) -> dict[str, float]:
    """Test the SeqGPT guide's table (DataParallel 38.2 GB at batch 12, ZeRO-3 16.8 GB at batch 24, 4 GPUs).

    Everything the DP row holds beyond model states (16Ψ) is activations and
    workspace, proportional to the batch. ZeRO-3 can remove model states (to
    16Ψ/N, or ~0 with full offload) but not activations, so at twice the batch
    its memory is at least ``2 × activations(12)`` plus what it keeps.
    """
    gb = 1e9
    dp_states = 16 * psi / gb
    act_per_sample = (dp_gb - dp_states) / dp_batch
    z3_states = 16 * psi / n_gpus / gb
    offload_states = 4 * largest_layer / gb
    return {"dp_model_states_gb": dp_states, "activation_gb_per_sample": act_per_sample,
            "z3_model_states_gb": z3_states, "z3_offload_working_set_gb": offload_states,
            "z3_predicted_gb": z3_states + act_per_sample * z3_batch,
            "z3_offload_predicted_gb": offload_states + act_per_sample * z3_batch,
            "z3_claimed_gb": z3_gb, "saving_ceiling_gb": dp_states - offload_states}
