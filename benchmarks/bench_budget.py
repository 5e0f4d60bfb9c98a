"""What share of answers at the generation budget a trained model leaves: the threshold of the budget advice.

For each real-shaped file (the README's review file ``cat,label,review``, whose targets are category and
sentiment; the colour task's extraction and sentiment rows, ``ecomkit.data.toy_tasks``) and each seed, one run of
the README's command with its defaults (the ``tiny`` preset, 2 processes, ``--gen-max-new-tokens auto``: the
budget holds the longest training answer) except the length: ``--steps`` steps, evaluated by generation every
``--eval-steps`` steps on ``--gen-samples`` held-out examples. Each evaluation records the answers that used
every new token allowed without ending (``gen_at_budget`` of ``gen_decoded``) and the margin of its generated
figures over their baselines. ``ecomkit.measure.budget.budget_share_floor`` takes the largest share at the
budget over the evaluations at which a run had learned its task (90 % of its best margin): what trained models
leave, and ``ecomkit.train.gen_eval.BUDGET_ADVICE_SHARE``, above which the run advises.

    python benchmarks/bench_budget.py --seeds 0 1 2 --steps 600 --eval-steps 50   # the artifact
    python benchmarks/bench_budget.py --seeds 0 --steps 200 --eval-steps 50         # a quick look
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from pathlib import Path

from common import print_table, run_summary, write_artifact

from ecomkit.data.toy_tasks import write_colour_task, write_review_file
from ecomkit.measure.budget import LEARNED_SHARE, at_budget_share, budget_share_floor, learned_points, margin_points
from ecomkit.train.gen_eval import BUDGET_ADVICE_SHARE

REVIEW_MAPS = ["--column-map", '{"cat": "category", "label": "sentiment"}',
               "--label-map", '{"sentiment": {"0": "negative", "1": "positive"}}']
KEPT = ("step", "gen_at_budget", "gen_decoded", "gen_acc", "gen_majority_acc", "gen_span_f1", "dict_span_f1")


def curve(out: Path) -> list[dict]:
    """The run's evaluations by generation: step, answers at the budget of those decoded, figures and baselines."""
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines() if line.strip()]
    return [{k: r[k] for k in KEPT if k in r} for r in rows if r.get("gen_decoded")]


def run(name: str, data_args: list[str], seed: int, args, work: Path) -> dict:
    out = work / f"{name}-{seed}"
    t0 = time.perf_counter()
    s = run_summary("02_data_parallel.py", ["--task", "nlu", *data_args, "--seed", str(seed),
                                            "--max-steps", str(args.steps), "--eval-interval", str(args.eval_steps),
                                            "--gen-eval-samples", str(args.gen_samples),
                                            "--final-eval-samples", str(args.gen_samples),
                                            "--no-save-model", "--report-to", "none"], nproc=2, out_dir=str(out))
    points = curve(out)
    learned = learned_points(points)
    unlearned = [p for p in points if p["step"] < min((q["step"] for q in learned), default=args.steps + 1)]
    return {"file": name, "seed": seed, "steps": s["steps"], "lr": s["config"]["lr"],
            "precision": s["config"]["precision"], "budget": s.get("gen_max_new_tokens"),
            "longest_train_answer": s.get("gen_longest_train_answer"),
            "learned_from_step": min((p["step"] for p in learned), default=None),
            "best_margin_points": max((m for p in points if (m := margin_points(p)) is not None), default=None),
            "max_share_learned": max((at_budget_share(p) for p in learned), default=None),
            "min_share_before": min((at_budget_share(p) for p in unlearned), default=None),
            "wall_s": time.perf_counter() - t0, "curve": points}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2], help="training seeds (--seed) per file")
    ap.add_argument("--steps", type=int, default=600, help="steps of each run")
    ap.add_argument("--eval-steps", type=int, default=50, help="steps between evaluations")
    ap.add_argument("--gen-samples", type=int, default=300, help="held-out examples decoded per evaluation")
    ap.add_argument("--reviews", type=int, default=3000, help="rows of the review file")
    args = ap.parse_args()
    work = Path(tempfile.mkdtemp(prefix="bench-budget-"))
    reviews = write_review_file(work / "reviews.csv", args.reviews, seed=7)
    train, dev = write_colour_task(work / "colour")
    files = [("reviews", ["--data", str(reviews), *REVIEW_MAPS]), ("colour", ["--data", str(train), "--eval-data",
                                                                           str(dev)])]
    rows = []
    for seed in args.seeds:
        for name, data_args in files:
            print(f"{name} seed {seed}: {args.steps} steps ...", flush=True)
            rows.append(run(name, data_args, seed, args, work))
    columns = ["file", "seed", "lr", "precision", "budget", "longest_train_answer", "learned_from_step",
               "best_margin_points", "max_share_learned", "min_share_before", "wall_s"]
    print_table(rows, columns)
    floor = budget_share_floor([r["curve"] for r in rows])
    verdict = {"share_floor": floor, "constant": BUDGET_ADVICE_SHARE, "constant_is_the_floor": floor == BUDGET_ADVICE_SHARE,
               "evaluations": sum(len(r["curve"]) for r in rows),
               "learned_evaluations": sum(len(learned_points(r["curve"])) for r in rows),
               "min_share_before_learned": min((r["min_share_before"] for r in rows
                                                if r["min_share_before"] is not None), default=None)}
    print(json.dumps(verdict, indent=1))
    write_artifact("bench_budget", rows, extra={"settings": vars(args), "columns": columns, "verdict": verdict,
                                                "notes": [
        "README review command's defaults (tiny preset, 2 processes × 1 thread, precision auto, --gen-max-new-tokens "
        "auto) except --max-steps, --seed and the evaluation sizes; the colour task with its dev file",
        f"learned: an evaluation whose mean generated margin over its baselines reached {LEARNED_SHARE:.0%} of the "
        "run's best; share_floor: the largest share of answers at the budget over every learned evaluation"]})


if __name__ == "__main__":
    main()
