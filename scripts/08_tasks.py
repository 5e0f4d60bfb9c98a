#!/usr/bin/env python
"""Chapter 08: the models' own jobs. Fine-tune on classification or extraction in SeqGPT's prompt, score by generation.

  # train (2 processes) on the synthetic catalog's classification and extraction examples, seqgpt prompt
  torchrun --standalone --nproc_per_node 2 scripts/08_tasks.py --task nlu --output-dir runs/tasks
  # your own data (span lists, spans nested by label, or BIO tags; see docs/guide.md, "Bring your own data")
  torchrun --standalone --nproc_per_node 2 scripts/08_tasks.py --task nlu --data ner.jsonl --eval-data dev.jsonl
  # evaluate the saved weights again, under another strategy (the figures must not change)
  torchrun --standalone --nproc_per_node 2 scripts/08_tasks.py --task nlu --evaluate-only --model runs/tasks/final
      --strategy zero --zero-stage 3   (give it the run's --data / --eval-data and sizes too)

Evaluation by generation (``--gen-eval-samples``, ``--gen-max-new-tokens``, ``--gen-num-beams``,
``--gen-batch-size``, ``--no-gen-use-cache``) decodes held-out examples at every evaluation and prints
accuracy / span F1 beside the majority and dictionary baselines; the final one writes
``<output-dir>/predictions.jsonl``.
"""

from ecomkit.config import parse_config
from ecomkit.errors import exit_on_user_error
from ecomkit.metrics import print_run_summary
from ecomkit.task_summary import print_evaluation
from ecomkit.train import run_training
from ecomkit.train.eval_run import run_evaluation


def evaluate_only_flag(parser) -> None:
    parser.add_argument("--evaluate-only", action="store_true",
                        help="evaluate the saved model --model under --strategy on the run's data; no training "
                             "(writes evaluation.json and predictions.jsonl to --output-dir)")


@exit_on_user_error
def main(argv: list[str] | None = None) -> None:
    cfg, ns = parse_config(argv, description=__doc__, extra=evaluate_only_flag)
    if ns.evaluate_only:
        print_evaluation(run_evaluation(cfg))
    else:
        print_run_summary(run_training(cfg))


if __name__ == "__main__":
    main()
