"""The record of the single-split BACH study (`benchmarks/studies/results/bach/README.md`) holds
the tables the study wrote: `benchmarks/studies/results/bach/tables.md` is the run's own
`results/report/tables.md` (of `snakemake --cores all --configfile config/bach.yaml`), and
every table row of it stands in the record as it is."""

from __future__ import annotations

from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
RUN = REPO / "benchmarks" / "studies" / "results" / "bach"


def _table_rows(text: str) -> list[str]:
    return [line.strip() for line in text.splitlines() if line.strip().startswith("|")]


def test_bach_record_tables_are_the_runs_own():
    record = (RUN / "README.md").read_text(encoding="utf-8")
    rows = _table_rows((RUN / "tables.md").read_text(encoding="utf-8"))
    assert len(rows) > 6, "the run's tables hold the variant rows"
    missing = [r for r in rows if r not in record]
    assert not missing, f"the BACH record lacks {len(missing)} row(s) of the run's tables, e.g. {missing[0]}"
