#!/usr/bin/env python
"""Chapter 02, comparison run: the same job through Hugging Face Trainer.

  torchrun --standalone --nproc_per_node 2 scripts/02_hf_trainer.py --max-steps 30 --output-dir runs/hf

Same flags as scripts/02_data_parallel.py (model, data, batch, lr schedule,
precision); writes metrics.jsonl and summary.json in the same format.
`--hf-sampling group_by_length` (default: Trainer at its best, batches of
similar length) | `random` (Trainer's default sampler) | `batch_rebalance`;
`--trl-packing`: TRL's SFTTrainer packs the rows itself (the packing benchmark's peer).
"""

import os

from ecomkit.config import parse_config
from ecomkit.errors import exit_on_user_error
from ecomkit.metrics import throughput_lines
from ecomkit.train.hf_trainer import HF_SAMPLING, run_hf_trainer


def sampling_flag(parser) -> None:
    parser.add_argument("--hf-sampling", choices=HF_SAMPLING, default=HF_SAMPLING[0],
                        help="Trainer's train_sampling_strategy (default: %(default)s)")
    parser.add_argument("--trl-packing", action="store_true",
                        help="TRL's SFTTrainer(packing=True) packs the rows itself (pip install trl); on BLOOM its "
                             "packed rows attend to each other (benchmarks/bench_packing.py measures how much)")


@exit_on_user_error
def main(argv: list[str] | None = None) -> None:
    cfg, ns = parse_config(argv, description=__doc__, extra=sampling_flag)
    summary = run_hf_trainer(cfg, sampling=ns.hf_sampling, trl_packing=ns.trl_packing)
    if summary and int(os.environ.get("RANK", 0)) == 0:
        split = "  ".join(f"{k} {v:.0%}" for k, v in summary["time_split"].items())
        print(f"HF Trainer ({summary['sampling']}): loss {summary['first_loss']:.4f} → {summary['final_loss']:.4f}, "
              f"padding {summary['padding_rate']:.1%}, outputs in {summary['output_dir']}\n"
              + throughput_lines(summary) + f"time split      {split}")


if __name__ == "__main__":
    main()
