"""The speed-ups of a training step, each with its flag; none changes what BLOOM computes, only how fast.

``attention`` (``--attn``), ``cpu_kernels`` (``--cpu-kernels``), ``gelu`` (``--fused-gelu``), ``compile``
(``--compile``) and ``shm_allreduce`` (``--ddp-allreduce shm``), installed by ``train.fast_paths.install_fast_paths``.
"""
