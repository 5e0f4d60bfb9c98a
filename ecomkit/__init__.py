"""ecomkit: distributed fine-tuning of e-commerce BLOOM models, measured on your machine.

Its floors (a module imports only from its floor or below; ``lint-imports`` checks it): docs/architecture.md.
"""

from typing import Any

__version__ = "0.1.0"


def find(target: str) -> Any:
    """``"module:name"``'s object, or ``"module"`` itself, imported now through ``__import__``.

    Why one finder on every floor: what only a flag needs is imported by name, so ``-X importtime`` counts it.
    """
    module, _, name = target.partition(":")
    found = __import__(module, fromlist=[name or "__name__"])
    return getattr(found, name) if name else found
