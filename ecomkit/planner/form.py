"""An ipywidgets form for the recommender (chapter 06 notebook): pick a job and a cluster, get the ranked setups.

"What if" questions are answered faster than by re-running a cell. No pyplot: a callback runs outside any cell, so
pyplot's global state would draw into the notebook's next output; the chart is its own ``Figure`` rendered to PNG.
"""

from __future__ import annotations

import html
import io
from typing import Any, Callable

from ecomkit.config import PRECISIONS, TrainConfig
from ecomkit.errors import EcomkitError
from ecomkit.hardware import GIB, GPUS, gpu_spec
from ecomkit.planner.links import LINKS
from ecomkit.planner.job import Cluster
from ecomkit.planner.report import recommendation_json, render_recommendation

MODELS = ("seqgpt-560m", "ecomgpt-7b")
DEFAULT_LINK = "the GPU's own"        # Cluster(link=None)
FITS, DOES_NOT_FIT, CAPACITY = "#4C72B0", "#C44E52", "#333333"
TOP = 8


def _controls(job: TrainConfig, cluster: Cluster) -> dict[str, Any]:
    import ipywidgets as w  # lazy: optional notebook dependency, only the form needs it

    links = [DEFAULT_LINK, *LINKS]
    return {
        "model": w.Dropdown(options=MODELS, value=job.model if job.model in MODELS else MODELS[0],
                            description="model"),
        "gpu": w.Dropdown(options=list(GPUS), value=gpu_spec(cluster.gpu).key, description="GPU"),
        "gpus": w.IntSlider(value=cluster.gpus, min=1, max=64, description="GPUs"),
        "link": w.Dropdown(options=links, value=cluster.link or DEFAULT_LINK, description="link"),
        "precision": w.Dropdown(options=PRECISIONS, value=job.precision, description="precision"),
        "seq_len": w.Dropdown(options=[128, 256, 512, 1024, 2048, 4096], value=job.seq_len, description="seq len"),
        "micro_batch_size": w.IntSlider(value=job.micro_batch_size, min=1, max=64, description="micro-batch"),
        "grad_accum": w.IntSlider(value=job.grad_accum, min=1, max=64, description="accumulation"),
    }


def describe_recommendation(job: TrainConfig, cluster: Cluster, top: int = 6) -> tuple[dict[str, Any] | None, str]:
    """(report or None, text) for one setting; user errors become the text instead of a traceback."""
    try:
        report = recommendation_json(job, cluster, set())
    except EcomkitError as exc:
        return None, f"✗ {exc}"
    return report, render_recommendation(report, top)


def _rows(report: dict[str, Any]) -> list[dict[str, Any]]:
    return next(iter(report["groups"].values()))["rows"]


def verdict_html(report: dict[str, Any], job: TrainConfig, previous_batch: int | None = None) -> str:
    """The recommendation or the blocker, and the global batch (with a notice when it just changed)."""
    c, best = report["cluster"], report["best"]
    cap = gpu_spec(c["gpu"]).memory_bytes / GIB
    link = c["link"] + ("" if c.get("link_given", True) else ", the GPU's own link")
    if best:
        head = (f"<b>Recommended: {html.escape(best['candidate'])}</b>: {best['step_s']:.2f} s per optimizer step "
                f"over {html.escape(link)}, peak {best['peak_bytes'] / GIB:.1f} of {cap:.1f} GiB per GPU")
    else:
        tips = report.get("what_would_fit") or ["nothing the planner searches fits"]
        head = (f"<b>Nothing fits on {c['gpus']} × {html.escape(gpu_spec(c['gpu']).name)}.</b> "
                f"What would: {html.escape(tips[0])}" + "".join(f"; {html.escape(t)}" for t in tips[1:]))
    batch = (f"global batch {report['global_batch']} samples × {report['seq_len']} tokens per optimizer step "
             f"(micro-batch {job.micro_batch_size} × accumulation {job.grad_accum} × {c['gpus']} GPU(s))")
    if previous_batch is not None and previous_batch != report["global_batch"]:
        batch = (f"<b>The global batch changed: {previous_batch} → {report['global_batch']} samples per optimizer "
                 f"step</b> (it is micro-batch × accumulation × GPUs; change the accumulation to keep it). " + batch)
    return f"<div>{head}</div><div>{batch}</div>"


def table_html(report: dict[str, Any], top: int = TOP) -> str:
    """The ranked candidates as an HTML table (those that do not fit in red), then the launch line."""
    head = "".join(f"<th>{h}</th>" for h in ("#", "candidate", "micro×acc", "peak GiB", "headroom GiB", "step s",
                                             "tok/s/GPU", "why"))
    body = []
    for i, r in enumerate(_rows(report)[:top], 1):
        cells = [str(i), r["candidate"], f"{r['micro_batch']}×{r['grad_accum']}" if "micro_batch" in r else "-",
                 f"{r['peak_bytes'] / GIB:.1f}" if "peak_bytes" in r else "-",
                 f"{r['headroom_bytes'] / GIB:.1f}" if "headroom_bytes" in r else "-",
                 f"{r['step_s']:.2f}" if "step_s" in r else "-",
                 f"{r['tokens_per_s_per_gpu']:,.0f}" if "tokens_per_s_per_gpu" in r else "-", r["why"]]
        style = "" if r["fits"] else f' style="color:{DOES_NOT_FIT}"'
        body.append(f"<tr{style}>" + "".join(f"<td>{html.escape(x)}</td>" for x in cells) + "</tr>")
    out = f'<table class="ecomkit-plan"><thead><tr>{head}</tr></thead><tbody>{"".join(body)}</tbody></table>'
    if report.get("launch"):
        out += f"<p>launch:</p><pre style=\"white-space:pre-wrap\">{html.escape(report['launch'])}</pre>"
        note = next(iter(report["groups"].values())).get("launch_note")
        out += f"<p>{html.escape(note)}</p>" if note else ""
    return out


