"""What ``--recommend`` prints: the ranked table, the launch line, the DeepSpeed JSON, and the refusal.

Why one object: :func:`recommendation_json` builds the answer ``--json``, notebook 06 and ``--verify`` read, and
:func:`render_recommendation` turns it into text, so the table and the JSON cannot disagree.
"""

from __future__ import annotations

from typing import Any

from ecomkit.config import StrategyName, TrainConfig
from ecomkit.hardware import GIB
from ecomkit.parallel.zero.config import zero_config_for_launch
from ecomkit.planner.candidates import FULL, checkpoint_note, launch_line
from ecomkit.planner.job import Cluster, planned_seq_len
from ecomkit.planner.recommend import GROUP_NOTES, best_choice, choice_row, global_batch, recommend, what_would_fit
from ecomkit.planner.shapes import model_shape


def ds_config(cfg: TrainConfig, cluster: Cluster) -> dict[str, Any] | None:
    """The DeepSpeed JSON ``scripts/03_zero3.py`` builds for ``cfg`` on the cluster's GPUs (None unless ZeRO).

    The script's ``--print-ds-config`` builder, with pinned host buffers on, as the script sets them under CUDA.
    """
    if cfg.strategy != StrategyName.ZERO:
        return None
    ds = zero_config_for_launch(cfg, cluster.gpus, n_params=model_shape(cfg.model).n_params
                                if cfg.model else None)
    for key in ("offload_optimizer", "offload_param"):
        if key in ds.get("zero_optimization", {}):
            ds["zero_optimization"][key]["pin_memory"] = True
    return ds


def recommendation_json(base: TrainConfig, cluster: Cluster, given: set[str], vocab_size: int | None = None,
                        time_kw: dict[str, Any] | None = None) -> dict[str, Any]:
    """The whole recommendation as one object: groups of ranked rows, the pick, its launch lines and DS JSON."""
    ranked = recommend(base, cluster, vocab_size, time_kw)
    out: dict[str, Any] = {"model": base.model, "psi": model_shape(base.model, vocab_size).n_params,
                           "cluster": {"gpus": cluster.gpus, "gpu": cluster.gpu, "link": cluster.interconnect,
                                       "link_given": cluster.link is not None,
                                       "node": cluster.node, "nodes": cluster.nodes},
                           "global_batch": global_batch(base, cluster), "seq_len": planned_seq_len(base)[0],
                           "precision": base.precision, "groups": {}}
    for group, choices in ranked.items():
        best = best_choice(ranked, group)
        rows = [choice_row(c, best, cluster, given) for c in choices]
        entry: dict[str, Any] = {"rows": rows, "best": rows[0] if best else None, "note": GROUP_NOTES.get(group)}
        if best is not None and best.cfg is not None:
            entry["launch"] = launch_line(best.cfg, cluster, given)
            entry["launch_note"] = checkpoint_note(best.cfg.model)   # a preset: where the user's checkpoint goes
            if best.cfg.strategy == StrategyName.ZERO:
                entry["launch_deepspeed"] = launch_line(best.cfg, cluster, given, launcher="deepspeed")
            entry["ds_config"] = ds_config(best.cfg, cluster)
            entry["config"] = best.cfg.to_dict()
            entry["host_bytes_per_node"] = best.plan.cpu_bytes * cluster.gpus_per_node if best.plan else 0
        out["groups"][group] = entry
    full = out["groups"][FULL]
    out["best"], out["launch"], out["ds_config"] = full["best"], full.get("launch"), full.get("ds_config")
    out["what_would_fit"] = None if full["best"] else what_would_fit(base, cluster, vocab_size, time_kw)
    return out


def _gib(n: float) -> str:
    return f"{n / GIB:6.1f}"


