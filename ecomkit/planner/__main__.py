"""``python -m ecomkit.planner``: the same command line as ``python -m ecomkit.plan``."""

from ecomkit.planner.cli import main

if __name__ == "__main__":
    main()
