"""The demo tables of the results page (docs/results.md) have the shape `pathtwt report
--markdown` writes for the demo config: per task the same header and the same rows
(variant x head, reference rows included, in order), between the command's marker lines,
with the line that says which commit and machine they came from. The numbers are pasted
from a fresh run; this test keeps the pasted tables from drifting away from what the
command writes. The page's comparisons (two machines' runs; two commits' runs on one
machine) are the output of benchmarks/compare_demo_tables.py on the files they name."""

from __future__ import annotations

import importlib.util
from pathlib import Path

from pathtwt.config.check import load_and_check
from pathtwt.report.markdown import BEGIN, END, parse_tables
from pathtwt.report.tables import METRIC_LABELS, readme_layout

REPO = Path(__file__).resolve().parents[1]


PAGE = REPO / "docs" / "results.md"


def test_results_page_demo_tables_have_the_rows_and_columns_the_command_writes():
    text = PAGE.read_text(encoding="utf-8")
    assert text.count(BEGIN) == 1 and text.count(END) == 1, "the results page holds one pasted `pathtwt report --markdown`"
    section = text.split(BEGIN, 1)[1].split(END, 1)[0]
    assert "Written by `pathtwt report --markdown`" in section and " at commit " in section and " on " in section
    tables = parse_tables(text)
    config, _ = load_and_check([REPO / "config" / "config.yaml"], require_slides=False)
    layout = readme_layout(config)
    assert layout, "the demo config has tasks"
    for task, (header, keys) in layout.items():
        metric = config["tasks"][task]["metric"]
        title = f"{task} ({METRIC_LABELS.get(metric, metric)})"
        assert title in tables, f"docs/results.md lacks the table '#### {title}'"
        got_header, body = tables[title]
        assert got_header == header, f"{title}: columns differ from what the command writes"
        assert [(cells[1], cells[2]) for cells in body] == keys, f"{title}: rows differ from what the command writes"
        assert all(len(cells) == len(header) for cells in body), f"{title}: a row has the wrong number of cells"


def _compare_module():
    spec = importlib.util.spec_from_file_location("compare_demo_tables", REPO / "benchmarks" / "compare_demo_tables.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _pasted(marker: str) -> str:
    text = PAGE.read_text(encoding="utf-8")
    begin, end = f"<!-- {marker}: begin -->", f"<!-- {marker}: end -->"
    assert text.count(begin) == 1 and text.count(end) == 1, f"docs/results.md holds one {marker} block"
    return text.split(begin, 1)[1].split(end, 1)[0].strip()


def test_results_page_machine_comparison_is_the_scripts_output():
    module = _compare_module()
    results = REPO / "benchmarks" / "results"
    records = module.compare(results / "demo_bc55459" / "tables.md", results / "demo_avx2_fp32" / "tables.md")
    assert _pasted("compare_demo_tables") == module.markdown(records).strip(), \
        "rerun benchmarks/compare_demo_tables.py and paste its table"
    # the page's statements: the descriptive and chance cells are exact, the result cells are not
    by_kind = {(r["table"], r["kind"]): r for r in records}
    assert by_kind[("grading (QWK)", "references")]["max_change"] == 0
    assert by_kind[("grading (QWK)", "teacher")]["same"] < by_kind[("grading (QWK)", "teacher")]["cells"]
    assert max(r["max_change"] for r in records) <= 0.125 + 1e-9


def test_results_page_commit_comparison_is_the_scripts_output_and_finds_no_change():
    module = _compare_module()
    records = module.compare(REPO / "benchmarks" / "results" / "demo_cd6f407" / "tables.md", PAGE)
    assert _pasted("compare_demo_commits") == module.markdown(records).strip(), \
        "rerun benchmarks/compare_demo_tables.py and paste its table"
    # the page says every result cell is the same: the demo's outputs did not move between the commits
    assert records and all(r["same"] == r["cells"] for r in records), records