def render_table(rows: list[dict[str, Any]], top: int) -> list[str]:
    w = max([30] + [len(r["candidate"]) + 1 for r in rows[:top]])   # a 3-D pipeline's label is longer
    head = (f"{'#':>2}  {'candidate':<{w}}{'micro×acc':>10}{'peak GiB':>9}{'headroom':>9}{'load GiB':>9}"
            f"{'host GiB':>9}{'step s':>8}{'tok/s/GPU':>10}  {'peak mostly':<20}  why")
    lines = [head, "-" * len(head)]
    for i, r in enumerate(rows[:top], 1):
        mb = f"{r['micro_batch']}×{r['grad_accum']}" if "micro_batch" in r else "-"
        mem = (_gib(r["peak_bytes"]) + "  " + _gib(r["headroom_bytes"]) + " " + _gib(r["load_bytes"]) + "   "
               + _gib(r["cpu_bytes"])) if "peak_bytes" in r else f"{'-':>9}{'-':>9}{'-':>9}{'-':>9}"
        speed = (f"{r['step_s']:8.2f}{r['tokens_per_s_per_gpu']:10,.0f}" if "step_s" in r else f"{'-':>8}{'-':>10}")
        lines.append(f"{i:>2}  {r['candidate']:<{w}}{mb:>10}   {mem}{speed}  {r.get('mostly') or '':<20}  {r['why']}")
    if len(rows) > top:
        fitting = sum(r["fits"] for r in rows[top:])
        lines.append(f"    … {len(rows) - top} more ({fitting} of them fit; --top N shows them, --json all)")
    return lines


PART_COLUMNS = {"parameters": "params", "gradients": "grads", "optimizer states": "optim", "activations": "activ",
                "logits": "logits", "buffers": "buffers"}


def explain_parts(rows: list[dict[str, Any]]) -> list[str]:
    """``--explain``: every candidate's memory parts per GPU, the step's total and the loading copy (GiB)."""
    head = f"  {'candidate':<30}" + "".join(f"{c:>8}" for c in PART_COLUMNS.values()) + f"{'step':>8}{'load':>8}"
    lines = ["memory parts per GPU (GiB; the peak is the larger of the step and the loading copy):", head]
    for r in rows:
        if "memory_parts" not in r:
            lines.append(f"  {r['candidate']:<30}  not planned ({r['why']})")
            continue
        parts = "".join(f"{r['memory_parts'][k] / GIB:8.1f}" for k in PART_COLUMNS)
        lines.append(f"  {r['candidate']:<30}{parts}{r['train_bytes'] / GIB:8.1f}{r['load_bytes'] / GIB:8.1f}")
    return lines


def render_recommendation(rep: dict[str, Any], top: int = 8, explain: bool = False) -> str:
    c = rep["cluster"]
    link = c["link"] + ("" if c.get("link_given", True) else f" [the {c['gpu']}'s own; --link sets another]")
    lines = [f"{rep['model']} (Ψ = {rep['psi']:,}) on {c['gpus']} × {c['gpu']} ({link}, {c['nodes']} node(s)), "
             f"{rep['precision']}, global batch {rep['global_batch']} × {rep['seq_len']} tokens per optimizer step",
             "ranked by predicted time per global batch; memory is the peak per GPU (training step or checkpoint "
             "load), headroom what is left of the GPU",
             *([f"note: {rep['efficiency_note']}"] if rep.get("efficiency_note") else []), ""]
    for group, entry in rep["groups"].items():
        lines += [f"[{group}]", *([f"note: {entry['note']}"] if entry.get("note") else []),
                  *render_table(entry["rows"], top), ""]
        if explain:
            lines += [*explain_parts(entry["rows"]), ""]
        if entry.get("launch"):
            if entry.get("host_bytes_per_node"):
                lines.append(f"host memory the offload needs: {entry['host_bytes_per_node'] / GIB:.0f} GiB per node "
                             "(pinned; the hardware table has no host RAM figure to check it against)")
            lines += ["launch:", f"  {entry['launch']}"]
            if entry.get("launch_deepspeed"):
                lines += ["or with the DeepSpeed launcher:", f"  {entry['launch_deepspeed']}",
                          "its DeepSpeed JSON: add --print-ds-config to this command"]
            if entry.get("launch_note"):
                lines.append(f"note: {entry['launch_note']}")
            lines.append("")
    if rep.get("what_would_fit"):
        lines += ["nothing fits. What would:", *[f"  - {t}" for t in rep["what_would_fit"]]]
    if rep.get("verify"):
        rows = next(iter(rep["groups"].values()))["rows"] if rep.get("groups") else None
        lines += ["", *verify_lines(rep["verify"], rows)]
    return "\n".join(lines).rstrip()


