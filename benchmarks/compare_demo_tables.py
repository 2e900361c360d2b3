"""Cell-by-cell comparison of two `pathtwt report --markdown` outputs of the same config,
e.g. the demo run on two machines. Prints, per table and kind of row (the teacher,
the compressed students, the reference rows), how many result cells are the same in both
and the largest change of a cell's first number, as a Markdown table.

    python benchmarks/compare_demo_tables.py docs/results.md benchmarks/results/demo_avx2_fp32/tables.md

Rows are matched on (backbone, variant, head) and the columns by name; a cell's first
number is its mean (the text before ±, or the value). Columns that describe a row rather
than measure it (precision, tiles/s, parameters, MACs, slide and tile counts) are left out.
"""

from __future__ import annotations

import argparse
import re
from pathlib import Path

NUMBER = re.compile(r"[-+]?\d+\.\d+|[-+]?\d+")


def read_tables(path: Path) -> dict[str, tuple[list[str], list[list[str]]]]:
    """Title -> (header, rows) of the tables between the report's marker lines of ``path``."""
    from pathtwt.report.markdown import BEGIN, END, parse_tables

    text = path.read_text(encoding="utf-8")
    if BEGIN in text:
        text = BEGIN + text.split(BEGIN, 1)[1].split(END, 1)[0] + END
    return parse_tables(text)


def first_number(cell: str) -> float | None:
    match = NUMBER.search(cell.replace("−", "-"))
    return float(match.group()) if match else None


DESCRIPTIVE = ("Extracted", "Distilled", "tiles/s", "Params (M)", "GMACs", "Slides ", "Report tiles")
KINDS = ("teacher", "students", "references")


def row_kind(variant: str) -> str:
    if "teacher" in variant and "reference" not in variant:
        return "teacher"
    if "reference" in variant or "floor" in variant:
        return "references"
    return "students"


def compare(a: Path, b: Path) -> list[dict]:
    """One record per (table, kind of row) that both files hold: result cells compared,
    cells the same, the largest change of a cell's first number, and where it is."""
    ta, tb = read_tables(a), read_tables(b)
    out = []
    for title in [t for t in ta if t in tb]:
        (head_a, rows_a), (head_b, rows_b) = ta[title], tb[title]
        key_cols = [i for i, h in enumerate(head_a) if h in ("Backbone", "Variant", "Head")]
        variant_col = head_a.index("Variant")
        key = lambda cells: tuple(cells[i] for i in key_cols)  # noqa: E731
        rows_b_by_key = {key(r): r for r in rows_b}
        columns = [(j, head_b.index(h)) for j, h in enumerate(head_a)
                   if j not in key_cols and h in head_b and not h.startswith(DESCRIPTIVE)]
        for kind in KINDS:
            pairs = [(r, rows_b_by_key[key(r)]) for r in rows_a
                     if key(r) in rows_b_by_key and row_kind(r[variant_col]) == kind]
            cells = [(ra[j], rb[jb], " ".join(ra[i] for i in key_cols[1:]) + ", " + head_a[j])
                     for ra, rb in pairs for j, jb in columns]
            cells = [(x, y, where) for x, y, where in cells if first_number(x) is not None]
            if not cells:
                continue
            change, where = max(
                ((abs(first_number(x) - first_number(y)) if first_number(y) is not None else float("inf"), w)
                 for x, y, w in cells),
                key=lambda t: t[0],
            )
            out.append({"table": title, "kind": kind, "cells": len(cells),
                        "same": sum(x == y for x, y, _ in cells), "max_change": change,
                        "where": where if change > 0 else ""})
    return out


def markdown(records: list[dict]) -> str:
    lines = ["| table | rows | result cells | the same | largest change | in |", "|---|---|---|---|---|---|"]
    for r in records:
        lines.append(f"| {r['table']} | {r['kind']} | {r['cells']} | {r['same']} | {r['max_change']:.3f} | {r['where']} |")
    return "\n".join(lines) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("a", type=Path, help="a file holding `pathtwt report --markdown` output")
    parser.add_argument("b", type=Path, help="another such file, of the same config")
    args = parser.parse_args()
    print(markdown(compare(args.a, args.b)), end="")


if __name__ == "__main__":
    main()
