"""What a training run says and keeps around its loop: the start-up line, the recipe, ``summary.json``, ``final/``.

Why apart from ``train/loop.py``: the loop reads top to bottom as set-up, steps, evaluation; how a run reports
itself (and resolves its ``auto`` recipe from facts the set-up has gathered) is a separate concern that grew with
every chapter. Each function takes the :class:`~ecomkit.train.loop.TrainingRun` (duck-typed: this module sits
beside the loop, not above it).
"""

from __future__ import annotations

from typing import Any

from ecomkit.config.recipe import Recipe, RecipeValue, resolve_lr
from ecomkit.config.vocabulary import AUTO
from ecomkit.data import lengths_array
from ecomkit.data.formats import write_task_file
from ecomkit.dist import gather_objects
from ecomkit.envcheck.matmul import roofline_summary
from ecomkit.metrics import fill_rate_of, slowest_rank_throughput, time_split
from ecomkit.models.bloom import model_origin
from ecomkit.models.lora import lora_facts, lora_line
from ecomkit.models.tokenizer import match_tokenizer
from ecomkit.train.run_recipe import estimate_step_s, recipe_summary, resolve_run_recipe, run_facts


def resolve_recipe(run: Any, precision: RecipeValue) -> tuple[Recipe, float]:
    """The recipe's ``auto`` values resolved in ``run.cfg`` from the model, the data and a step-time estimate, and the
    lr the recipe recommends for this model whatever ``--lr`` says (the summary compares them when a run misses)."""
    lengths = lengths_array(run.train_ds)
    spe = run.sampler.steps_per_epoch
    est = estimate_step_s(float(lengths.sum()) / max(1, spe), float(lengths.mean()) if len(lengths) else 0.0,
                          run.env.world_size, run.n_params, run.model_config.n_layer,
                          run.model_config.hidden_size, run.env.device, run.cfg.precision)
    est = gather_objects(est, run.env)[0]   # rank 0's timing for all: every rank must run as many steps
    facts = run_facts(run.cfg, run.n_params, len(run.train_ds), spe, est)
    recipe = resolve_run_recipe(run.cfg, facts, precision)
    recipe.values["global_batch"] = run.batch_choice
    return recipe, resolve_lr(AUTO, facts).value


def startup_banner(run: Any) -> str:
    """The start-up line: strategy, model and what kind, batch arithmetic, steps, precision, and the recipe."""
    gb = run.global_batch()
    unit = "packed sequences" if run.packed else "rows"
    lora = lora_facts(run.cfg, run.n_trainable, run.n_params)   # LoRA on: rank, targets, what trains
    return (f"strategy={run.strategy.name} model={run.cfg.model} ({model_origin(run.cfg.model)['kind']}) "
            f"params={run.n_params:,} | " + (lora_line(lora) + " | " if lora else "") +
            f"world_size={run.env.world_size} micro_batch={run.cfg.micro_batch_size} {unit}/device "
            f"grad_accum={run.grad_accum} global_batch={gb} "
            f"positions/step<= {gb * run.cfg.seq_len:,} ({gb} × seq_len {run.cfg.seq_len}) | "
            f"steps={run.total_steps} precision={run.cfg.precision} backend={run.env.backend}\n"
            f"recipe: {run.recipe.line()}")


def run_summary(run: Any, final_eval: dict[str, float], wall: float) -> dict[str, Any]:
    """``summary.json``: what ran, what it measured (steady-phase totals at the slowest rank's pace), and its config."""
    train_rows = [r for r in run.history if r.get("type") == "train"]
    # Totals over the steady phase, at the slowest rank's pace (a collective: every rank gets here).
    throughput = slowest_rank_throughput(train_rows, run.env, run.cfg.untimed_steps)
    return {
        "strategy": run.strategy.name, "model": run.cfg.model, "params": run.n_params,
        "trainable_params": run.n_trainable, "peft": run.cfg.peft,
        "model_origin": model_origin(run.cfg.model), "recipe": recipe_summary(getattr(run, "recipe", None)),
        "lora": lora_facts(run.cfg, run.n_trainable, run.n_params),
        "world_size": run.env.world_size, "global_batch": run.global_batch(),
        "data": run.data_report.facts(),
        "grad_accum": run.grad_accum, "steps": run.step,
        "seq_len": run.cfg.seq_len, "packing": run.packed, "fill_rate": fill_rate_of(train_rows),
        "steps_per_epoch": run.sampler.steps_per_epoch,
        "first_loss": train_rows[0]["loss"] if train_rows else None,
        "final_loss": train_rows[-1]["loss"] if train_rows else None,
        **final_eval,
        **throughput, "time_split": time_split(train_rows, run.cfg.untimed_steps),
        **roofline_summary(train_rows[run.cfg.untimed_steps:], throughput["steady_wall_s"], *run.roofline,
                           run.env.world_size, run.env.device),
        "peak_mem_bytes": max((r["peak_mem_bytes"] for r in train_rows), default=0),
        "wall_s": wall, "output_dir": str(run.out_dir.resolve()),
        "model_dir": str((run.out_dir / "final").resolve()) if run.cfg.save_model else None,
        "config": run.cfg.to_dict(),
    }


def save_run(run: Any) -> None:
    """``final/`` (``save_pretrained``; with LoRA also ``adapter/``) and the task file ecomkit.predict reads."""
    if run.cfg.save_model:
        match_tokenizer(run.strategy.raw_model, run.tokenizer)  # the tokenizer's pad/bos/eos, use_cache on
        if run.cfg.peft != "none":  # <out>/adapter (PEFT format) and <out>/final (merged)
            run.strategy.save_peft(str(run.out_dir), run.tokenizer)
        else:
            run.strategy.save_pretrained(str(run.out_dir / "final"), run.tokenizer)
        if run.env.is_main:   # the prompt format and labels it learned, for evaluation and ecomkit.predict
            write_task_file(run.out_dir / "final", prompt_format=run.cfg.prompt_format, task=run.cfg.task,
                            labels=run.data_report.labels, kinds=list(run.data_report.examples_per_kind),
                            seq_len=int(run.cfg.seq_len),   # as the data resolved them (auto)
                            gen_max_new_tokens=run.cfg.gen_max_new_tokens if run.cfg.task == "nlu" else None,
                            reading={k: getattr(run.cfg, k) for k in ("column_map", "label_map", "span_end")},
                            train_label_counts=run.data_report.train_label_counts,
                            train_spans=run.data_report.train_spans if run.cfg.task == "nlu" else None)
