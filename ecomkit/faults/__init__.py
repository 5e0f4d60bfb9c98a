"""Chapter 07: faults. What a long job on many GPUs meets, and what survives it.

Checkpoints, safe loading, health monitoring, callbacks, the error catalogue, reproductions and diagnosis, one module
each; this package re-exports nothing.
"""
