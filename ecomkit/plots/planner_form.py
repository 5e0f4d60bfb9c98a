"""An ipywidgets form for the recommender (chapter 06 notebook): pick a job and a cluster, get the ranked setups.

Why a form: "what if" questions (one more GPU? a 40 GB card instead of 24?
512 tokens instead of 1024?) are answered faster than by re-running a cell.
Each change re-runs ``python -m ecomkit.plan --recommend`` in-process
(:func:`ecomkit.planner.report.recommendation_json`: every strategy ecomkit
trains, the largest micro-batch that fits with the global batch kept, ranked
by predicted time per global batch), prints its table and launch line, and
draws the peak memory per GPU of the top candidates against the GPU.

The form never blocks: it is displayed and returns. :func:`planner_form`
returns the box and the ``update`` function, so a notebook can also call
``update()`` once to draw the default recommendation (which is what a headless
run such as nbmake records).
"""

from __future__ import annotations

from typing import Any, Callable

from ecomkit.config import PRECISIONS, TrainConfig
from ecomkit.errors import EcomkitError
from ecomkit.hardware import GIB, GPUS, LINKS
from ecomkit.planner.job import Cluster
from ecomkit.planner.report import recommendation_json, render_recommendation
from ecomkit.plots.common import plot_throughput_bars

MODELS = ("seqgpt-560m", "ecomgpt-7b")


def _controls(job: TrainConfig, cluster: Cluster) -> dict[str, Any]:
    import ipywidgets as w  # lazy: optional notebook dependency, only the form needs it

    return {
        "model": w.Dropdown(options=MODELS, value=job.model if job.model in MODELS else MODELS[0],
                            description="model"),
        "gpu": w.Dropdown(options=list(GPUS), value=cluster.gpu, description="GPU"),
        "gpus": w.IntSlider(value=cluster.gpus, min=1, max=64, description="GPUs"),
        "link": w.Dropdown(options=list(LINKS), value=cluster.link, description="link"),
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


def peak_chart(report: dict[str, Any], top: int = 6) -> Any:
    """Bar chart: peak GiB per GPU of the top candidates (the first is the recommendation)."""
    rows = next(iter(report["groups"].values()))["rows"][:top]
    bars = {r["candidate"]: r["peak_bytes"] / GIB for r in rows if "peak_bytes" in r}
    gpu_gib = rows[0]["gpu_bytes"] / GIB if rows and "gpu_bytes" in rows[0] else 0
    return plot_throughput_bars(bars, ylabel="peak GiB per GPU",
                                title=f"top candidates vs {report['cluster']['gpu']} ({gpu_gib:.1f} GiB)")


def planner_form(job: TrainConfig | None = None, cluster: Cluster | None = None) -> tuple[Any, Callable[..., Any]]:
    """Build the form; returns ``(box, update)``. ``update()`` re-recommends from the current widget values."""
    import ipywidgets as w  # lazy: optional notebook dependency, only the form needs it
    from IPython.display import display  # lazy: IPython comes with ipywidgets, not with the library

    job = job or TrainConfig(model="seqgpt-560m", precision="bf16", seq_len=256)
    cluster = cluster or Cluster(gpus=4, gpu="rtx4090", link="pcie4-x16")
    controls = _controls(job, cluster)
    chart, verdict = w.Output(), w.Output()

    def update(**_: Any):
        v = {k: c.value for k, c in controls.items()}
        cfg = TrainConfig(model=v["model"], precision=v["precision"], seq_len=v["seq_len"],
                          micro_batch_size=v["micro_batch_size"], grad_accum=v["grad_accum"])
        report, text = describe_recommendation(cfg, Cluster(gpus=v["gpus"], gpu=v["gpu"], link=v["link"]))
        verdict.clear_output(wait=True)
        chart.clear_output(wait=True)
        with verdict:
            print(text)
        if report is not None:
            import matplotlib.pyplot as plt  # lazy: heavy optional plotting dependency

            with chart:
                fig = peak_chart(report)
                display(fig)
                plt.close(fig)
        return report

    for c in controls.values():
        c.observe(lambda change: update(), names="value")
    left = w.VBox(list(controls.values())[:4])
    right = w.VBox(list(controls.values())[4:])
    box = w.VBox([w.HBox([left, right]), verdict, chart])
    return box, update


__all__ = ["planner_form", "describe_recommendation", "peak_chart"]
