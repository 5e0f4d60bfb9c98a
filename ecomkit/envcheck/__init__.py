"""Chapter 01: check the environment before training anything.

- :mod:`.system`      versions (Python, torch, CUDA, NCCL, HF libraries), devices, CPU threads
- :mod:`.lint`        environment variables known to hurt NCCL / torch.distributed jobs
- :mod:`.collectives` all-reduce correctness and an nccl-tests-style bandwidth sweep
- :mod:`.matmul`      this machine's matmul rate per precision, and ``--precision auto``'s choice
- :mod:`.run`         all of it for one torchrun job, printed on rank 0 and written as JSON

Import from the modules; this package re-exports nothing, so a training run that asks for the precision
choice (:mod:`.matmul`) does not load the lint, the collective checks and the system report.
"""
