"""Is a training run bit-reproducible? The same command twice, and one process against two, at bf16 and fp32.

For each setup (the ``tiny`` preset on the synthetic catalog as the tests train it; the ``small`` preset on a
review file with ``--task nlu``, whose bucketed and packed batches meet many shapes), DDP on 2 processes runs
the same command twice (``--seed`` fixed, ``--precision`` pinned) and the rows compare every step's loss and
gradient norm bit for bit (``metrics.jsonl`` writes floats that read back exactly) and the SHA-256 of the saved
weights. The same setup on 1 process (the same global batch) gives the 1-vs-2 difference, the largest relative
difference of a step's loss. ``--precision auto`` is not in the table: it is resolved by timing GEMMs, so two
runs under different load may not even train at the same precision.

    python benchmarks/bench_repro.py --steps 30   # the artifact
"""

from __future__ import annotations

import argparse
import hashlib
import json
import tempfile
import time
from pathlib import Path

from common import print_table, run_summary, write_artifact

from ecomkit.data.toy_tasks import write_review_file

REVIEW_MAPS = ["--column-map", '{"cat": "category", "label": "sentiment"}',
               "--label-map", '{"sentiment": {"0": "negative", "1": "positive"}}']


def setups(work: Path) -> dict[str, list[str]]:
    reviews = write_review_file(work / "reviews.csv", 2000, seed=7)
    return {"tiny lm (the tests' runs)": ["--model", "tiny", "--n-rows", "600", "--seq-len", "64",
                                          "--micro-batch-size", "4", "--global-batch-size", "8"],
            "small nlu (a review file)": ["--model", "small", "--task", "nlu", "--data", str(reviews), *REVIEW_MAPS,
                                          "--micro-batch-size", "8", "--global-batch-size", "16"]}


def steps(out: Path) -> list[tuple[float, float]]:
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines() if line.strip()]
    return [(r["loss"], r["grad_norm"]) for r in rows if r.get("type") == "train"]


def weights_sha(out: Path) -> str:
    digest = hashlib.sha256()
    for path in sorted((out / "final").glob("*.safetensors")):
        digest.update(path.read_bytes())
    return digest.hexdigest()


def launch(args: list[str], nproc: int, out: Path, precision: str, n_steps: int) -> dict:
    t0 = time.perf_counter()
    s = run_summary("02_data_parallel.py", [*args, "--precision", precision, "--max-steps", str(n_steps),
                                            "--eval-interval", "0", "--eval-batches", "1", "--final-eval-samples", "8",
                                            "--seed", "0", "--report-to", "none"], nproc=nproc, out_dir=str(out))
    return {"precision": s["config"]["precision"], "global_batch": s["global_batch"], "steps": steps(out),
            "sha": weights_sha(out), "wall_s": time.perf_counter() - t0}


def compare(a: list[tuple[float, float]], b: list[tuple[float, float]]) -> dict:
    """Steps whose loss and gradient norm are bit-identical, and the largest relative differences."""
    same = sum(x == y for x, y in zip(a, b))
    rel = [abs(x[0] - y[0]) / abs(x[0]) for x, y in zip(a, b)]
    rel_norm = [abs(x[1] - y[1]) / abs(x[1]) for x, y in zip(a, b) if x[1]]
    first = next((i + 1 for i, (x, y) in enumerate(zip(a, b)) if x != y), None)
    return {"steps": len(a), "bit_identical_steps": same, "first_differing_step": first,
            "max_rel_loss_diff": max(rel, default=0.0), "max_rel_grad_norm_diff": max(rel_norm, default=0.0)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--steps", type=int, default=30, help="optimizer steps per run")
    ap.add_argument("--precisions", nargs="+", default=["bf16", "fp32"], help="pinned precisions to compare")
    args = ap.parse_args()
    work = Path(tempfile.mkdtemp(prefix="bench-repro-"))
    rows = []
    for name, setup in setups(work).items():
        for precision in args.precisions:
            print(f"{name} at {precision}: run A, run B (2 processes), run C (1 process) ...", flush=True)
            tag = name.split()[0] + "-" + precision
            a = launch(setup, 2, work / f"{tag}-a", precision, args.steps)
            b = launch(setup, 2, work / f"{tag}-b", precision, args.steps)
            c = launch(setup, 1, work / f"{tag}-c", precision, args.steps)
            rows.append({"setup": name, "precision": a["precision"], "global_batch": a["global_batch"],
                         **{f"same_command_{k}": v for k, v in compare(a["steps"], b["steps"]).items()},
                         "same_command_weights_identical": a["sha"] == b["sha"],
                         **{f"one_vs_two_{k}": v for k, v in compare(c["steps"], a["steps"]).items()
                            if k != "steps"},
                         "losses": {"a": a["steps"], "b": b["steps"], "one_process": c["steps"]},
                         "wall_s": a["wall_s"] + b["wall_s"] + c["wall_s"]})
    columns = ["setup", "precision", "same_command_bit_identical_steps", "same_command_steps",
               "same_command_weights_identical", "same_command_max_rel_loss_diff", "one_vs_two_bit_identical_steps",
               "one_vs_two_max_rel_loss_diff"]
    print_table(rows, columns)
    verdict = {r["setup"] + " " + r["precision"]: {
        "same_command_bit_identical": r["same_command_bit_identical_steps"] == r["same_command_steps"]
        and r["same_command_weights_identical"],
        "one_vs_two_bit_identical": r["one_vs_two_bit_identical_steps"] == r["same_command_steps"]} for r in rows}
    print(json.dumps(verdict, indent=1))
    headers = ["setup", "precision", "same command: identical steps", "of steps", "same weights",
               "same command: max rel. loss diff", "1 vs 2 processes: identical steps", "1 vs 2: max rel. loss diff"]
    write_artifact("bench_repro", rows, extra={"settings": vars(args), "columns": columns, "headers": headers,
                                               "verdict": verdict,
                                               "notes": [
        "DDP, 2 processes × 1 thread, gloo; --seed 0 and --precision pinned; the 1-process run accumulates two "
        "micro-batches for the same global batch (--global-batch-size); losses and gradient norms from metrics.jsonl, weights from final/*.safetensors"]})


if __name__ == "__main__":
    main()
