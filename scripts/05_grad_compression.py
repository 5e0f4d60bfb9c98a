#!/usr/bin/env python
"""Chapter 05: gradient compression as DDP communication hooks, bytes counted per step.

Same loop and flags as chapter 02; new here are the --compression-* flags,
--methods (several methods in one launch) and --mode overlap.

  # one method (flags derived from ecomkit.config.CompressionConfig)
  torchrun --standalone --nproc_per_node 2 scripts/05_grad_compression.py \\
      --compression-method topk --compression-topk-ratio 0.01
  torchrun --standalone --nproc_per_node 2 scripts/05_grad_compression.py \\
      --compression-method powersgd --compression-powersgd-rank 4 --compression-powersgd-start-iter 10
  # several methods, one process group, one folder each under --output-dir
  torchrun --standalone --nproc_per_node 2 scripts/05_grad_compression.py --task nlu \\
      --methods none,fp16,bf16,powersgd:1,powersgd:4,topk:0.01,topk:0.01:noef,topk_naive:0.25
  # how much communication DDP hides behind backward, per bucket size, and the guide's un-waited all-reduce
  torchrun --standalone --nproc_per_node 2 scripts/05_grad_compression.py --mode overlap \\
      --model small --overlap-bucket-mb 0.25,1,4,25 --async-steps 5

Method specs: none | plain | fp16 | bf16 | powersgd[:RANK][:noef] | topk[:RATIO][:noef] | topk_naive[:RATIO].
Every metrics row gets comm_bytes (what this rank handed to collectives),
comm_bytes_dense (what an fp32 all-reduce would have sent) and compression_ratio.
With one process there is no DDP: compression does nothing and says so.
"""

import argparse
from pathlib import Path

from ecomkit.config import TrainConfig, parse_config
from ecomkit.dist import read_torchrun_env
from ecomkit.errors import exit_on_user_error
from ecomkit.metrics import print_run_summary
from ecomkit.parallel.compression.specs import parse_methods, spec_from_config
from ecomlab.measure.compression import train_methods
from ecomlab.measure.overlap import parse_bucket_sizes, run_overlap_study


def extra_flags(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--methods", default=None,
                        help="comma-separated method specs, trained one after another in this launch; "
                             "each writes to <output-dir>/<spec with ':' as '-'>")
    parser.add_argument("--mode", choices=("train", "overlap"), default="train",
                        help="overlap: bucket_cap_mb sweep and the async all-reduce demo instead of training")
    parser.add_argument("--overlap-bucket-mb", default="0.25,1,4,25", help="bucket sizes (MB) to sweep")
    parser.add_argument("--overlap-repeats", type=int, default=5, help="timed repeats per bucket size")
    parser.add_argument("--async-steps", type=int, default=5, help="steps of the guide's async all-reduce (0: skip)")


def chapter_defaults() -> TrainConfig:
    """TrainConfig's defaults at fp32: chapter 05 compares each hook's run with plain all-reduce, step for step,
    and a bf16 autocast would put its own rounding beside the compression's."""
    return TrainConfig(precision="fp32")


@exit_on_user_error
def main(argv: list[str] | None = None) -> None:
    cfg, ns = parse_config(argv, description=__doc__, defaults=chapter_defaults(), extra=extra_flags)
    if ns.mode == "overlap":
        out = Path(cfg.output_dir) / "overlap.json"
        run_overlap_study(cfg, parse_bucket_sizes(ns.overlap_bucket_mb), ns.overlap_repeats, ns.async_steps, out)
        return
    specs = parse_methods(ns.methods) if ns.methods else [spec_from_config(cfg)]
    for summary in train_methods(cfg, specs, subdirs=bool(ns.methods)):
        if read_torchrun_env()[0] == 0:
            print(f"\n--- {summary['method_title']}  ({summary['method_spec']})", flush=True)
        print_run_summary(summary)


if __name__ == "__main__":
    main()
