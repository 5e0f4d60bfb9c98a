#!/usr/bin/env python
"""Packing benchmark: short rows bucketed, packed by ecomkit, and by HF Trainer and TRL, side by side, 2 processes.

  python benchmarks/bench_packing.py [--model tiny] [--precisions fp32 bf16] [--repeats 3] [--no-trl]
                                     [--parts speed loss]

Part ``speed`` (artifact ``bench_packing``): two data sets, each trained for ``--epochs`` by every variant, in
rounds whose order rotates:
- ``catalog``: the synthetic catalog, ``--task lm`` (short rows: ~90 tokens), at every ``--precisions``
  (``--packing auto`` on a CPU follows these ratios per precision and seq_len:
  ``ecomkit.data.packing.CPU_PACK_MAX_SEQ_LEN``);
- ``instructions``: an Alpaca-style file of widely varied lengths (``ecomkit.data.catalog.instruction_rows``),
  ``--task nlu`` (the loss on the responses), at the last of ``--precisions``.

Variants (micro-batch ``--micro-batch-size`` per process, one thread each, the same rows and tokenizer):
- (a) ecomkit, bucketed batches (``--packing off``): ``micro-batch`` rows of similar length;
- (b) ecomkit, packed (``--packing on``): ``micro-batch`` sequences of ``seq_len`` tokens, document-masked;
- (c) HF Trainer with ``group_by_length`` (``scripts/02_hf_trainer.py``);
- (d) TRL's ``SFTTrainer(packing=True)`` (best-fit decreasing, padding-free), when ``trl`` is installed.

Each row: real tokens/s (totals over the steady phase, the slowest rank's pace, after ``--untimed`` steps),
the fill rate (real tokens over the positions computed), steps per epoch, the final training loss and the
held-out loss on the unpacked eval rows (ecomkit's token mean, for every variant: the task metric of an LM
and of instruction data). The verdict is the median over rounds of packed / bucketed real tokens/s.

Part ``loss`` (artifact ``bench_packing_loss``): whether packing changes what a run learns. Packed steps carry
several times the rows of bucketed ones at the same ``--micro-batch-size``, so one epoch takes that many fewer
optimizer steps and ends at a higher loss for that reason alone. Here the packed run's micro-batch is set so that
an epoch takes about the bucketed run's steps (``ecomlab.measure.packing.equal_step_micro_batch``), both train
one epoch at seeds 0, 1 and 2, and the verdict is whether the medians of their final training losses and of
their held-out losses differ by no more than the seeds' spread (``ecomlab.measure.packing.seed_spread``).

Cross-document attention: a packed row's loss against the same row alone, for ecomkit's packing and for
TRL's batches as its Trainer hands them to BLOOM (``pack_dataset`` + its padding-free collator), on the
same random-init model and rows, in fp32. ecomkit's difference is float rounding; a packer that lets rows
see each other shows the rows' influence on each other.
"""

from __future__ import annotations

import argparse
import importlib.util
import statistics
import tempfile
from pathlib import Path

import torch
from common import paired_rates, print_table, rotating_rounds, run_summary, verdict, warn_emulated_bf16, write_artifact

from ecomkit.data import load_records, write_jsonl
from ecomkit.data.toy_tasks import instruction_rows
from ecomkit.data.packing import best_fit_decreasing, packed_collate
from ecomkit.data.tokenize import IGNORE_INDEX, pad_collate, tokenize_records
from ecomkit.fast.attention import install_attention
from ecomkit.models.attention import attention_mask_for
from ecomkit.models.bloom import build_model
from ecomkit.models.loss import shifted_token_losses
from ecomkit.models.tokenizer import get_tokenizer
from ecomkit.train.loop import tokenizer_cache_dir
from ecomlab.measure.packing import equal_step_micro_batch, seed_spread
from ecomlab.rates import pooled_rate

GOAL = 1.5        # packed / bucketed real tokens/s on the catalog job
LOSS_SEEDS = (0, 1, 2)
FILL_GOAL = 0.95  # packed fill rate
ECO, HF = "02_data_parallel.py", "02_hf_trainer.py"


def variants(trl: bool) -> dict[str, tuple[str, list[str]]]:
    out = {"(a) ecomkit bucketed": (ECO, ["--packing", "off"]),
           "(b) ecomkit packed": (ECO, ["--packing", "on"]),
           "(c) HF Trainer group_by_length": (HF, ["--hf-sampling", "group_by_length"])}
    if trl:
        out["(d) TRL SFTTrainer packing"] = (HF, ["--trl-packing"])
    return out


