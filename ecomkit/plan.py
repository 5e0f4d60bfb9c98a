"""``python -m ecomkit.plan``: the chapter 06 planner's command line (kept as the documented entry point).

The planner lives in :mod:`ecomkit.planner`; this module forwards to
:func:`ecomkit.planner.cli.main` and gives it the twin runner for
``--verify`` (:func:`ecomkit.planner.twins.verify_report`), which launches
training scripts. ``python -m ecomkit.planner`` plans and recommends too,
without ``--verify``.
"""

from ecomkit.planner.cli import main as _main
from ecomkit.planner.twins import verify_report


def main(argv: list[str] | None = None) -> None:
    _main(argv, verify=verify_report)


if __name__ == "__main__":
    main()
