#!/usr/bin/env python
"""The demo (`make demo`): 2 processes train a model on a catalog task and show what it learned.

  torchrun --standalone --nproc_per_node 2 scripts/00_demo.py --output-dir runs/demo

It writes 2,000 product titles with their category from the synthetic catalog to
<output-dir>/data/titles.jsonl, trains the `tiny` preset (a random-init BLOOM) on them with DDP, prints the
run summary, then its accuracy on the held-out titles beside the baseline (always answering the most
frequent training category), which model it is, and the command that trains the same way on your own file.
Every training flag works here too (`--help`); `--data FILE` trains on your file instead of the titles.
"""

from ecomkit.config import parse_config
from ecomkit.errors import exit_on_user_error
from ecomkit.metrics import print_run_summary
from ecomkit.train import run_training
from ecomkit.train.demo import demo_config, print_demo_result, with_demo_data


@exit_on_user_error
def main(argv: list[str] | None = None) -> None:
    cfg, _ = parse_config(argv, description=__doc__, defaults=demo_config())
    cfg = with_demo_data(cfg)
    summary = run_training(cfg)
    print_run_summary(summary)
    print_demo_result(summary, cfg)


if __name__ == "__main__":
    main()
