"""Chapter 06's planner form: its own Figure (no pyplot), a capacity line and colours for what does not fit,
legible labels, an HTML table, the real blocker named, and a notice when the global batch changes.
``tests/test_notebook_browser.py`` drives the same form in JupyterLab in a real browser."""

from __future__ import annotations

import sys

from ecomkit.config import TrainConfig
from ecomkit.hardware import GIB, GPUS
from ecomkit.planner.form import DOES_NOT_FIT, FITS, form_view, peak_figure, planner_form
from ecomkit.planner.job import Cluster
from ecomkit.planner.report import recommendation_json
BIG = TrainConfig(model="ecomgpt-7b", precision="bf16", seq_len=512, micro_batch_size=4)


def test_the_chart_has_a_capacity_line_colours_by_fit_and_horizontal_named_bars():
    # one RTX 4090: among the top 8 candidates some fit and some do not (on 4, with weights loaded in bf16, all fit)
    report = recommendation_json(BIG, Cluster(1, "rtx4090"), set())
    fig = peak_figure(report)
    ax = fig.axes[0]
    rows = [r for r in next(iter(report["groups"].values()))["rows"][:8] if "peak_bytes" in r]
    cap = GPUS["rtx4090"].memory_bytes / GIB
    assert [line.get_xdata()[0] for line in ax.lines] == [cap]                 # the GPU's capacity, vertical
    labels = [t.get_text() for t in ax.get_yticklabels()]
    assert labels == [r["candidate"] for r in rows][::-1]                     # names on the y axis, whole
    bars = ax.patches
    assert [round(b.get_width(), 6) for b in bars] == [round(r["peak_bytes"] / GIB, 6) for r in rows][::-1]
    colours = {b.get_facecolor()[:3] for b in bars}
    assert len(colours) == 2 and {r["fits"] for r in rows} == {True, False}   # fitting and not fitting differ
    assert all((b.get_width() <= cap) == (b.get_facecolor()[:3] == _rgb(FITS)) for b in bars)
    assert _rgb(DOES_NOT_FIT) in colours


def _rgb(hex_colour: str) -> tuple[float, float, float]:
    return tuple(int(hex_colour[i:i + 2], 16) / 255 for i in (1, 3, 5))


def test_the_table_is_html_and_nothing_fitting_names_the_real_blocker():
    view = form_view(BIG, Cluster(4, "rtx4090"))
    assert view["table"].startswith('<table class="ecomkit-plan">') and view["table"].count("<tr") == 9
    assert "<pre" in view["table"] and "torchrun" in view["table"] and "random-init preset" in view["table"]
    v100 = form_view(BIG, Cluster(4, "v100-16g"))
    assert "Nothing fits on 4 × V100-SXM2-16GB" in v100["verdict"] and "no bf16 support" in v100["verdict"]
    assert "bigger GPU" not in v100["verdict"] and v100["png"].startswith(b"\x89PNG")
    text = " ".join(t.get_text() for t in peak_figure(v100["report"]).axes[0].texts)
    assert "no bf16 support" in text                                          # the chart says it too, not "(0.0 GiB)"


def test_the_form_never_touches_pyplot_and_says_when_the_global_batch_changes(monkeypatch):
    monkeypatch.setitem(sys.modules, "matplotlib.pyplot", None)   # any `import matplotlib.pyplot` now fails
    box, update = planner_form()
    first = update()
    controls = {c.description: c for column in box.children[0].children for c in column.children}
    verdict, chart = box.children[1], box.children[2]
    png0, text0 = chart.value, verdict.value
    controls["GPUs"].value = 8                      # the global batch doubles: the form must say so
    png1, text1 = chart.value, verdict.value
    controls["GPU"].value = "a100-40g"
    assert first["best"] and bytes(png0) != bytes(png1) != bytes(chart.value) and bytes(png0)[:4] == b"\x89PNG"
    assert "changed" not in text0 and "The global batch changed: 32 → 64" in text1
    assert "over nvlink-a100, the GPU&#x27;s own link" in verdict.value     # the default link follows the GPU
