"""Regenerate docs/rules.md's op table from the OpInfo differential (gpusync/devtools/opdb.py).

    python scripts/op_table.py                # run the differential, rewrite the table
    python scripts/op_table.py --check        # exit 1 if the committed table is stale
    python scripts/op_table.py --ops nonzero  # those ops only: print, write nothing

The table carries the test's budget (opdb.CI), so tests/trust/test_opdb_differential.py can
check it is current. Run with one BLAS thread, as the tests do:
OMP_NUM_THREADS=1 MKL_NUM_THREADS=1.
"""
from __future__ import annotations

import argparse
import pathlib
import sys

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1]))

from gpusync.devtools import opdb, opdb_table  # noqa: E402
from gpusync.devtools.opdb_known import KNOWN  # noqa: E402


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="only check the committed table")
    parser.add_argument("--ops", nargs="+", metavar="NAME",
                        help="run these ops only; print their rows and differences")
    args = parser.parse_args()
    ops = opdb.op_db()
    if args.ops:
        ops = [op for op in ops if opdb.op_name(op) in args.ops]
    results = opdb.run(ops)
    unexplained = [r for r in results if r.differences and r.name not in KNOWN]
    for r in unexplained:
        print(f"{r.name}: " + "\n    ".join(r.differences[:5]), file=sys.stderr)
    if args.ops:
        for r in results:
            print(f"{r.name}: {opdb_table.verdict(r)} | {opdb_table.outcome(r)}")
        return 1 if unexplained else 0
    section = opdb_table.render(results)
    if args.check:
        stale = section != opdb_table.committed()
        print("docs/rules.md: the op table is " + ("stale" if stale else "current"),
              file=sys.stderr)
        return 1 if stale else 0
    opdb_table.write(section)
    print(f"docs/rules.md: op table written ({len(results)} ops, {len(unexplained)} "
          "unexplained differences)", file=sys.stderr)
    return 1 if unexplained else 0


if __name__ == "__main__":
    sys.exit(main())