def verify_lines(v: dict[str, Any], rows: list[dict[str, Any]] | None = None) -> list[str]:
    """The twins' report; with the table's ``rows``, what an OFF PLAN twin means for the verdicts above it."""
    lines = [f"verified on this machine: scaled-down twins ({v['twin_model']}, {v['nproc']} processes, "
             f"{v['backend']}, {v['steps']} steps)"]
    limit = v.get("plan_gap_limit", 0.10)
    for t in v["twins"]:
        state = "launched, trained, saved" if t["ok"] else f"FAILED: {t['error']}"
        mem = f"; measured model states per rank {t['measured_mib']} MiB (planned {t['planned_mib']} MiB)" \
            if t.get("measured_mib") else ""
        gap = t.get("plan_gap")
        if gap is not None:
            mem += (f": {abs(gap):.0%} {'above' if gap > 0 else 'below'} the plan, more than {limit:.0%}: "
                    "OFF PLAN" if abs(gap) > limit else f", within {limit:.0%} of the plan")
        lines.append(f"  {t['candidate']}: {state} (loss {t.get('first_loss', float('nan')):.3f} → "
                     f"{t.get('final_loss', float('nan')):.3f}){mem}")
    if v.get("off_plan"):
        lines.append(f"  {len(v['off_plan'])} of {len(v['twins'])} twins are more than {limit:.0%} off their plan "
                     f"({', '.join(v['off_plan'])}); what that means is below")
    lines.append(f"  memory ordering of the twins: measured {v['measured_order']} vs planned {v['planned_order']} → "
                 f"{v.get('order_note') or ('matches' if v['order_matches'] else 'does NOT match')}")
    return lines + verify_advice(v, rows)


def _off_plan_verdict(twin: dict[str, Any], row: dict[str, Any] | None, limit: float) -> str:
    """One twin more than ``limit`` off its plan: which figure, which way, and whether its fit verdict stands."""
    gap, name = twin["plan_gap"], twin["candidate"]
    if gap < 0:
        return (f"  - {name}: its model states measured {-gap:.0%} below the plan, so its peak above is "
                "conservative (the plan over-counts): the verdict stands.")
    head = f"  - {name}: its model states measured {gap:.0%} above the plan, so its peak above is optimistic"
    if not row or "peak_bytes" not in row:
        return head + f": check that its headroom covers {gap:.0%} of its peak."
    worst = row["peak_bytes"] * (1 + gap)          # the gap applied to the whole peak: an upper bound
    stands = worst <= row["gpu_bytes"]
    return (head + f"; at +{gap:.0%} on its whole peak ({worst / GIB:.1f} GiB, an upper bound) it "
            + (f"still fits the {row['gpu_bytes'] / GIB:.1f} GiB GPU: the verdict stands." if stands else
               f"does NOT fit the {row['gpu_bytes'] / GIB:.1f} GiB GPU: the verdict may not hold."))


def verify_advice(v: dict[str, Any], rows: list[dict[str, Any]] | None = None) -> list[str]:
    """What OFF PLAN twins and a mismatched ordering mean for the table: figure, direction, ranking, what to do.

    Nothing when all agree. The twins test the memory column, never step times: only ties broken by peak depend on them.
    """
    limit = v.get("plan_gap_limit", 0.10)
    off = [t for t in v["twins"] if t.get("plan_gap") is not None and abs(t["plan_gap"]) > limit]
    mismatch = v.get("order_matches") is False
    if not off and not mismatch:
        return []
    by_name = {r["candidate"]: r for r in rows or []}
    lines = ["  what this means for the table above: the twins check its memory column (the model states per "
             "GPU), not its step times, so the ranking by predicted time is neither confirmed nor refuted here.",
             *[_off_plan_verdict(t, by_name.get(t["candidate"]), limit) for t in off]]
    if mismatch:
        lines.append("  - the measured memory ordering differs from the planned one: a tie above that went to the "
                     "smaller peak may go the other way (a tie's simpler layout does not depend on it).")
    if any(t["plan_gap"] > 0 for t in off) or mismatch:
        lines.append("  what to do: where a verdict may not hold, take the next row whose headroom covers the gap, "
                     "or run the launch line for a few steps (--max-steps 5) on one real node and read its "
                     "memory.json / parallel_layout.json; the twins' own commands are in --json "
                     "(verify.twins[].command).")
    return lines


__all__ = ["ds_config", "explain_parts", "recommendation_json", "render_recommendation", "render_table", "verify_advice",
           "verify_lines"]
