"""``python -m ecomkit.predict``: forwards to :mod:`ecomkit.train.predict`."""

from ecomkit.train.predict import main

if __name__ == "__main__":
    main()
