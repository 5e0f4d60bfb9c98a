"""ecomkit: distributed fine-tuning of e-commerce BLOOM models, measured on your machine.

The package is organised so that every chapter of the learning path finds its
code in one module:

- ``ecomkit.data``      catalog generator, loaders, validation, task formats, samplers
- ``ecomkit.models.tokenizer`` a byte-level BPE trained locally, with e-commerce special tokens
- ``ecomkit.models.bloom``    BLOOM presets, meta-device parameter counts, ``load_model``
- ``ecomkit.dist``      torchrun environment, process group set-up and teardown
- ``ecomkit.config``    the one training config dataclass, presets and CLI
- ``ecomkit.train``     the strategy-independent training loop and its metrics
- ``ecomkit.parallel``  one ``apply_*`` / ``build_*`` per strategy (DDP, ZeRO, FSDP2, TP, PP, compression)
"""

__version__ = "0.1.0"
