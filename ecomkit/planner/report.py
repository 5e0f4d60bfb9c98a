"""What ``--recommend`` prints: the ranked table, the launch line, the DeepSpeed JSON, and the refusal.

One function builds the whole answer as a plain object
(:func:`recommendation_json`, what ``--json`` prints and what notebook 06 and
``--verify`` read); :func:`render_recommendation` turns that object into text,
so the table and the JSON can never disagree.
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

    The same builder as ``--print-ds-config`` of the script
    (:func:`ecomkit.parallel.zero.config.zero_config_for_launch`); pinned host
    buffers are on, as the script sets them when CUDA is present.
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
    head = (f"{'#':>2}  {'candidate':<30}{'micro×acc':>10}{'peak GiB':>9}{'headroom':>9}{'load GiB':>9}"
            f"{'host GiB':>9}{'step s':>8}{'tok/s/GPU':>10}  why")
    lines = [head, "-" * len(head)]
    for i, r in enumerate(rows[:top], 1):
        mb = f"{r['micro_batch']}×{r['grad_accum']}" if "micro_batch" in r else "-"
        mem = (_gib(r["peak_bytes"]) + "  " + _gib(r["headroom_bytes"]) + " " + _gib(r["load_bytes"]) + "   "
               + _gib(r["cpu_bytes"])) if "peak_bytes" in r else f"{'-':>9}{'-':>9}{'-':>9}{'-':>9}"
        speed = (f"{r['step_s']:8.2f}{r['tokens_per_s_per_gpu']:10,.0f}" if "step_s" in r else f"{'-':>8}{'-':>10}")
        lines.append(f"{i:>2}  {r['candidate']:<30}{mb:>10}   {mem}{speed}  {r['why']}")
    if len(rows) > top:
        fitting = sum(r["fits"] for r in rows[top:])
        lines.append(f"    … {len(rows) - top} more ({fitting} of them fit; --top N shows them, --json all)")
    return lines


def render_recommendation(rep: dict[str, Any], top: int = 8) -> str:
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
        lines += ["", *verify_lines(rep["verify"])]
    return "\n".join(lines).rstrip()


def verify_lines(v: dict[str, Any]) -> list[str]:
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
                     f"({', '.join(v['off_plan'])}): the planner misses memory these setups hold")
    lines.append(f"  memory ordering of the twins: measured {v['measured_order']} vs planned {v['planned_order']} → "
                 f"{v.get('order_note') or ('matches' if v['order_matches'] else 'does NOT match')}")
    return lines


__all__ = ["ds_config", "recommendation_json", "render_recommendation", "render_table", "verify_lines"]
