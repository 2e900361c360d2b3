"""Cell-by-cell comparison of two `pathtwt report --markdown` outputs of the same config,
e.g. the demo run on two machines. Prints, per table and kind of row (the teacher,
the compressed students, the reference rows), how many result cells are the same in both
and the largest change of a cell's first number, as a Markdown table.

    python benchmarks/compare_demo_tables.py docs/results.md benchmarks/results/demo_avx2_fp32/tables.md
    python benchmarks/compare_demo_tables.py A B --by-metric      # per head and metric, and the Δ that flip
    python benchmarks/compare_demo_tables.py --choices results --json out.json   # meanpool's chosen C per run

Rows are matched on (backbone, variant, head) and the columns by name; a cell's first
number is its mean (the text before ±, or the value). Columns that describe a row rather
than measure it (precision, tiles/s, parameters, MACs, slide and tile counts) are left out.

Measures: no time: how many result cells of two `pathtwt report --markdown` outputs of one config are the
same, per table and kind of row, and the largest change of a cell's first number; with --choices, the C each
meanpool head chose in a results folder.
Command: `PYTHONPATH=$PWD .venv/bin/python benchmarks/compare_demo_tables.py
benchmarks/results/demo_bf16_a72522b/tables.md benchmarks/results/demo_bf16_21d7917/tables.md` (smallest);
`... A B --by-metric`; `... --choices RESULTS --json out.json`.
JSON keys: with --choices only: `variant/task/seedN` -> the C meanpool's head chose (the comparisons print
Markdown).
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


MIL_TABLES = ("grading (QWK)", "metastasis (Acc)")
INTERVAL = re.compile(r"\[([-+]?\d+\.\d+), ([-+]?\d+\.\d+)\]")


def _mil_cells(path: Path):
    """(table, head, variant, column, cell) of every result cell of the MIL tables of ``path``."""
    for title, (header, rows) in read_tables(path).items():
        if title not in MIL_TABLES:
            continue
        v, h = header.index("Variant"), header.index("Head")
        for row in rows:
            for j, column in enumerate(header):
                if j not in (0, v, h) and not column.startswith(DESCRIPTIVE) and first_number(row[j]) is not None:
                    yield title, row[h], row[v], column, row[j]


def metric_of(column: str) -> str:
    """The metric a MIL column measures, without its cohort: QWK, Acc, BAcc, AUC, ΔQWK, ΔAcc."""
    return column.split(" ", 1)[0]


def by_metric(a: Path, b: Path) -> list[dict]:
    """One record per (table, head, metric) of the MIL tables, students and teacher rows
    together (reference rows are exact by construction): cells, the same, the largest
    change of a cell's mean and where it is."""
    cells_b = {(t, hd, var, col): cell for t, hd, var, col, cell in _mil_cells(b)}
    groups: dict[tuple[str, str, str], list[tuple[float, str, bool]]] = {}
    for t, hd, var, col, cell in _mil_cells(a):
        other = cells_b.get((t, hd, var, col))
        if other is None or row_kind(var) == "references" or first_number(other) is None:
            continue
        change = abs(first_number(cell) - first_number(other))
        groups.setdefault((t, hd, metric_of(col)), []).append((change, f"{var}, {col}", cell == other))
    out = []
    for (t, hd, metric), cells in groups.items():
        change, where, _ = max(cells, key=lambda c: c[0])
        out.append({"table": t, "head": hd, "metric": metric, "cells": len(cells),
                    "same": sum(same for *_, same in cells), "max_change": change, "where": where if change > 0 else ""})
    return out


def side_of_zero(cell: str) -> str:
    """Where a paired Δ's interval lies: above 0, below 0, or across it."""
    match = INTERVAL.search(cell.replace("−", "-"))
    if not match:
        return ""
    lo, hi = float(match.group(1)), float(match.group(2))
    return "above 0" if lo > 0 else "below 0" if hi < 0 else "across 0"


