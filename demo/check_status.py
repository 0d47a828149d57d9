"""Hold the demo's final status table to what the demo did: every row committed, published, verified and
pruned (the demo prunes every artifact it published), with nothing to explain in those columns.

    python demo/check_status.py STATUS_JSON

STATUS_JSON is the status target's ``reports_dir/status.json`` (schemas/report_status.schema.json). Prints
one line per row that is not clean, naming the row, the column, its state and why; exits 1 when there is
one (or no row at all), 0 otherwise.
"""

from __future__ import annotations

import json
import sys

# column -> the state a clean row of the demo has there
EXPECTED = {"local": "committed", "published": "receipt", "verified": "verified", "pruned": "pruned"}


def problems(report: dict) -> list[str]:
    """One line per column of a row that is not what the demo leaves, or holds a detail to explain."""
    found = []
    for row in report["rows"]:
        for column, expected in EXPECTED.items():
            cell = row[column]
            stale = column == "verified" and cell.get("stale")
            if cell["state"] != expected or stale or cell.get("detail"):
                why = f": {cell['detail']}" if cell.get("detail") else ""
                found.append(f"{row['run']} {row['name']}: {column} is {cell['state']}"
                             f"{' (stale)' if stale else ''}, expected {expected}{why}")
    return found


def main(argv: list[str]) -> int:
    if len(argv) != 1:
        print(__doc__.split("\n\n")[1], file=sys.stderr)
        return 2
    with open(argv[0], encoding="utf-8") as fh:
        report = json.load(fh)
    found = problems(report) if report["rows"] else [f"{argv[0]}: the status table has no row"]
    for line in found:
        print(f"  not clean: {line}", file=sys.stderr)
    if found:
        print(f"the status table has {len(found)} problem(s); see the rows above and {argv[0]}", file=sys.stderr)
        return 1
    counts = report["counts"]
    print(f"  status: {counts['iterations']} rows committed, published, verified and pruned", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
