"""What a rank holds under a DeepSpeed engine: parameters, gradients, optimizer states, buffers, in bytes.

A CPU has no ``max_memory_allocated`` and RSS mixes in everything, so the tensors the ZeRO formulas talk about are
enumerated from the engine and counted once per storage (views once, padding included).
"""

from __future__ import annotations

from typing import Any, Iterable, Iterator

import torch

from ecomkit.parallel.state_bytes import storage_key

CATEGORIES = ("params", "grads", "optimizer", "buffers")
_SKIP_TYPES = (torch.nn.Module,)
_MAX_DEPTH = 12  # deep enough for optimizer.param_groups[i]["params"][j]; containers are visited once


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


def _short(path: str) -> str:
    """``single_partition_of_fp32_groups.0`` → ``single_partition_of_fp32_groups``; keep ``.grad``."""
    parts = [p for p in path.split(".") if not p.isdigit()]
    name = parts[0] if parts else path
    if name == "optimizer" and len(parts) > 1:
        name = "optimizer." + parts[1]
    if parts and parts[-1] == "grad":
        name += ".grad"
    return name.replace("_DeepSpeedZeroOptimizer_Stage3__", "")


def zero_state_bytes(engine: Any) -> dict[str, Any]:
    """Bytes of params / grads / optimizer states (+ comm buffers) this rank holds under a DeepSpeed engine.

    Parameters win when storages are shared (ZeRO-1/2's flat 16-bit buffer *is* the parameters); ``breakdown`` names
    where each storage was found.
    """
    counted: dict[int, str] = {}
    sizes: dict[int, int] = {}
    on_host: dict[int, bool] = {}
    breakdown: dict[str, int] = {}

    def add(t: torch.Tensor, category: str, where: str) -> None:
        key = storage_key(t)
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
    out["host_bytes"] = sum(sizes[k] for k in counted if on_host[k])
    out["accelerator_bytes"] = sum(sizes[k] for k in counted if not on_host[k])
    out["breakdown"] = dict(sorted(breakdown.items(), key=lambda kv: -kv[1]))
    if torch.cuda.is_available():
        out["cuda_allocated"] = int(torch.cuda.memory_allocated())
        out["cuda_max_allocated"] = int(torch.cuda.max_memory_allocated())
    return out


def largest_layer_params(model: torch.nn.Module) -> int:
    """Parameters of the largest leaf module (what ZeRO-3 gathers at once), as DeepSpeed's estimator counts them.

    Under ZeRO-3 a parameter's ``numel()`` is 0 outside its forward; ``ds_numel`` is its full size.
    """
    best = 0
    for m in model.modules():
        if next(m.children(), None) is None:
            best = max(best, sum(getattr(p, "ds_numel", p.numel()) for p in m.parameters(recurse=False)))
    return best
