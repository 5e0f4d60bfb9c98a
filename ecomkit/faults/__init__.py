"""Chapter 07: faults. What a long job on many GPUs meets, and what survives it.

- :mod:`~ecomkit.faults.checkpoint`: DCP checkpoints, atomic ``step_*`` directories, async saves, run state;
- :mod:`~ecomkit.faults.safe_load`: loading checkpoints without unpickling code;
- :mod:`~ecomkit.faults.health`: the health monitor (NVML or CPU/RAM), stragglers, the hang watchdog;
- :mod:`~ecomkit.faults.callbacks`: save/resume during training, and
  :func:`~ecomkit.faults.callbacks.add_fault_tolerance_callbacks`, which the training loop calls;
- :mod:`~ecomkit.faults.known_errors`: the catalogue of errors, and explained collective timeouts;
- :mod:`~ecomkit.faults.reproduce`: the catalogue's CPU-reproducible errors, provoked for real;
- :mod:`~ecomkit.faults.diagnose`: the pre-flight check, the stall demo, a resumed run against an uninterrupted one.

Import from the modules; this package re-exports nothing.
"""
