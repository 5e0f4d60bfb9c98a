"""The dependency floors are measured, and installing ecomkit keeps the torch it finds.

``pyproject.toml`` gives torch and transformers floors, not pins (a pin would make ``pip install -e .``
replace a GPU machine's CUDA torch); the reproducible CPU pin lives in the Makefile's ``TORCH_SPEC``.
The floors must be those of the newest ``benchmarks/results/compat-*.json`` written by
``benchmarks/check_compat.py``: every environment there at or above both floors passed the whole smoke set
and would keep its torch under ``pip install -e .``, an environment at each floor was checked, and the
derivation in the artifact agrees with its rows.
"""

from __future__ import annotations

import json
import re
import tomllib

from conftest import REPO, load_module

RESULTS = REPO / "benchmarks" / "results"


def _dependencies() -> dict[str, str]:
    deps = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["dependencies"]
    return {re.match(r"[A-Za-z0-9_.-]+", d).group(0).lower(): d for d in deps}


def _newest_artifact() -> dict:
    paths = sorted(RESULTS.glob("compat-*.json"))
    assert paths, "no compat artifact: run benchmarks/check_compat.py"
    return json.loads(max(paths, key=lambda p: json.loads(p.read_text())["time_utc"]).read_text())


def test_torch_and_transformers_have_floors_not_pins_and_the_makefile_keeps_the_cpu_pin():
    deps = _dependencies()
    assert re.fullmatch(r"torch>=[\d.]+", deps["torch"]), deps["torch"]
    assert re.fullmatch(r"transformers>=[\d.]+,<6", deps["transformers"]), deps["transformers"]
    assert re.search(r"^TORCH_SPEC \?= torch==[\d.]+$", (REPO / "Makefile").read_text(), re.M)


def test_the_floors_are_the_measured_ones():
    compat = load_module(REPO / "benchmarks" / "check_compat.py")
    art = _newest_artifact()
    floors = {pkg: _dependencies()[pkg].split(">=")[1].split(",")[0] for pkg in ("torch", "transformers")}
    assert compat.floors(art["rows"]) == art["extra"]["floors"]                 # derived from its own rows
    release = lambda v: (compat.release(v) + (0, 0, 0))[:3]  # noqa: E731  ("2.10" == "2.10.0")
    assert {k: release(v) for k, v in art["extra"]["floors"].items()} == {k: release(v) for k, v in floors.items()}
    at_or_above = [r for r in art["rows"] if all(release(r["versions"][p]) >= release(floors[p]) for p in floors)]
    for pkg in floors:                        # each floor itself was run, not just something above it
        assert any(release(r["versions"][pkg]) == release(floors[pkg]) for r in at_or_above), pkg
    for r in at_or_above:
        assert r["all_passed"] and [c["check"] for c in r["checks"]] == art["extra"]["checks"], r["versions"]
        assert r["pip_install_e"]["keeps_torch"], r["versions"]               # pip install -e . keeps torch


def test_speed_notes_are_recorded_apart_and_the_compile_note_matches_the_library():
    """A slower torch is a speed note, not a failed check; the runtime warning's version is the measured one.

    ``fast/compile.py`` warns where torch compiles the packed head + loss as two graphs
    (:data:`HEAD_LOSS_ONE_GRAPH_TORCH`); every environment of the artifact that counted the graphs must agree
    with it, with environments measured on both sides of that version, and no recompilation after step 1.
    """
    from ecomkit.fast.compile import HEAD_LOSS_ONE_GRAPH_TORCH, head_loss_graphs, torch_release

    art = _newest_artifact()
    assert art["extra"]["speed_notes"] == ["packed_step_graphs"]
    sides = set()
    for r in art["rows"]:
        assert [c["check"] for c in r["checks"]] == art["extra"]["checks"], r["versions"]
        assert r["all_passed"] == all(c["passed"] for c in r["checks"]), r["versions"]   # notes are not checks
        counts = {n["note"]: n["value"] for n in r["speed_notes"]}["packed_step_graphs"]
        if counts is None:                 # ecomkit did not import there: its checks failed and say why
            assert not r["all_passed"], r["versions"]
            continue
        torch_version = r["versions"]["torch"]
        assert counts == [[1, head_loss_graphs(torch_version)]] * len(counts), (torch_version, counts)
        sides.add(torch_release(torch_version) >= HEAD_LOSS_ONE_GRAPH_TORCH)
    assert sides == {True, False}, "the graph count was not measured on both sides of the version it names"


def test_the_install_paragraphs_name_the_floors_and_the_newest_artifact():
    deps = _dependencies()
    floors = {pkg: deps[pkg].split(">=")[1].split(",")[0] for pkg in ("torch", "transformers")}
    readme, gpu = (REPO / "README.md").read_text(), (REPO / "docs" / "gpu.md").read_text()
    assert f"torch >= {floors['torch']} and transformers >= {floors['transformers']} are floors" in readme
    assert f"`torch>={floors['torch']}`" in gpu and f"`transformers>={floors['transformers']},<6`" in gpu
    newest = max(RESULTS.glob("compat-*.json"), key=lambda p: json.loads(p.read_text())["time_utc"])
    assert f"benchmarks/results/{newest.name}" in gpu
    art = _newest_artifact()
    table = {tuple(cells[:2]): cells[2] for cells in (
        [c.strip() for c in line.strip("|").split("|")] for line in gpu.splitlines() if line.startswith("| 2."))}
    assert len(table) == len(art["rows"])
    for r in art["rows"]:               # every environment of the artifact is a row of docs/gpu.md's table
        torch_v = r["versions"]["torch"].split("+")[0] + (" (CPU)" if "+cpu" in r["versions"]["torch"] else "")
        smoke = table[(torch_v, r["versions"]["transformers"])]
        assert smoke.startswith("passed" if r["all_passed"] else "failed"), (torch_v, smoke)
