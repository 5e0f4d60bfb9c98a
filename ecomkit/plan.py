"""``python -m ecomkit.plan``: the chapter 06 planner's command line (kept as the documented entry point).

The planner lives in :mod:`ecomkit.planner`; this module only forwards to
:func:`ecomkit.planner.cli.main`, so ``python -m ecomkit.planner`` works too.
"""

from ecomkit.planner.cli import main

if __name__ == "__main__":
    main()
