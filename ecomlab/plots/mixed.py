"""Chapter 04 figures and tables: where each tensor lives, memory per rank, collectives per step."""

from __future__ import annotations

from typing import Any, Iterable, Mapping, Sequence

from ecomkit.planner.memory import PlanInput, state_bytes_of_rank
from ecomkit.planner.shapes import local_params, model_shape
from ecomlab.plots.common import _plt

MIB = 1024 * 1024
STATE_PARTS = ("params", "grads", "optimizer")
PART_COLORS = {"params": "#4C72B0", "grads": "#DD8452", "optimizer": "#55A868"}


def layout_rows(layout: Mapping[str, Any], name_contains: Sequence[str] = ("h.0.", "word_embeddings.weight")
                ) -> list[dict[str, Any]]:
    """Flatten a ``parallel_layout.json`` into one row per (rank, parameter) for the names asked for."""
    rows = []
    for rank in layout["ranks"]:
        for p in rank["params"]:
            if any(s in p["name"] for s in name_contains):
                rows.append({"rank": rank["rank"], "coords": rank["coords"], **p})
    return rows


def format_layout_table(layout: Mapping[str, Any], name_contains: Sequence[str] = ("h.0.", "word_embeddings.weight")
                        ) -> str:
    """A fixed-width text table: rank, (pp, dp, tp) coordinates, parameter, global → local shape, placement."""
    lines = [f"{'rank':>4}  {'pp,dp,tp':<8}  {'parameter':<46} {'global':>12} {'local on rank':>14}  placement"]
    for r in layout_rows(layout, name_contains):
        c = r["coords"]
        glob = "×".join(map(str, r["global_shape"]))
        loc = "×".join(map(str, r["local_shape"]))
        place = ",".join(r["placements"]) + (f" on {','.join(r['mesh_dims'])}" if r["mesh_dims"] else "")
        name = r["name"].replace("transformer.", "")
        lines.append(f"{r['rank']:>4}  {c['pp']},{c['dp']},{c['tp']:<4}  {name:<46} {glob:>12} {loc:>14}  {place}")
    return "\n".join(lines)


def plot_memory_per_rank(layouts: Mapping[str, Mapping[str, Any]], title: str = "model-state bytes per rank",
                         ax=None):
    """Stacked bars (params, grads, optimizer) for every rank of every run, grouped by run."""
    plt = _plt()
    fig = None
    if ax is None:
        fig, ax = plt.subplots(figsize=(max(6, 0.85 * sum(len(l["ranks"]) for l in layouts.values()) + 2), 3.8))
    x, ticks, labels = 0, [], []
    for run, layout in layouts.items():
        for rank in layout["ranks"]:
            bottom = 0.0
            for part in STATE_PARTS:
                value = rank["memory"][part] / MIB
                ax.bar(x, value, bottom=bottom, color=PART_COLORS[part], label=part if x == 0 else None)
                bottom += value
            ticks.append(x)
            labels.append(f"{run}\nr{rank['rank']}")
            x += 1
        x += 0.6
    ax.set_xticks(ticks, labels, fontsize=7)
    ax.set_ylabel("MiB")
    ax.set_title(title)
    ax.legend(fontsize=8)
    ax.grid(axis="y", alpha=0.3)
    return fig or ax.figure


def plot_comm_per_step(rows: Mapping[str, Mapping[str, Any]], key: str = "comm_wire_bytes",
                       title: str = "bytes sent per rank per optimizer step (rank 0)", ax=None):
    """One bar per run: ``key`` of a metrics row, split by collective kind, with the collective count on top."""
    plt = _plt()
    fig = None
    if ax is None:
        fig, ax = plt.subplots(figsize=(7, 3.8))
    kinds = sorted({k for r in rows.values() for k in r.get("comm_by_kind", {})})
    colors = plt.get_cmap("tab10")
    field = key.replace("comm_", "")
    for i, (run, row) in enumerate(rows.items()):
        bottom = 0.0
        for j, kind in enumerate(kinds):
            value = row.get("comm_by_kind", {}).get(kind, {}).get(field, 0) / MIB
            ax.bar(i, value, bottom=bottom, color=colors(j), label=kind if i == 0 else None)
            bottom += value
        ax.annotate(f"{row.get('comm_count', 0)} coll.", (i, bottom), ha="center", va="bottom", fontsize=8)
    ax.set_xticks(range(len(rows)), list(rows), fontsize=8)
    ax.set_ylabel("MiB")
    ax.set_title(title, pad=14)
    ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1.0))
    ax.margins(y=0.25)
    ax.grid(axis="y", alpha=0.3)
    return fig or ax.figure


