"""What share of answers at the generation budget is worth advice: the threshold of the budget advice.

For each real-shaped file (the README's review file ``cat,label,review``, whose targets are category and
sentiment; the colour task's extraction and sentiment rows, ``ecomkit.data.toy_tasks``) and each seed, one run of
the README's command with its defaults (the ``tiny`` preset, 2 processes, ``--gen-max-new-tokens auto``: the
budget holds the longest training answer) except the length, ``--steps`` steps evaluated by generation every
``--eval-steps`` steps: its curve of answers at the budget shows when a model learns to end them. Then the
saved model answers a held-out file with ``ecomkit.predict`` at budgets that cut its answers and at twice the
run's: ``ecomlab.derive.budget.recovery_rate`` is the points its figures regained per point of answers freed,
and ``advice_share`` the share of answers at the budget that can move a figure by a point at the largest rate
measured: ``ecomkit.train.gen_eval.BUDGET_ADVICE_SHARE``, above which a run advises.

    python benchmarks/bench_budget.py --seeds 0 1 2 --steps 600 --eval-steps 50   # the artifact
    python benchmarks/bench_budget.py --seeds 0 --steps 200 --budgets 1 2        # a quick look
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from pathlib import Path

from common import print_table, run_summary, write_artifact

from ecomkit.data.task_file import read_task_file
from ecomkit.data.toy_tasks import write_colour_task, write_review_file
from ecomkit.train.gen_eval import BUDGET_ADVICE_SHARE
from ecomkit.train.predict import main as predict
from ecomlab.derive.budget import MEANINGFUL_POINTS, advice_share, at_budget_share, recovery_rate

REVIEW_MAPS = ["--column-map", '{"cat": "category", "label": "sentiment"}',
               "--label-map", '{"sentiment": {"0": "negative", "1": "positive"}}']
KEPT = ("step", "gen_at_budget", "gen_decoded", "gen_acc", "gen_majority_acc", "gen_span_f1", "dict_span_f1")


def curve(out: Path) -> list[dict]:
    """The run's evaluations by generation: step, answers at the budget of those decoded, figures and baselines."""
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines() if line.strip()]
    return [{k: r[k] for k in KEPT if k in r} for r in rows if r.get("gen_decoded")]


def answer_at(model: Path, data: Path, budget: int, out: Path) -> dict:
    """The saved model's answers to ``data`` at ``budget`` new tokens: answers at the budget, and the mean of its
    generated figures in points (``ecomkit.predict``'s scores against the run's baselines)."""
    answers = out / f"answers-{budget}.jsonl"
    predict(["--model", str(model), "--input", str(data), "--output", str(answers), "--gen-max-new-tokens",
             str(budget), "--batch-size", "32"])
    rows = [json.loads(line) for line in answers.read_text(encoding="utf-8").splitlines()]
    scores = json.loads(answers.with_suffix(".scores.json").read_text(encoding="utf-8"))
    figures = {t: s.get("gen_acc", s.get("gen_span_f1")) for t, s in scores.items()}
    return {"budget": budget, "at_budget": sum(bool(r.get("at_budget")) for r in rows),
            "decoded": sum("generated" in r for r in rows), "score": 100.0 * sum(figures.values()) / len(figures),
            "figures": figures}


def run(name: str, data_args: list[str], heldout: Path, seed: int, args, work: Path) -> dict:
    out = work / f"{name}-{seed}"
    t0 = time.perf_counter()
    s = run_summary("02_data_parallel.py", ["--task", "nlu", *data_args, "--seed", str(seed),
                                            "--max-steps", str(args.steps), "--eval-interval", str(args.eval_steps),
                                            "--gen-eval-samples", str(args.gen_samples),
                                            "--final-eval-samples", str(args.gen_samples), "--report-to", "none"],
                    nproc=2, out_dir=str(out))
    auto = read_task_file(out / "final")["gen_max_new_tokens"]
    sweep = [answer_at(out / "final", heldout, b, out) for b in sorted({*args.budgets, auto, 2 * auto})]
    points = curve(out)
    return {"file": name, "seed": seed, "lr": s["config"]["lr"], "precision": s["config"]["precision"],
            "budget": auto, "longest_train_answer": s.get("gen_longest_train_answer"),
            "evaluations_all_at_budget": sum(at_budget_share(p) == 1.0 for p in _points(points)),
            "evaluations_none_at_budget": sum(at_budget_share(p) == 0.0 for p in _points(points)),
            "evaluations_between": sum(0.0 < at_budget_share(p) < 1.0 for p in _points(points)),
            "last_step_all_at_budget": max((p["step"] for p in points if p["gen_at_budget"] == p["gen_decoded"]),
                                           default=None),
            "score_at_2x_budget": sweep[-1]["score"], "recovery_rate": recovery_rate(sweep),
            "wall_s": time.perf_counter() - t0, "curve": points, "sweep": sweep}


