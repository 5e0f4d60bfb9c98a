"""The speed-ups of a training step, in one place; none changes what BLOOM computes, only how fast.

What lives here, each switched on by ``ecomkit.train.fast_paths.install_fast_paths`` (the loop's one call,
after the model is built and before a strategy wraps it) and each with its flag:

- ``attention``: BLOOM's attention as eager with a one-pass QKV split, SDPA or FlexAttention (``--attn``), with
  the bf16 softmax path of ``attention_lowp`` on a CPU; the modules' class is swapped, nothing else;
- ``cpu_kernels`` (``csrc/cpu_kernels.cpp``): ecomkit's AVX-512 GeLU and cross-entropy (``--cpu-kernels``);
- ``gelu``: BLOOM's GeLU as one kernel each way (``--fused-gelu``);
- ``compile``: one BLOOM block compiled and reused by every block, the head + loss apart (``--compile``);
- ``shm_allreduce``: DDP's gradient all-reduce through shared memory on one host (``--ddp-allreduce shm``).

The model code is transformers' BLOOM, and the step is its forward plus the loss (``ecomkit.models.loss``):
with every speed-up off (``--attn eager --no-fused-gelu --no-cpu-kernels``), it is exactly that.
"""