def bench_jobs(args: argparse.Namespace, folder: Path) -> dict[str, list[str]]:
    """``"<data> <precision>"`` -> flags: the catalog at every ``--precisions``, the instructions at the last."""
    path = write_jsonl(instruction_rows(args.instruction_rows, seed=1), folder / "instructions.jsonl")
    catalog = ["--task", "lm", "--n-rows", str(args.n_rows)]
    instructions = ["--task", "nlu", "--data", str(path), "--gen-eval-samples", "0", "--eval-nlu-samples", "0"]
    out = {f"catalog {p}": catalog + ["--precision", p] for p in args.precisions}
    out[f"instructions {args.precisions[-1]}"] = instructions + ["--precision", args.precisions[-1]]
    return out


def row(data: str, name: str, runs: list[dict]) -> dict:
    first = runs[0]
    return {"data": data, "variant": name, "runs": len(runs), "real tokens/s": pooled_rate(runs, "tokens_per_s"),
            "fill %": 100 * statistics.median(r.get("fill_rate") or 1 - r.get("padding_rate", 0) for r in runs),
            "seq_len": (first.get("config") or {}).get("seq_len"), "steps/epoch": first.get("steps_per_epoch"),
            "ms/step": 1000 * sum(r["steady_wall_s"] for r in runs) / sum(r["steady_steps"] for r in runs),
            "final loss": statistics.median(r["final_loss"] for r in runs),
            "eval loss": statistics.median(r["eval_loss"] for r in runs)}


# ---------------------------------------------------------------------- cross-document attention
def _per_row_losses(logits: torch.Tensor, labels: torch.Tensor, starts: list[tuple[int, int, int]]) -> list[float]:
    """Mean next-token loss of each (sequence, start, end) segment of a batch."""
    losses = shifted_token_losses(logits, labels)              # [B, T-1]; position t predicts token t+1
    scored = labels[:, 1:] != IGNORE_INDEX
    return [float(losses[s, a:b - 1].sum() / scored[s, a:b - 1].sum()) for s, a, b in starts]


def _alone(model, rows: list[dict]) -> list[float]:
    out = []
    for r in rows:
        ids, labels = torch.tensor([r["input_ids"]]), torch.tensor([r["labels"]])
        labels[0, 0] = IGNORE_INDEX
        out.append(_per_row_losses(model(input_ids=ids).logits, labels, [(0, 0, ids.shape[1])])[0])
    return out


def _ecomkit_packed(model, rows: list[dict], seq_len: int) -> tuple[list[float], list[int]]:
    bins = best_fit_decreasing([len(r["input_ids"]) for r in rows], seq_len)
    batch = packed_collate([{"input_ids": [rows[i]["input_ids"] for i in b],
                             "labels": [rows[i]["labels"] for i in b]} for b in bins], seq_len, 3)
    segments, order = [], []
    for s, b in enumerate(bins):
        at = 0
        for i in b:
            n = len(rows[i]["input_ids"])
            segments.append((s, at, at + n))
            order.append(i)
            at += n
    logits = model(input_ids=batch["input_ids"], attention_mask=attention_mask_for(batch)).logits
    return _per_row_losses(logits, batch["labels"], segments), order


def _trl_packed(model, rows: list[dict], seq_len: int, micro_batch: int) -> tuple[list[float], list[int]]:
    """TRL's packing and collator, the batch as its Trainer passes it to BLOOM (position_ids and all)."""
    from datasets import Dataset
    from trl.data_utils import pack_dataset  # lazy: TRL is optional (the peer this benchmark compares)
    from trl.trainer.sft_trainer import DataCollatorForLanguageModeling

    table = Dataset.from_dict({"input_ids": [r["input_ids"] for r in rows], "labels": [r["labels"] for r in rows],
                               "row": [[i] * len(r["input_ids"]) for i, r in enumerate(rows)]})
    packed = pack_dataset(table, seq_len, strategy="bfd")
    collate = DataCollatorForLanguageModeling(pad_token_id=3, padding_free=True)
    losses, order = [], []
    for start in range(0, len(packed), micro_batch):
        examples = [packed[i] for i in range(start, min(start + micro_batch, len(packed)))]
        batch = collate([{k: e[k] for k in ("input_ids", "labels", "seq_lengths")} for e in examples])
        row_of = [i for e in examples for i in e["row"]]
        boundaries = (batch["position_ids"][0] == 0).nonzero().flatten().tolist() + [batch["input_ids"].shape[1]]
        segments = [(0, a, b) for a, b in zip(boundaries, boundaries[1:])]
        model_inputs = {k: v for k, v in batch.items() if k in ("input_ids", "position_ids", "attention_mask")}
        logits = model(**model_inputs).logits
        losses += _per_row_losses(logits, batch["labels"], segments)
        order += [row_of[a] for _, a, _ in segments]
    return losses, order


FIT_STEPS = 60   # a random-init model attends almost uniformly: train it briefly so that what a row sees matters


