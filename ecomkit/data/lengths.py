"""Token lengths measured before training, ``--seq-len auto``, and every cut counted.

A length picked by hand cuts rows nobody looks at, so rows are tokenised whole, summarised per split, then cut.
``auto`` is the smallest multiple of :data:`SEQ_LEN_MULTIPLE` holding every row, up to the model's limit; rows past
a limit are cut and counted with a warning naming the flag; LM documents are split into windows, never truncated.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

import numpy as np
import pyarrow as pa
from datasets import Dataset

from ecomkit.config.vocabulary import AUTO
from ecomkit.data.stream import column_numpy, read_columns
from ecomkit.data.tasks import KINDS
from ecomkit.data.tokenize import CUT_COLUMNS, MIN_MAX_LENGTH, fit_rows, tokenize_whole
from ecomkit.errors import ConfigError

# --seq-len auto rounds up to this: whole 64-row tiles for GEMMs and attention, and few distinct lengths.
SEQ_LEN_MULTIPLE = 64
# Margin of --gen-max-new-tokens auto over the longest training answer (EOS included): a generation may run longer.
GEN_BUDGET_MARGIN = 8
FINAL_COLUMNS = ("input_ids", "labels", "length", "polarity")   # what the sampler and the collator read


@dataclass(frozen=True)
class Spread:
    """p50 / p95 / max of one length over a split's rows (0 for an empty split)."""

    p50: int = 0
    p95: int = 0
    max: int = 0

    @classmethod
    def of(cls, values: np.ndarray) -> "Spread":
        if len(values) == 0:
            return cls()
        p50, p95 = np.percentile(values, [50, 95], method="higher")
        return cls(int(p50), int(p95), int(values.max()))

    def text(self) -> str:
        return f"{self.p50}/{self.p95}/{self.max}"


@dataclass(frozen=True)
class LengthStats:
    """One split's token lengths before any cut: whole rows, their prompts (0 for LM rows) and answers."""

    rows: int = 0
    row: Spread = field(default_factory=Spread)
    prompt: Spread = field(default_factory=Spread)
    answer: Spread = field(default_factory=Spread)
    prompted_rows: int = 0     # rows with a prompt (NLU and instruction examples)
    longest_answer: int = 0    # over prompted rows, EOS included (the generation budget's base)
    tokens: int = 0

    @property
    def mean_row(self) -> float:
        return self.tokens / self.rows if self.rows else 0.0

    def text(self) -> str:
        parts = [f"row {self.row.text()}"]
        if self.prompted_rows:
            parts += [f"prompt {self.prompt.text()}", f"answer {self.answer.text()}"]
        return f"{self.rows:,} rows, tokens p50/p95/max: " + ", ".join(parts)


def length_stats(whole: Dataset, rows: np.ndarray | None = None) -> LengthStats:
    """:class:`LengthStats` of ``whole`` (a :func:`~ecomkit.data.tokenize.tokenize_whole` table), or of ``rows``."""
    table = read_columns(whole, ["length", "prompt_length"])
    length = table.column(0).to_numpy().astype(np.int64)
    prompt = table.column(1).to_numpy().astype(np.int64)
    if rows is not None:
        length, prompt = length[rows], prompt[rows]
    prompted = prompt > 0
    answer = (length - prompt)[prompted]
    return LengthStats(len(length), Spread.of(length), Spread.of(prompt[prompted]), Spread.of(answer),
                       int(prompted.sum()), int(answer.max()) if len(answer) else 0, int(length.sum()))


