"""The strategy-independent training loop (chapter 02) and its parts."""

from .loop import TrainingRun, run_training

__all__ = ["TrainingRun", "run_training"]