def _fit(model, rows: list[dict]) -> float:
    """A few AdamW steps on the rows, unpacked (8 per batch); returns the last batch's mean token loss."""
    optimizer = torch.optim.AdamW(model.parameters(), lr=3e-3)
    loss = torch.zeros(())
    for step in range(FIT_STEPS):
        batch = pad_collate([rows[(8 * step + i) % len(rows)] for i in range(8)], 3)
        losses = shifted_token_losses(model(input_ids=batch["input_ids"],
                                            attention_mask=batch["attention_mask"]).logits, batch["labels"])
        loss = losses.sum() / (batch["labels"][:, 1:] != IGNORE_INDEX).sum()
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    return float(loss)


def cross_document_effect(seq_len: int, micro_batch: int, n_rows: int, trl: bool) -> dict[str, dict[str, float]]:
    """Relative difference between each packed row's loss and its loss alone (median and max over rows)."""
    torch.manual_seed(0)
    tok = get_tokenizer("local", tokenizer_cache_dir())
    with tempfile.TemporaryDirectory(prefix="bench-packing-") as tmp:   # through the loader, as a user's file
        records = load_records(write_jsonl(instruction_rows(n_rows, seed=2), Path(tmp) / "rows.jsonl"), task="nlu")
        rows = tokenize_records(records.dataset, tok, "nlu", seq_len).to_list()
    model = build_model("tiny", vocab_size=len(tok))
    install_attention(model, "sdpa")
    trained_loss = _fit(model, rows)
    model.eval()
    out = {"model": {"steps": FIT_STEPS, "loss": trained_loss}}
    with torch.no_grad():
        alone = _alone(model, rows)
        packers = {"ecomkit": lambda: _ecomkit_packed(model, rows, seq_len)}
        if trl:
            packers["TRL"] = lambda: _trl_packed(model, rows, seq_len, micro_batch)
        for name, pack in packers.items():
            losses, order = pack()
            diffs = sorted(abs(loss - alone[i]) / alone[i] for loss, i in zip(losses, order))
            out[name] = {"rows": len(diffs), "median": statistics.median(diffs), "max": diffs[-1]}
    return out


def speed_part(args: argparse.Namespace, common: list[str], trl: bool, folder: Path) -> None:
    """Every variant on every job in rotating rounds; the cross-document effect; artifact ``bench_packing``."""
    rows, notes, ratios = [], [], {}
    for data, flags in bench_jobs(args, folder).items():
        jobs = {name: (script, common + flags + extra, 2) for name, (script, extra) in variants(trl).items()}
        print(f"== {data}", flush=True)
        runs = rotating_rounds(jobs, args.repeats, describe=lambda s: f"{s['tokens_per_s']:,.0f} real tokens/s")
        rows += [row(data, name, rs) for name, rs in runs.items()]
        packed, bucketed = runs["(b) ecomkit packed"], runs["(a) ecomkit bucketed"]
        ratio = paired_rates(packed, bucketed, "tokens_per_s")
        ratios[data] = list(ratio.ratios)
        notes.append(f"{data}: packed / bucketed real tokens/s {ratio.describe()}")
        for peer in [k for k in runs if k.startswith(("(c)", "(d)"))]:
            notes.append(f"{data}: packed / {peer} real tokens/s {paired_rates(packed, runs[peer], 'tokens_per_s').describe()}")
        if data.startswith("catalog"):
            fill = statistics.median(r["fill_rate"] for r in packed)
            notes.insert(0, verdict(f"{data}: packed / bucketed real tokens/s {ratio.describe()}", ratio.median,
                                    f">= {GOAL}x", ratio.median >= GOAL))
            notes.insert(1, verdict(f"{data}: packed fill rate", fill, f">= {FILL_GOAL}", fill >= FILL_GOAL))
    seq_len = next(r["seq_len"] for r in rows if r["data"].startswith("instructions") and r["variant"].startswith("(b)"))
    effect = cross_document_effect(seq_len, args.micro_batch_size, 200, trl)
    for name, e in ((k, v) for k, v in effect.items() if k != "model"):
        notes.append(f"cross-document attention, {name}: a packed row's loss differs from the row alone by "
                     f"{e['median']:.1e} (median) / {e['max']:.1e} (max) relative, {e['rows']} instruction rows, "
                     f"seq_len {seq_len}, fp32, tiny trained {FIT_STEPS} steps")
    print(f"\nmodel={args.model} precisions={args.precisions} micro-batch={args.micro_batch_size} "
          f"(2 processes, 1 thread each; slowest rank; {args.repeats} rounds)\n")
    print_table(rows, list(rows[0]))
    print("\n".join(notes))
    write_artifact("bench_packing", rows, extra={
        "settings": {**vars(args), "trl": trl, "threads_per_process": 1},
        "columns": list(rows[0]), "ratios": ratios, "cross_document": effect, "notes": notes})


