"""An ipywidgets form for the planner with a live bar chart (chapter 06 notebook).

Why a form: the planner answers "what if" questions (one more GPU? ZeRO-3
instead of ZeRO-2? checkpointing on?) faster than re-running a cell. Each
change re-plans and redraws the stacked bar of per-GPU bytes against the
chosen GPU's capacity, and prints the verdict and the predicted step time.

The form never blocks: it is displayed and returns. :func:`planner_form`
returns the box and the ``update`` function, so a notebook can also call
``update()`` once to draw the default plan (which is what a headless run such
as nbmake records).
"""

from __future__ import annotations

from typing import Any, Callable

from ecomkit.config import PLAN_STRATEGIES, PRECISIONS
from ecomkit.errors import EcomkitError
from ecomkit.hardware import GIB, GPUS, LINKS
from ecomkit.planner.memory import ATTNS, MemoryPlan, PlanInput, max_micro_batch, plan_memory
from ecomkit.planner.step_time import predict_step_time
from ecomkit.plots.memory import plot_memory_breakdown


def _controls(defaults: PlanInput) -> dict[str, Any]:
    import ipywidgets as w  # lazy: optional notebook dependency, only the form needs it

    models = ["seqgpt-560m", "ecomgpt-7b"]
    model = defaults.model if defaults.model in models else models[0]
    return {
        "model": w.Dropdown(options=models, value=model, description="model"),
        "gpu": w.Dropdown(options=list(GPUS), value=defaults.gpu, description="GPU"),
        "world_size": w.IntSlider(value=defaults.world_size, min=1, max=64, description="GPUs"),
        "strategy": w.Dropdown(options=PLAN_STRATEGIES, value=defaults.strategy, description="strategy"),
        "precision": w.Dropdown(options=PRECISIONS, value=defaults.precision, description="precision"),
        "micro_batch": w.IntSlider(value=defaults.micro_batch, min=1, max=64, description="micro-batch"),
        "seq_len": w.Dropdown(options=[128, 256, 512, 1024, 2048, 4096], value=defaults.seq_len, description="seq len"),
        "activation_checkpointing": w.Checkbox(value=defaults.activation_checkpointing, description="checkpointing"),
        "attn": w.Dropdown(options=ATTNS, value=defaults.attn, description="attention"),
        "offload_optimizer": w.Checkbox(value=defaults.offload_optimizer, description="offload optimizer"),
        "offload_param": w.Checkbox(value=defaults.offload_param, description="offload params"),
        "link": w.Dropdown(options=list(LINKS), value="nvlink-a100", description="link"),
    }


def describe_plan(inp: PlanInput, link: str) -> tuple[MemoryPlan | None, str]:
    """(plan or None, text) for one setting; user errors become the text instead of a traceback."""
    try:
        plan = plan_memory(inp)
    except EcomkitError as exc:
        return None, f"✗ {exc}"
    step = predict_step_time(plan.inputs, link=link)
    text = (f"{plan.verdict()}\nlargest micro-batch that fits: {max_micro_batch(plan.inputs)} · predicted step "
            f"{step.total_s:.2f} s ({step.tokens_per_s_per_gpu:,.0f} tokens/s per GPU; compute {step.compute_s:.2f} s, "
            f"exposed comm {step.comm_exposed_s:.2f} s, optimizer+offload {step.optimizer_s + step.offload_s:.2f} s)"
            + (f"\nhost memory for offload: {plan.cpu_bytes / GIB:.1f} GiB per GPU" if plan.cpu_bytes else ""))
    return plan, text


def planner_form(defaults: PlanInput | None = None) -> tuple[Any, Callable[..., Any]]:
    """Build the form; returns ``(box, update)``. ``update()`` re-plans from the current widget values."""
    import ipywidgets as w  # lazy: optional notebook dependency, only the form needs it
    from IPython.display import display  # lazy: IPython comes with ipywidgets, not with the library

    defaults = defaults or PlanInput(model="seqgpt-560m", gpu="rtx4090", world_size=4, seq_len=256, micro_batch=8)
    controls = _controls(defaults)
    chart, verdict = w.Output(), w.Output()

    def update(**_: Any):
        values = {k: c.value for k, c in controls.items()}
        link = values.pop("link")
        plan, text = describe_plan(PlanInput(**values), link)
        verdict.clear_output(wait=True)
        chart.clear_output(wait=True)
        with verdict:
            print(text)
        if plan is not None:
            import matplotlib.pyplot as plt  # lazy: heavy optional plotting dependency

            with chart:
                fig = plot_memory_breakdown({f"{values['strategy']} × {values['world_size']}": plan},
                                            plan.gpu.memory_bytes, title=plan.gpu.name)
                display(fig)
                plt.close(fig)
        return plan

    for c in controls.values():
        c.observe(lambda change: update(), names="value")
    left = w.VBox(list(controls.values())[:6])
    right = w.VBox(list(controls.values())[6:])
    box = w.VBox([w.HBox([left, right]), verdict, chart])
    return box, update


__all__ = ["planner_form", "describe_plan"]