def format_decision_table(rows: Iterable[Mapping[str, Any]]) -> str:
    """Text table of :func:`ecomkit.planner.layouts.decision_table` rows, the picked layout marked with ←."""
    lines = [f"{'model':<12} {'GPUs':>4}  {'layout':<24} {'states GB':>9} {'activ. GB':>9} {'total GB':>8} "
             f"{'fits':>5} {'sent GB/step':>12}"]
    for r in rows:
        lines.append(f"{r['model']:<12} {r['gpus']:>4}  {r['layout']:<24} {r['state_gb']:>9.1f} "
                     f"{r['activation_gb']:>9.1f} {r['total_gb']:>8.1f} {'yes' if r['fits'] else 'no':>5} "
                     f"{r['comm_gb_per_step']:>12.2f}" + ("  ← pick" if r["pick"] else ""))
    return "\n".join(lines)


def memory_vs_formula(layout: Mapping[str, Any], vocab_size: int, model: str = "tiny") -> list[dict[str, Any]]:
    """Per rank: measured model-state bytes (``parallel_layout.json``) next to the planner's for that rank.

    The planner (``ecomkit.planner.memory``, chapter 06) derives each rank's
    parameters from the model's exact shapes, this chapter's TP plan and
    pipeline split, and FSDP2's ``torch.chunk`` sharding, at 4 + 4 + 8 bytes per
    parameter (fp32 weights, gradients, two AdamW moments). Every layout's dp
    replicas shard with FSDP2, a pipeline's stages too.
    """
    dims = layout["dims"]
    shape = model_shape(model, vocab_size)
    strategy = "ddp" if dims["dp"] == 1 else "fsdp2"   # dp = 1: nothing to shard
    inp = PlanInput(model=model, world_size=dims["world_size"], strategy=strategy, tp=dims["tp"], pp=dims["pp"],
                    precision="fp32", vocab_size=vocab_size)
    rows = []
    for rank in layout["ranks"]:
        c = rank["coords"]
        params = local_params(shape, dims["tp"], dims["pp"], c["pp"])
        planned = state_bytes_of_rank(inp, params, c["dp"])
        formula = planned["params"] + planned["grads"] + planned["optimizer"]
        measured = rank["memory"]["total"]
        rows.append({"rank": rank["rank"], "measured_mib": measured / MIB, "planned_mib": formula / MIB,
                     "ratio": measured / formula})
    return rows


def decision_facts(rows: Iterable[Mapping[str, Any]], model: str, gpus: int) -> dict[str, Any]:
    """The figures chapter 04's prose quotes, read off :func:`ecomkit.planner.layouts.decision_table` rows.

    For ``model`` on ``gpus`` GPUs: the replicated model states per GPU (DDP's
    16Ψ) and summed over the GPUs, the range of the sharded layouts' model
    states, which layout holds the fewest model states, which needs the most
    memory in total, and the share of Ψ in the tied embedding (which TP and
    PP keep whole).
    """
    group = [r for r in rows if r["model"] == model and r["gpus"] == gpus]
    if not group:
        raise ValueError(f"no rows for {model} on {gpus} GPUs")
    ddp = next(r for r in group if r["layout"].startswith("DP"))
    sharded = [r for r in group if r is not ddp]
    leanest, worst = min(group, key=lambda r: r["state_gb"]), max(group, key=lambda r: r["total_gb"])
    shape = model_shape(model)
    return {"model": model, "gpus": gpus, "replicated_state_gb": ddp["state_gb"],
            "replicated_state_gb_all_gpus": gpus * ddp["state_gb"],
            "sharded_state_gb_range": (min(r["state_gb"] for r in sharded), max(r["state_gb"] for r in sharded)),
            "fewest_states_layout": leanest["layout"], "most_memory_layout": worst["layout"],
            "most_memory_gb": worst["total_gb"], "fits_anywhere_replicated": ddp["fits"],
            "embedding_share": shape.vocab * shape.hidden / shape.n_params}
