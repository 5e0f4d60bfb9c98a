"""ecomkit: distributed fine-tuning of e-commerce BLOOM models, measured on your machine.

Floors, top to bottom; a module imports only from its floor or below (``lint-imports`` checks it):

- ``plan`` · ``predict``         the planner's and the predictor's command lines
- ``train`` · ``planner``        the one training loop, evaluation and sweep driver · memory/time planner
- ``parallel`` · ``faults``      one strategy per module behind ``Strategy`` · checkpoints, health, diagnosis
- ``models`` · ``envcheck``      BLOOM presets, attention, loss, tokenizer, optimizer · chapter 01 checks
- ``data``                       catalog generator, loaders, validation, task formats, samplers
- ground: ``errors``, ``config``, ``dist``, ``hardware``, ``metrics``, ``reporting`` (dashboards), ``launch``
"""

__version__ = "0.1.0"
