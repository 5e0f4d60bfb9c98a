"""Chapter 01: check the environment before training anything.

- :mod:`.system`      versions (Python, torch, CUDA, NCCL, HF libraries), devices, CPU threads
- :mod:`.lint`        environment variables known to hurt NCCL / torch.distributed jobs
- :mod:`.collectives` all-reduce correctness and an nccl-tests-style bandwidth sweep
- :mod:`.run`         all of it for one torchrun job, printed on rank 0 and written as JSON
"""

from ecomkit.envcheck.collectives import (
    AllReduceCheck,
    BandwidthRow,
    bus_bandwidth,
    check_all_reduce,
    format_bandwidth,
    measure_all_reduce_bandwidth,
    measure_local_copy_bandwidth,
    parse_size,
    size_range,
)
from ecomkit.envcheck.lint import Finding, MachineFacts, format_findings, lint_current_env, lint_env, probe_machine
from ecomkit.envcheck.system import format_report, library_versions, system_report
from ecomkit.envcheck.run import format_all_reduce, run_env_check

__all__ = [
    "AllReduceCheck", "BandwidthRow", "Finding", "MachineFacts", "bus_bandwidth", "check_all_reduce",
    "format_all_reduce", "format_bandwidth", "format_findings", "format_report", "library_versions",
    "lint_current_env", "lint_env", "measure_all_reduce_bandwidth", "measure_local_copy_bandwidth",
    "parse_size", "probe_machine", "run_env_check", "size_range", "system_report",
]
