"""The README's BACH tables are the ones the study wrote: `benchmarks/results/bach/`
holds the run's own `tables.md` (copied from `results/report/tables.md` of
`snakemake --cores all --configfile config/bach.yaml`), and every table row of it
stands in the README's BACH section as it is."""

from __future__ import annotations

from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
RUN_TABLES = REPO / "benchmarks" / "results" / "bach" / "tables.md"


def _table_rows(text: str) -> list[str]:
    return [line.strip() for line in text.splitlines() if line.strip().startswith("|")]


def test_readme_bach_tables_are_the_runs_own():
    readme = (REPO / "README.md").read_text(encoding="utf-8")
    assert "## A real study: BACH" in readme
    section = readme.split("## A real study: BACH", 1)[1].split("\n## ", 1)[0]
    rows = _table_rows(RUN_TABLES.read_text(encoding="utf-8"))
    assert len(rows) > 6, "the run's tables hold the variant rows"
    missing = [r for r in rows if r not in section]
    assert not missing, f"README's BACH section lacks {len(missing)} row(s) of the run's tables, e.g. {missing[0]}"
