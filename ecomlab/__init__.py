"""ecomlab: the measurement lab beside ecomkit (chapter experiments, the claims ledger, figures, derived constants).

Why apart: training needs none of it, so ``ecomkit`` never imports ``ecomlab``
(an import-linter contract); ``ecomlab`` builds on ``ecomkit`` and on the
benchmark artifacts (:mod:`ecomlab.artifacts` says where they are).
"""
