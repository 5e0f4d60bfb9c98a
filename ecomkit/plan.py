"""``python -m ecomkit.plan``: the chapter 06 planner's command line, with the ``--verify`` twin runner.

The twin runner launches training scripts, so it is handed in here; ``python -m ecomkit.planner`` lacks ``--verify``.
"""

from ecomkit.planner.cli import main as _main
from ecomkit.planner.twins import verify_report


def main(argv: list[str] | None = None) -> None:
    _main(argv, verify=verify_report)


if __name__ == "__main__":
    main()
