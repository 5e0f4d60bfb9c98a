"""ecomkit: distributed fine-tuning of e-commerce BLOOM models, measured on your machine.

Its floors (a module imports only from its floor or below; ``lint-imports`` checks it): docs/architecture.md.
"""

__version__ = "0.1.0"
