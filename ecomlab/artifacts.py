"""Where the benchmark artifacts are, and which file is the newest of each benchmark.

Why a setting: an installed package has no repository around it, so the folder is ``--results DIR``, else
``$ECOMKIT_RESULTS``, else the repository's ``benchmarks/results``; a folder that is not there is an error that
names it and says how to point elsewhere.
"""

from __future__ import annotations

import json
import os
import re
from pathlib import Path

from ecomkit.errors import ConfigError

REPO = Path(__file__).resolve().parents[1]          # the source checkout around this package, when there is one
REPO_RESULTS = REPO / "benchmarks" / "results"
RESULTS_ENV = "ECOMKIT_RESULTS"
ARTIFACT = re.compile(  # <bench>-<yyyy-mm-dd>-<machine>.json, written by benchmarks/common.write_artifact
    r"^(?P<bench>[a-z0-9_]+)-(?P<date>\d{4}-\d{2}-\d{2})-(?P<machine>[a-z0-9-]+)\.json$")


def results_dir(given: str | Path | None = None) -> Path:
    """The artifacts' folder: ``given`` (``--results``), else ``$ECOMKIT_RESULTS``, else the repository's."""
    if given is not None:
        path, source = Path(given), "--results"
    elif os.environ.get(RESULTS_ENV):
        path, source = Path(os.environ[RESULTS_ENV]), f"${RESULTS_ENV}"
    else:
        path, source = REPO_RESULTS, "the default: benchmarks/results of the ecomkit checkout this package sits in"
    if not path.is_dir():
        raise ConfigError(
            f"no benchmark artifacts at {path} ({source}): that folder does not exist. The ledger and the derived "
            f"constants read <bench>-<yyyy-mm-dd>-<machine>.json files (benchmarks/results/ of an ecomkit "
            f"checkout); point to such a folder with --results DIR or {RESULTS_ENV}=DIR.")
    return path


def newest_artifacts(folder: str | Path) -> dict[str, Path]:
    """bench name → path of its newest artifact (by the date in the name, then by the time written inside it).

    One rule for the docs' tables (``benchmarks/report.py``), the ledger and the derived constants' tests.
    Why the time inside and not the file's modification time: a fresh clone sets every mtime to the checkout.
    """
    found: dict[str, tuple[tuple[str, str, int], Path]] = {}
    for path in sorted(Path(folder).glob("*.json")):
        m = ARTIFACT.match(path.name)
        if not m:
            continue
        rerun = re.search(r"-(\d+)\.json$", path.name)      # "-2": the second run of that day
        key = (m["date"], _written_at(path), int(rerun[1]) if rerun else 1)
        if m["bench"] not in found or key > found[m["bench"]][0]:
            found[m["bench"]] = (key, path)
    return {bench: path for bench, (_, path) in found.items()}


def _written_at(path: Path) -> str:
    """The artifact's own ``time_utc`` (ISO, sorts as text); empty for a file without one."""
    try:
        return str(json.loads(path.read_text()).get("time_utc") or "")
    except (OSError, ValueError, AttributeError):
        return ""


__all__ = ["ARTIFACT", "REPO", "REPO_RESULTS", "RESULTS_ENV", "newest_artifacts", "results_dir"]