def peak_figure(report: dict[str, Any], top: int = TOP) -> Any:
    """Peak GiB per GPU of the top candidates: horizontal bars coloured by fit, the GPU's capacity as a line."""
    from matplotlib.figure import Figure  # lazy: plotting only
    from matplotlib.lines import Line2D  # lazy: plotting only
    from matplotlib.patches import Patch  # lazy: plotting only

    rows = [r for r in _rows(report)[:top] if "peak_bytes" in r]
    spec = gpu_spec(report["cluster"]["gpu"])
    cap = spec.memory_bytes / GIB
    fig = Figure(figsize=(8, 1.4 + 0.42 * max(len(rows), 2)), dpi=100)
    ax = fig.add_subplot()
    if not rows:   # every candidate refused before memory was planned: show what blocks them
        why = (report.get("what_would_fit") or [_rows(report)[0]["why"] if _rows(report) else "no candidate"])[0]
        ax.text(0.5, 0.5, f"no setup can run on {report['cluster']['gpus']} × {spec.name}:\n" + _wrap(why),
                ha="center", va="center", fontsize=10, transform=ax.transAxes)
        ax.set_axis_off()
        return fig
    names = [r["candidate"] for r in rows][::-1]          # the recommendation on top
    peaks = [r["peak_bytes"] / GIB for r in rows][::-1]
    colours = [FITS if r["fits"] else DOES_NOT_FIT for r in rows][::-1]
    ax.barh(names, peaks, color=colours)
    ax.axvline(cap, color=CAPACITY, linestyle="--", linewidth=1.5)
    ax.set_xlabel("peak memory per GPU (GiB): training step or checkpoint load")
    fitting = sum(r["fits"] for r in rows)
    ax.set_title(f"{report['model']} on {report['cluster']['gpus']} × {spec.name}: {fitting} of the top {len(rows)} "
                 "fit", fontsize=10)
    handles = [Patch(color=FITS, label="fits"), Patch(color=DOES_NOT_FIT, label="does not fit"),
               Line2D([], [], color=CAPACITY, linestyle="--", label=f"GPU capacity {cap:.1f} GiB")]
    ax.legend(handles=handles, fontsize=8, loc="upper center", bbox_to_anchor=(0.5, -0.16), ncol=3, frameon=False)
    ax.tick_params(axis="y", labelsize=9)
    fig.tight_layout()
    return fig


def _wrap(text: str, width: int = 70) -> str:
    words, lines, line = text.split(), [], ""
    for word in words:
        if line and len(line) + len(word) + 1 > width:
            lines.append(line)
            line = word
        else:
            line = f"{line} {word}".strip()
    return "\n".join([*lines, line])


def figure_png(fig: Any) -> bytes:
    """The figure as PNG bytes (the Agg renderer, never a GUI or pyplot)."""
    buf = io.BytesIO()
    fig.savefig(buf, format="png")
    return buf.getvalue()


def form_view(job: TrainConfig, cluster: Cluster, previous_batch: int | None = None) -> dict[str, Any]:
    """Everything the form shows for one setting: ``report`` (or None), ``verdict`` and ``table`` HTML, ``png``."""
    try:
        report = recommendation_json(job, cluster, set())
    except EcomkitError as exc:
        return {"report": None, "verdict": f"<div>✗ {html.escape(str(exc))}</div>", "table": "", "png": b""}
    return {"report": report, "verdict": verdict_html(report, job, previous_batch), "table": table_html(report),
            "png": figure_png(peak_figure(report))}


def planner_form(job: TrainConfig | None = None, cluster: Cluster | None = None) -> tuple[Any, Callable[..., Any]]:
    """Build the form; returns ``(box, update)``. ``update()`` re-recommends from the current widget values."""
    import ipywidgets as w  # lazy: optional notebook dependency, only the form needs it

    job = job or TrainConfig(model="seqgpt-560m", precision="bf16", seq_len=256)
    cluster = cluster or Cluster(gpus=4, gpu="rtx4090")
    controls = _controls(job, cluster)
    verdict, table = w.HTML(), w.HTML()
    chart = w.Image(format="png", layout=w.Layout(max_width="800px"))
    last: dict[str, int | None] = {"batch": None}

    def update(**_: Any):
        v = {k: c.value for k, c in controls.items()}
        cfg = TrainConfig(model=v["model"], precision=v["precision"], seq_len=v["seq_len"],
                          micro_batch_size=v["micro_batch_size"], grad_accum=v["grad_accum"])
        link = None if v["link"] == DEFAULT_LINK else v["link"]
        view = form_view(cfg, Cluster(gpus=v["gpus"], gpu=v["gpu"], link=link), last["batch"])
        verdict.value, table.value = view["verdict"], view["table"]
        if view["png"]:
            chart.value = view["png"]
        if view["report"] is not None:
            last["batch"] = view["report"]["global_batch"]
        return view["report"]

    for c in controls.values():
        c.observe(lambda change: update(), names="value")
    left = w.VBox(list(controls.values())[:4])
    right = w.VBox(list(controls.values())[4:])
    box = w.VBox([w.HBox([left, right]), verdict, chart, table])
    box.add_class("ecomkit-planner-form")
    return box, update


__all__ = ["planner_form", "describe_recommendation", "form_view", "peak_figure", "table_html", "verdict_html",
           "figure_png"]
