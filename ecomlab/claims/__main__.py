"""``python -m ecomlab.claims [--check]``: render docs/claims.md and the README's counts from the ledger."""

from __future__ import annotations

import argparse
import sys

from ecomkit.errors import ConfigError, exit_on_user_error
from ecomlab.artifacts import RESULTS_ENV
from ecomlab.claims import ledger_rows, verdict_counts
from ecomlab.claims.render import PAGE, README, render_page, render_readme, stale


@exit_on_user_error
def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m ecomlab.claims", description=__doc__)
    ap.add_argument("--check", action="store_true",
                    help="write nothing; exit 1 when docs/claims.md or the README's counts differ from the ledger")
    ap.add_argument("--results", metavar="DIR", default=None,
                    help=f"folder of benchmark artifacts (default: ${RESULTS_ENV} if set, else the repository's "
                         "benchmarks/results)")
    args = ap.parse_args(argv)
    if not README.is_file():
        raise ConfigError(f"python -m ecomlab.claims renders docs/claims.md and the README's counts of an ecomkit "
                          f"checkout, and there is none around this package ({README} is missing): run it in a clone. "
                          "The rows themselves: ecomlab.claims.ledger_rows(results_dir).")
    rows = ledger_rows(args.results)
    counts = verdict_counts(rows)
    page, readme = render_page(rows, counts), render_readme(README.read_text(), counts)
    if args.check:
        bad = stale(page, readme)
        if bad:
            print(f"stale: {', '.join(bad)} differ from what the ledger computes now; run python -m ecomlab.claims "
                  "and commit the result", file=sys.stderr)
            return 1
        print(f"claims: {len(rows)} rows, docs/claims.md and README counts are current")
        return 0
    PAGE.parent.mkdir(parents=True, exist_ok=True)
    PAGE.write_text(page)
    README.write_text(readme)
    print(f"wrote {PAGE} ({len(rows)} claims) and the README's counts: "
          + ", ".join(f"{v} {n}" for v, n in counts.items()))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