def flips(a: Path, b: Path) -> list[dict]:
    """The paired Δ cells whose interval lies on another side of 0 in ``b`` than in ``a``:
    the conclusions that change between the two runs."""
    cells_b = {(t, hd, var, col): cell for t, hd, var, col, cell in _mil_cells(b)}
    out = []
    for t, hd, var, col, cell in _mil_cells(a):
        other = cells_b.get((t, hd, var, col), "")
        if col.startswith("Δ") and side_of_zero(cell) and side_of_zero(other) and side_of_zero(cell) != side_of_zero(other):
            out.append({"table": t, "head": hd, "variant": var, "column": col, "a": cell, "b": other})
    return out


def meanpool_choices(results: Path) -> dict[str, float]:
    """variant/task/seedN -> the C meanpool's head chose on its validation slides, from
    every ``mil/*/*/*/meanpool/seed*/metrics.json`` under ``results``."""
    import json

    out = {}
    for metrics in sorted(results.glob("mil/*/*/*/meanpool/seed*/metrics.json")):
        seed, _, task, variant = metrics.parts[-2], metrics.parts[-3], metrics.parts[-4], metrics.parts[-5]
        out[f"{variant}/{task}/{seed}"] = json.loads(metrics.read_text())["selection"]["C"]
    return out


def markdown_by_metric(records: list[dict]) -> str:
    lines = ["| table | head | metric | cells | the same | largest change | in |", "|---|---|---|---|---|---|---|"]
    for r in records:
        lines.append(f"| {r['table']} | {r['head']} | {r['metric']} | {r['cells']} | {r['same']} | "
                     f"{r['max_change']:.3f} | {r['where']} |")
    return "\n".join(lines) + "\n"


def markdown_flips(records: list[dict], names: tuple[str, str]) -> str:
    lines = [f"| table | row | Δ column | {names[0]} | {names[1]} |", "|---|---|---|---|---|"]
    for r in records:
        lines.append(f"| {r['table']} | {r['variant']} {r['head']} | {r['column']} | {r['a']} | {r['b']} |")
    return "\n".join(lines) + "\n"


def markdown(records: list[dict]) -> str:
    lines = ["| table | rows | result cells | the same | largest change | in |", "|---|---|---|---|---|---|"]
    for r in records:
        lines.append(f"| {r['table']} | {r['kind']} | {r['cells']} | {r['same']} | {r['max_change']:.3f} | {r['where']} |")
    return "\n".join(lines) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("a", type=Path, nargs="?", help="a file holding `pathtwt report --markdown` output")
    parser.add_argument("b", type=Path, nargs="?", help="another such file, of the same config")
    parser.add_argument("--by-metric", action="store_true",
                        help="per MIL head and metric instead of per table, then the paired Δ that change sides of 0")
    parser.add_argument("--choices", type=Path, metavar="RESULTS",
                        help="print the C each meanpool head chose, read from a results folder")
    parser.add_argument("--json", type=Path, help="with --choices: also write them to this JSON file")
    args = parser.parse_args()
    if args.choices:
        import json

        choices = meanpool_choices(args.choices)
        if not choices:
            parser.error(f"{args.choices}: no mil/*/*/*/meanpool/seed*/metrics.json under it; name a results folder")
        text = json.dumps(choices, indent=1, sort_keys=True) + "\n"
        if args.json:
            from pathtwt.io.atomic import write_text_atomic

            write_text_atomic(args.json, text)
        print(text, end="")
        return
    if args.a is None or args.b is None:
        parser.error("name two files of `pathtwt report --markdown` output, or --choices RESULTS")
    if args.by_metric:
        print(markdown_by_metric(by_metric(args.a, args.b)), end="")
        print()
        print(markdown_flips(flips(args.a, args.b), (args.a.parent.name, args.b.parent.name)), end="")
        return
    print(markdown(compare(args.a, args.b)), end="")


if __name__ == "__main__":
    main()
