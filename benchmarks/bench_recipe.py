"""How long ``--task nlu`` on a user's file must train: the length rule of ``ecomkit/config/recipe.py``.

For each real-shaped file (review files ``cat,label,review`` of a few sizes, from
``ecomkit.data.toy_tasks.review_file_rows``; catalog titles with their category, the demo's shape), one run
of the README's review command with its defaults (the ``tiny`` preset, 2 processes) except the length:
``--steps`` steps, with a held-out evaluation every ``--eval-steps`` steps. Each
evaluation scores every target by its candidates (accuracy beside the training-majority baseline). Per
file the row says after how many steps (and epochs) every target first reached 90 % of its best margin over
the baseline (``steps_to_learn``); the rule's floor ``NLU_FILE_MIN_STEPS`` must cover the largest. The rows
also give the run's measured step time, which ``--max-train-minutes`` holds a run's length against.

    python benchmarks/bench_recipe.py --sizes 2000 1000 --titles 1000 --steps 600 --eval-steps 50   # the artifact
    python benchmarks/bench_recipe.py --sizes 1000 --titles 0 --steps 300   # a quick look
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from pathlib import Path

from common import print_table, run_summary, write_artifact

from ecomkit.config.recipe import NLU_FILE_EPOCHS, NLU_FILE_MIN_STEPS
from ecomkit.data.toy_tasks import write_category_task, write_review_file

REVIEW_MAPS = ["--column-map", '{"cat": "category", "label": "sentiment"}',
               "--label-map", '{"sentiment": {"0": "negative", "1": "positive"}}']
TARGETS = ("category", "sentiment")
LEARNED_SHARE = 0.9     # "learned": every target at >= this share of its best margin over the baseline


def curve(out: Path, steps_per_epoch: int) -> list[dict]:
    """The run's evaluations: epochs, and each target's accuracy and baseline."""
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines() if line.strip()]
    points = []
    for r in rows:
        if "acc_category" not in r and "acc_sentiment" not in r:
            continue
        point = {"step": r["step"], "epochs": round(r["step"] / steps_per_epoch, 2)}
        for t in TARGETS:
            if f"acc_{t}" in r:
                point[t] = r[f"acc_{t}"]
                point[f"majority_{t}"] = r[f"majority_{t}"]
        points.append(point)
    return points


def epochs_to_learn(points: list[dict]) -> float | None:
    """The first evaluated epoch where every target reached LEARNED_SHARE of its best margin (None: never > 0)."""
    targets = [t for t in TARGETS if any(t in p for p in points)]
    best = {t: max(p[t] - p[f"majority_{t}"] for p in points if t in p) for t in targets}
    if any(b <= 0 for b in best.values()):
        return None
    for p in points:
        if all(t in p and p[t] - p[f"majority_{t}"] >= LEARNED_SHARE * best[t] for t in targets):
            return p["epochs"]
    return None


def run_file(name: str, data: Path, maps: list[str], args, work: Path) -> dict:
    """One run of the defaults on ``data`` for ``--max-epochs``, evaluated every ``--eval-steps`` steps."""
    out = work / name
    t0 = time.perf_counter()
    s = run_summary("02_data_parallel.py", ["--task", "nlu", "--data", str(data), *maps,
                                            "--max-steps", str(args.steps), "--eval-interval", str(args.eval_steps),
                                            *(["--lr", str(args.lr)] if args.lr else []),
                                            "--eval-nlu-samples", "1000", "--gen-eval-samples", "0",
                                            "--no-save-model", "--report-to", "none"], nproc=2, out_dir=str(out))
    spe = s["steps_per_epoch"]
    points = curve(out, spe)
    return {"file": name, "train_examples": s["data"].get("train_records"), "steps_per_epoch": spe,
            "steps": s["steps"], "epochs_to_learn": epochs_to_learn(points),
            "steps_to_learn": round(epochs_to_learn(points) * spe) if epochs_to_learn(points) else None,
            "lr": s["config"]["lr"], "global_batch": s["global_batch"],
            **{f"final_{t}": s.get(f"acc_{t}") for t in TARGETS}, **{f"majority_{t}": s.get(f"majority_{t}")
                                                                      for t in TARGETS},
            "step_s": s["step_time_s"],
            "precision": s["config"]["precision"], "wall_s": time.perf_counter() - t0, "curve": points}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--sizes", type=int, nargs="+", default=[2000, 1000], help="rows of each review file")
    ap.add_argument("--titles", type=int, default=1000, help="rows of the catalog-titles file (0: none)")
    ap.add_argument("--steps", type=int, default=600, help="steps of each run (the curve's end)")
    ap.add_argument("--lr", type=float, default=None, help="a --lr to compare with the recipe's (default: none)")
    ap.add_argument("--eval-steps", type=int, default=50, help="steps between evaluations")
    args = ap.parse_args()
    work = Path(tempfile.mkdtemp(prefix="bench-recipe-"))
    files = [(f"reviews-{n}", write_review_file(work / f"reviews-{n}.csv", n, seed=n), REVIEW_MAPS) for n in args.sizes]
    if args.titles:
        files.append((f"titles-{args.titles}", write_category_task(work / "titles.jsonl", args.titles), []))
    rows = []
    for name, data, maps in files:
        print(f"{name}: {args.steps} steps ...", flush=True)
        rows.append(run_file(name, data, maps, args, work))
    learned = [r["steps_to_learn"] for r in rows]
    needed = max(learned) if learned and None not in learned else None
    columns = ["file", "lr", "global_batch", "train_examples", "steps_per_epoch", "steps_to_learn", "epochs_to_learn",
               "final_category", "majority_category",
               "final_sentiment", "majority_sentiment", "step_s", "wall_s"]
    print_table(rows, columns)
    verdict = {"steps_needed": needed, "rule_min_steps": NLU_FILE_MIN_STEPS, "rule_epochs": NLU_FILE_EPOCHS,
               "rule_covers_every_file": needed is not None and NLU_FILE_MIN_STEPS >= needed}
    print(json.dumps(verdict, indent=1))
    write_artifact("recipe", rows, extra={"settings": vars(args), "columns": columns, "verdict": verdict, "notes": [
        "README review command's defaults (tiny preset, 2 processes × 1 thread, precision auto) except --max-steps; "
        f"evaluation by candidate scoring on every held-out record every {args.eval_steps} steps",
        f"epochs_to_learn: the first evaluation where every target reached {LEARNED_SHARE:.0%} of its best margin "
        "over the training-majority baseline"]})


if __name__ == "__main__":
    main()
