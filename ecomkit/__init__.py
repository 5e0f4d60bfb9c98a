"""ecomkit: distributed fine-tuning of e-commerce BLOOM models, measured on your machine.

The package is built in floors; a module imports only from its own floor or
the floors below (``[tool.importlinter]`` in pyproject.toml, checked by
``lint-imports`` in ``make test``). Top to bottom:

- ``plan`` · ``predict``         the planner's and the predictor's command lines
- ``train`` · ``planner``        the one training loop, evaluation and sweep driver · memory/time planner
- ``parallel`` · ``faults``      one strategy per module behind ``Strategy`` · checkpoints, health, diagnosis
- ``models`` · ``envcheck``      BLOOM presets, attention, loss, tokenizer, optimizer · chapter 01 checks
- ``data``                       catalog generator, loaders, validation, task formats, samplers
- ground: ``errors``, ``config``, ``dist``, ``hardware``, ``metrics``, ``reporting``, ``launch``

The measurement lab (experiments, the claims ledger, figures) is the ``ecomlab`` package beside this one; ecomkit
never imports it. docs/architecture.md says what each floor holds and why.
"""

__version__ = "0.1.0"
