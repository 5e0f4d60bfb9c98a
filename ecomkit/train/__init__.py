"""The strategy-independent training loop (chapter 02) and its parts."""

from ecomkit.train.loop import TrainingRun, run_training

__all__ = ["TrainingRun", "run_training"]
