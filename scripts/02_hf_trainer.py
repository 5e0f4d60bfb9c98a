#!/usr/bin/env python
"""Chapter 02, comparison run: the same job through Hugging Face Trainer.

  torchrun --standalone --nproc_per_node 2 scripts/02_hf_trainer.py --max-steps 30 --output-dir runs/hf

Same flags as scripts/02_data_parallel.py (model, data, batch, lr schedule,
precision); writes metrics.jsonl and summary.json in the same format.
"""

import os

from ecomkit.config import parse_config
from ecomkit.errors import exit_on_user_error
from ecomkit.train.hf_trainer import run_hf_trainer


@exit_on_user_error
def main(argv: list[str] | None = None) -> None:
    cfg, _ = parse_config(argv, description=__doc__)
    summary = run_hf_trainer(cfg)
    if summary and int(os.environ.get("RANK", 0)) == 0:
        print(f"HF Trainer: loss {summary['first_loss']:.4f} → {summary['final_loss']:.4f}, "
              f"{summary['samples_per_s']:.1f} samples/s, outputs in {summary['output_dir']}")


if __name__ == "__main__":
    main()
