"""``python -m ecomkit.plan``: the chapter 06 planner's command line (kept as the documented entry point).

The planner lives in :mod:`ecomkit.planner`; this module forwards to
:func:`ecomkit.planner.cli.main` and gives it the twin runner for
``--verify`` (:func:`ecomkit.measure.plan_twins.verify_report`), which
launches training scripts and so lives above the planner. ``python -m
ecomkit.planner`` plans and recommends too, without ``--verify``.
"""

from ecomkit.measure.plan_twins import verify_report
from ecomkit.planner.cli import main as _main


def main(argv: list[str] | None = None) -> None:
    _main(argv, verify=verify_report)


if __name__ == "__main__":
    main()