def choose_seq_len(requested: int | str, longest_row: int, limit: int) -> tuple[int, str]:
    """``(seq_len, why)``: an explicit length as given; ``auto`` the smallest multiple of 64 holding every row.

    ``limit`` is the model's: ``auto`` never goes past it, and says so when rows are longer.
    """
    if requested != AUTO:
        return int(requested), f"--seq-len {requested} as given"
    fit = max(MIN_MAX_LENGTH, -(-longest_row // SEQ_LEN_MULTIPLE) * SEQ_LEN_MULTIPLE)
    if fit <= limit:
        return fit, f"auto: the smallest multiple of {SEQ_LEN_MULTIPLE} that holds every row (longest {longest_row})"
    if longest_row <= limit:
        return limit, f"auto: the model's limit {limit}, which holds every row (longest {longest_row})"
    return limit, (f"auto reached the model's limit {limit}; the longest row has {longest_row} tokens, so longer "
                   f"rows are cut or, for LM documents, split into windows")


def reached_limit(requested: int | str, longest_row: int, limit: int) -> bool:
    """Whether ``--seq-len auto`` stopped at the model's limit with rows longer than it."""
    return requested == AUTO and choose_seq_len(requested, longest_row, limit)[0] < longest_row


def generation_budget(requested: int | str, train: LengthStats) -> tuple[int, str]:
    """``(max_new_tokens, why)``: ``auto`` is the longest training answer (EOS included) plus a margin."""
    if requested != AUTO:
        return int(requested), f"--gen-max-new-tokens {requested} as given"
    if train.longest_answer == 0:
        raise ConfigError("--gen-max-new-tokens auto needs training rows with answers (task nlu); this data has "
                          "none. Give --gen-max-new-tokens N.")
    return train.longest_answer + GEN_BUDGET_MARGIN, (f"auto: the longest training answer ({train.longest_answer} "
                                                      f"tokens with its EOS) + {GEN_BUDGET_MARGIN}")


@dataclass(frozen=True)
class CutCounts:
    """What fitting one split to ``seq_len`` cut: rows, tokens (by part), and LM documents split into windows."""

    seq_len: int = 0
    rows_cut: int = 0
    tokens_dropped: int = 0
    input_tokens_dropped: int = 0
    answer_tokens_dropped: int = 0
    other_tokens_dropped: int = 0
    inputs_over_half_cut: int = 0   # rows whose input lost more than half of its tokens
    documents_windowed: int = 0     # LM documents longer than seq_len ...
    windows_added: int = 0          # ... and the extra rows their windows made (nothing dropped)

    def as_dict(self) -> dict[str, int]:
        return asdict(self)

    def text(self) -> str:
        parts = []
        if self.rows_cut:
            parts.append(f"{self.rows_cut:,} rows cut to {self.seq_len} tokens, {self.tokens_dropped:,} tokens dropped "
                         f"(input {self.input_tokens_dropped:,}, answer {self.answer_tokens_dropped:,}, "
                         f"prompt {self.other_tokens_dropped:,})")
        if self.documents_windowed:
            parts.append(f"{self.documents_windowed:,} documents longer than {self.seq_len} split into windows "
                         f"(+{self.windows_added:,} rows, nothing dropped)")
        return "; ".join(parts) or "nothing cut"

    def warning(self, split: str, rows: int) -> str | None:
        """One line when inputs lost more than half: how many, and the flag that keeps them whole."""
        if not self.inputs_over_half_cut:
            return None
        return (f"{self.inputs_over_half_cut:,} of {rows:,} {split} rows lost more than half of their input text to "
                f"--seq-len {self.seq_len}. --seq-len auto (the default) fits every row; or give a larger --seq-len.")


def limit_warning(seq_len: int, cuts: dict[str, "CutCounts"], stats: dict[str, LengthStats]) -> str | None:
    """One line when ``--seq-len auto`` reached the model's limit and rows were cut: how many per split, the options."""
    cut = {k: c for k, c in cuts.items() if c.rows_cut}
    if not cut:
        return None
    counts = " and ".join(f"{c.rows_cut:,} of {stats[k].rows:,} {k} rows" for k, c in cut.items())
    half = sum(c.inputs_over_half_cut for c in cut.values())
    lost = f" ({half:,} of them lost more than half of their input)" if half else ""
    return (f"--seq-len auto reached the model's limit {seq_len}: {counts} are longer and were cut at the end of "
            f"their input text{lost}, the head kept (instruction, label list, answer cue); every cut is counted "
            f"in summary.json (data.cuts). A prompted row (classification, extraction, instruction) cannot be split "
            f"into LM-style windows (its answer belongs to the whole text), so its head is kept and counted. To keep them whole, give a larger "
            f"limit where the model allows one: --seq-len N above {seq_len} (BLOOM's ALiBi has no position table, "
            f"so longer rows run, at lengths the model was not trained on, with memory growing with N); a saved "
            f"model's limit is its config.json seq_length.")


def cut_counts(fitted: Dataset, seq_len: int, rows: np.ndarray | None = None) -> CutCounts:
    """:class:`CutCounts` of a :func:`~ecomkit.data.tokenize.fit_rows` table (or of its ``rows``)."""
    if not set(CUT_COLUMNS) <= set(fitted.column_names):
        return CutCounts(seq_len)
    table = read_columns(fitted, list(CUT_COLUMNS))
    col = {name: table.column(name).to_numpy().astype(np.int64) for name in CUT_COLUMNS}
    if rows is not None:
        col = {name: values[rows] for name, values in col.items()}
    dropped = col["cut_input"] + col["cut_answer"] + col["cut_other"]
    over_half = (col["input_tokens"] > 0) & (2 * col["cut_input"] > col["input_tokens"])
    return CutCounts(seq_len, int((dropped > 0).sum()), int(dropped.sum()), int(col["cut_input"].sum()),
                     int(col["cut_answer"].sum()), int(col["cut_other"].sum()), int(over_half.sum()),
                     int((col["window"] == 1).sum()), int((col["window"] > 0).sum()))


def lengths_facts(stats: dict[str, LengthStats], cuts: dict[str, CutCounts]) -> dict[str, Any]:
    """The lengths and cuts of every split, JSON-ready (``summary.json``'s ``data.lengths`` / ``data.cuts``)."""
    return {"lengths": {k: asdict(v) for k, v in stats.items()}, "cuts": {k: v.as_dict() for k, v in cuts.items()}}


# --packing auto packs when the mean training row fills at most this share of seq_len (two or more rows per sequence).
PACK_AUTO_MAX_ROW_SHARE = 0.5
# On a CPU, per precision, the longest seq_len at which packing trained at least 5 % faster (tests/test_packing.py).
CPU_PACK_MAX_SEQ_LEN: dict[str, int] = {"bf16": 256}


def decide_packing(requested: str, mean_row: float, seq_len: int, device_type: str = "cuda",
                   precision: str = "bf16") -> tuple[bool, str]:
    """``(packed, why)`` for ``--packing on|off|auto``: the mean training row (as fit) against ``seq_len``.

    ``auto`` packs rows filling at most :data:`PACK_AUTO_MAX_ROW_SHARE` of ``seq_len``; on a CPU only up to
    :data:`CPU_PACK_MAX_SEQ_LEN`, since a packed sequence's attention covers its whole length.
    """
    if requested != AUTO:
        return requested == "on", f"--packing {requested} as given"
    share = mean_row / seq_len if seq_len else 1.0
    rows = f"the mean training row ({mean_row:.0f} tokens) fills {share:.0%} of seq_len {seq_len}"
    if share > PACK_AUTO_MAX_ROW_SHARE:
        return False, f"auto: off, {rows} (packs when <= {PACK_AUTO_MAX_ROW_SHARE:.0%})"
    if device_type == "cpu" and seq_len > CPU_PACK_MAX_SEQ_LEN.get(precision, 0):
        measured = ", ".join(f"{p} up to seq_len {n}" for p, n in sorted(CPU_PACK_MAX_SEQ_LEN.items())) or "none"
        return False, (f"auto: off, {rows}, but on a CPU at {precision} and seq_len {seq_len} bench_packing measured "
                       f"packed batches no faster than bucketed ones (packs at {measured}); "
                       f"--packing on packs anyway")
    return True, f"auto: on, {rows} (packs when <= {PACK_AUTO_MAX_ROW_SHARE:.0%})"



@dataclass
class Splits:
    """The tokenised train and eval sets, fit to ``seq_len``, with what measuring and fitting them found."""

    train: Dataset
    eval: Dataset
    seq_len: int
    why: str                                  # how --seq-len was chosen
    stats: dict[str, LengthStats]
    cuts: dict[str, CutCounts]
    kinds: np.ndarray                         # examples built per kind (windows not counted twice)
    examples: pa.Table                        # every training-table example's record and kind
    at_limit: bool = False


def tokenized_splits(records: Dataset, eval_table: Dataset | None, eval_idx: np.ndarray, tokenizer, task: str,
                     num_proc: int, max_length: int | str, length_limit: int, tok: dict) -> Splits:
    """Tokenise every table whole, measure each split's lengths, choose ``seq_len``, fit the rows, count the cuts.

    One sequential pass per table, cached whatever the seed; no indices mapping, which would cost memory per row.
    """
    whole = tokenize_whole(records, tokenizer, task, num_proc, **tok)
    eval_whole = tokenize_whole(eval_table, tokenizer, task, num_proc, **tok) if eval_table is not None else None

    def split(table: Dataset) -> tuple[np.ndarray, np.ndarray | None]:
        if eval_whole is not None:
            return np.arange(len(table)), None
        return rows_by_record(column_numpy(table, "record"), len(records), eval_idx)

    train_rows, eval_rows = split(whole)
    stats = {"train": length_stats(whole, train_rows),
             "eval": length_stats(whole, eval_rows) if eval_whole is None else length_stats(eval_whole)}
    longest = max(s.row.max for s in stats.values())
    seq_len, why = choose_seq_len(max_length, longest, length_limit)
    at_limit = reached_limit(max_length, longest, length_limit)
    fitted = fit_rows(whole, seq_len, num_proc)
    examples = read_columns(whole, ["record", "kind"])
    kinds = np.bincount(examples.column("kind").to_numpy().astype(np.int64), minlength=len(KINDS))
    final = fitted.select_columns([c for c in FINAL_COLUMNS if c in fitted.column_names])
    train_rows, eval_rows = split(fitted)
    if eval_whole is None:
        cuts = {"train": cut_counts(fitted, seq_len, train_rows), "eval": cut_counts(fitted, seq_len, eval_rows)}
        return Splits(final.select(train_rows), final.select(eval_rows), seq_len, why, stats, cuts, kinds, examples,
                       at_limit)
    eval_fitted = fit_rows(eval_whole, seq_len, num_proc)
    kinds += np.bincount(column_numpy(eval_whole, "kind").astype(np.int64), minlength=len(KINDS))
    cuts = {"train": cut_counts(fitted, seq_len), "eval": cut_counts(eval_fitted, seq_len)}
    eval_final = eval_fitted.select_columns([c for c in FINAL_COLUMNS if c in eval_fitted.column_names])
    return Splits(final, eval_final, seq_len, why, stats, cuts, kinds, examples, at_limit)


def rows_by_record(source_record: np.ndarray, n_records: int, eval_idx: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Example rows of the training records (table order) and of the eval records (in ``eval_idx`` order)."""
    position = np.full(n_records, -1, dtype=np.int64)
    position[eval_idx] = np.arange(len(eval_idx))
    row_position = position[source_record]
    eval_rows = np.flatnonzero(row_position >= 0)
    eval_rows = eval_rows[np.argsort(row_position[eval_rows], kind="stable")]
    return np.flatnonzero(row_position < 0), eval_rows


# The two samplers (data.sampler, data.packing) cut global batches alike.
def epoch_rng(seed: int, epoch: int) -> np.random.Generator:
    """The random stream of one epoch's plan: identical on every rank for the same ``(seed, epoch)``."""
    return np.random.default_rng([int(seed), int(epoch)])


def check_batch_layout(micro_batch_size: int, grad_accum: int, num_replicas: int, rank: int) -> None:
    """The sizes a sampler cuts global batches by: each at least 1, and ``rank`` one of the replicas."""
    for flag, value in (("--micro-batch-size", micro_batch_size), ("--grad-accum", grad_accum),
                        ("the number of data-parallel processes", num_replicas)):
        if value < 1:
            raise ConfigError(f"{flag} must be >= 1, got {value}.")
    if not 0 <= rank < num_replicas:
        raise ConfigError(f"rank must be in 0..{num_replicas - 1}, got {rank}.")