def _points(points: list[dict]) -> list[dict]:
    return [{"at_budget": p["gen_at_budget"], "decoded": p["gen_decoded"]} for p in points]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2], help="training seeds (--seed) per file")
    ap.add_argument("--steps", type=int, default=600, help="steps of each run")
    ap.add_argument("--eval-steps", type=int, default=50, help="steps between evaluations")
    ap.add_argument("--gen-samples", type=int, default=300, help="held-out examples decoded per evaluation")
    ap.add_argument("--reviews", type=int, default=3000, help="rows of the review file")
    ap.add_argument("--budgets", type=int, nargs="+", default=[1, 2, 3, 4, 6],
                    help="budgets the saved models answer the held-out file at (with the run's and twice it)")
    args = ap.parse_args()
    work = Path(tempfile.mkdtemp(prefix="bench-budget-"))
    reviews = write_review_file(work / "reviews.csv", args.reviews, seed=7)
    new_reviews = write_review_file(work / "new_reviews.csv", 1000, seed=8)   # rows the runs never saw
    train, dev = write_colour_task(work / "colour")
    files = [("reviews", ["--data", str(reviews), *REVIEW_MAPS], new_reviews),
             ("colour", ["--data", str(train), "--eval-data", str(dev)], dev)]
    rows = []
    for seed in args.seeds:
        for name, data_args, heldout in files:
            print(f"{name} seed {seed}: {args.steps} steps, then budgets {args.budgets} ...", flush=True)
            rows.append(run(name, data_args, heldout, seed, args, work))
    columns = ["file", "seed", "lr", "precision", "budget", "longest_train_answer", "evaluations_all_at_budget",
               "evaluations_between", "evaluations_none_at_budget", "last_step_all_at_budget", "score_at_2x_budget",
               "recovery_rate"]
    headers = ["file", "seed", "lr", "precision", "budget (auto)", "longest training answer",
               "evaluations: all at budget", "some", "none", "last step all at budget", "score at 2× budget (points)",
               "points regained per point freed"]
    print_table(rows, columns)
    share = advice_share([r["sweep"] for r in rows])
    verdict = {"advice_share": share, "constant": BUDGET_ADVICE_SHARE, "constant_is_measured": share == BUDGET_ADVICE_SHARE,
               "largest_recovery_rate": max(r["recovery_rate"] for r in rows if r["recovery_rate"] is not None),
               "evaluations": sum(len(r["curve"]) for r in rows)}
    print(json.dumps(verdict, indent=1))
    write_artifact("bench_budget", rows, extra={"settings": vars(args), "columns": columns, "headers": headers,
                                                "verdict": verdict, "notes": [
        "README review command's defaults (tiny preset, 2 processes × 1 thread, precision auto, --gen-max-new-tokens "
        "auto) except --max-steps, --seed and the evaluation sizes; the colour task with its dev file; evaluations "
        "by generation every --eval-steps steps: how many had every answer at the budget, some, none",
        "then each saved model answered a held-out file (1,000 new review rows; the colour dev file) with "
        "ecomkit.predict at --budgets, its own budget and twice it: points regained per point of answers freed, "
        "from each cut budget to twice its own, pooled (ecomlab.derive.budget.recovery_rate)",
        f"advice share: {MEANINGFUL_POINTS:g} point / the largest rate = {share:.2%} of the answers "
        "(ecomlab.derive.budget.advice_share): BUDGET_ADVICE_SHARE, above which a run advises"]})


if __name__ == "__main__":
    main()
