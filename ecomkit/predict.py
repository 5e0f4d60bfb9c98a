"""``python -m ecomkit.predict``: a saved model answers classification or extraction prompts (see
:mod:`ecomkit.train.predict`, which this module forwards to)."""

from ecomkit.train.predict import main

if __name__ == "__main__":
    main()