def loss_part(args: argparse.Namespace, common: list[str], folder: Path) -> None:
    """Bucketed and packed at about equal steps per epoch, seeds 0-2: final losses; artifact ``bench_packing_loss``."""
    rows, notes = [], []
    jobs = bench_jobs(args, folder)
    for data in (f"catalog {args.precisions[-1]}", f"instructions {args.precisions[-1]}"):
        flags = common + jobs[data]
        probe = {p: run_summary(ECO, flags + ["--packing", p, "--max-steps", "1"], nproc=2)["steps_per_epoch"]
                 for p in ("on", "off")}
        micro = equal_step_micro_batch(args.micro_batch_size, probe["on"], probe["off"])
        setups = {"(a) ecomkit bucketed": ["--packing", "off"],
                  "(b) ecomkit packed": ["--packing", "on", "--micro-batch-size", str(micro)]}
        runs: dict[str, list[dict]] = {name: [] for name in setups}
        for seed in LOSS_SEEDS:
            for name, extra in setups.items():
                runs[name].append(run_summary(ECO, flags + extra + ["--seed", str(seed)], nproc=2))
                print(f"  {data} seed {seed}: {name}: final loss {runs[name][-1]['final_loss']:.3f}, "
                      f"eval loss {runs[name][-1]['eval_loss']:.3f}", flush=True)
        for name, rs in runs.items():
            rows.append({"data": data, "variant": name,
                         "micro-batch": micro if name.startswith("(b)") else args.micro_batch_size,
                         "steps/epoch": rs[0]["steps_per_epoch"],
                         "final loss (seeds)": " / ".join(f"{r['final_loss']:.3f}" for r in rs),
                         "eval loss (seeds)": " / ".join(f"{r['eval_loss']:.3f}" for r in rs)})
        for key, label in (("final_loss", "final training loss"), ("eval_loss", "held-out loss")):
            spread = seed_spread([r[key] for r in runs["(a) ecomkit bucketed"]],
                                 [r[key] for r in runs["(b) ecomkit packed"]])
            notes.append(verdict(f"{data}: packed {label} equals bucketed within the seeds' spread (gap of the "
                                 f"medians {spread.gap:.3f}, spread {spread.noise:.3f})", spread.gap,
                                 f"<= {spread.noise:.3f}", spread.within_noise))
    print_table(rows, list(rows[0]))
    print("\n".join(notes))
    write_artifact("bench_packing_loss", rows, extra={
        "settings": {**vars(args), "seeds": list(LOSS_SEEDS), "threads_per_process": 1},
        "columns": list(rows[0]), "notes": notes})


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="tiny", help="model preset every variant trains")
    ap.add_argument("--precisions", nargs="+", default=["fp32", "bf16"], choices=["fp32", "bf16"],
                    help="the catalog runs at each (the CPU packing rule is per precision); the instructions at the last")
    ap.add_argument("--micro-batch-size", type=int, default=8, help="rows (bucketed, Trainer) or sequences (packed)")
    ap.add_argument("--epochs", type=float, default=1.0, help="epochs each run trains")
    ap.add_argument("--untimed", type=int, default=3, help="untimed first steps of each run")
    ap.add_argument("--n-rows", type=int, default=4000, help="rows of the synthetic catalog")
    ap.add_argument("--instruction-rows", type=int, default=1500, help="rows of the instruction file")
    ap.add_argument("--repeats", type=int, default=3, help="rounds; the verdict is the median of their ratios")
    ap.add_argument("--trl", action=argparse.BooleanOptionalAction, default=True,
                    help="also run TRL's SFTTrainer(packing=True) when trl is installed")
    ap.add_argument("--parts", nargs="+", default=["speed", "loss"], choices=["speed", "loss"],
                    help="speed: every variant's real tokens/s in paired rounds (artifact bench_packing); loss: "
                         "packed and bucketed final losses at equal steps per epoch over 3 seeds (bench_packing_loss)")
    args = ap.parse_args()
    warn_emulated_bf16(args.precisions, "--precisions fp32 runs every variant in fp32.")
    trl = args.trl and importlib.util.find_spec("trl") is not None
    common = ["--model", args.model, "--max-steps", "0", "--epochs", str(args.epochs), "--untimed-steps",
              str(args.untimed), "--eval-interval", "0", "--eval-batches", "1000", "--no-save-model",
              "--micro-batch-size", str(args.micro_batch_size), "--report-to", "none"]
    with tempfile.TemporaryDirectory(prefix="bench-packing-") as tmp:
        if "speed" in args.parts:
            speed_part(args, common, trl, Path(tmp))
        if "loss" in args.parts:
            loss_part(args, common, Path(tmp))


if __name__ == "__main__":
    main()
