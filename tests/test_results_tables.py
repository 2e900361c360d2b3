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
    bf16, avx2 = results / "demo_bf16_cf01c9a" / "tables.md", results / "demo_avx2_fp32_cf01c9a" / "tables.md"
    records = module.compare(bf16, avx2)
    assert _pasted("compare_demo_tables") == module.markdown(records).strip(), \
        "rerun benchmarks/compare_demo_tables.py and paste its table"
    assert _pasted("compare_demo_metrics") == module.markdown_by_metric(module.by_metric(bf16, avx2)).strip()
    names = (bf16.parent.name, avx2.parent.name)
    assert _pasted("compare_demo_flips") == module.markdown_flips(module.flips(bf16, avx2), names).strip()
    machine = module.compare(results / "demo_bc55459" / "tables.md", results / "demo_avx2_fp32" / "tables.md")
    assert _pasted("compare_demo_tables_avx2_machine") == module.markdown(machine).strip()
    # the page's statements: the chance cells are exact, the result cells are not
    by_kind = {(r["table"], r["kind"]): r for r in records}
    assert by_kind[("grading (QWK)", "references")]["max_change"] == 0
    assert by_kind[("grading (QWK)", "teacher")]["same"] < by_kind[("grading (QWK)", "teacher")]["cells"]


def _stated_bounds() -> dict[tuple[str, str], float]:
    """(head, metric family) -> the bound the page states for a cell's move between machines."""
    lines = [line for line in _pasted("stated bounds").splitlines() if line.startswith("| ") and "---" not in line]
    header = [c.strip() for c in lines[0].strip("|").split("|")]
    out = {}
    for line in lines[1:]:
        cells = [c.strip() for c in line.strip("|").split("|")]
        for family, value in zip(header[1:], cells[1:]):
            out[(cells[0], family)] = float(value)
    return out


def _family(metric: str) -> str:
    return {"QWK": "QWK or Acc", "Acc": "QWK or Acc", "BAcc": "BAcc", "AUC": "AUC"}.get(metric, "paired Δ")


def test_results_page_claims_no_less_spread_than_the_stored_comparisons_show():
    """Every head and metric of both stored machine comparisons (this CPU held to AVX2, and
    the real AVX2 machine) moved by no more than the page's bound for it, and each bound is
    reached to within 0.1 by some stored move or by the unstored AVX2 run the page quotes
    (0.417 for meanpool): the bounds neither hide spread nor inflate it."""
    module = _compare_module()
    results = REPO / "benchmarks" / "results"
    bounds = _stated_bounds()
    assert {head for head, _ in bounds} == {"abmil", "transmil", "meanpool"}
    seen: dict[tuple[str, str], float] = {}
    for a, b in (("demo_bf16_cf01c9a", "demo_avx2_fp32_cf01c9a"), ("demo_bc55459", "demo_avx2_fp32")):
        for r in module.by_metric(results / a / "tables.md", results / b / "tables.md"):
            key = (r["head"], _family(r["metric"]))
            assert r["max_change"] <= bounds[key] + 1e-9, (a, b, r)
            seen[key] = max(seen.get(key, 0.0), r["max_change"])
    seen[("meanpool", "QWK or Acc")] = max(seen[("meanpool", "QWK or Acc")], 0.417)
    for key, bound in bounds.items():
        assert bound - seen[key] <= 0.1, (key, bound, seen[key])
    assert "0.417" in PAGE.read_text(encoding="utf-8")


def test_meanpool_choices_are_the_stored_runs():
    """The page says one meanpool choice of C differs between the two runs of cf01c9a: the
    stored choices say so too."""
    import json

    results = REPO / "benchmarks" / "results"
    a = json.loads((results / "demo_bf16_cf01c9a" / "meanpool_C.json").read_text())
    b = json.loads((results / "demo_avx2_fp32_cf01c9a" / "meanpool_C.json").read_text())
    assert a.keys() == b.keys() and len(a) == 12
    differ = {k for k in a if a[k] != b[k]}
    assert differ == {"twt-4/metastasis/seed0", "twt-4/metastasis/seed1"}
    assert a["twt-6/metastasis/seed0"] == b["twt-6/metastasis/seed0"] == 0.001


def test_results_page_commit_comparison_is_the_scripts_output_and_finds_no_change():
    module = _compare_module()
    records = module.compare(REPO / "benchmarks" / "results" / "demo_cd6f407" / "tables.md", PAGE)
    assert _pasted("compare_demo_commits") == module.markdown(records).strip(), \
        "rerun benchmarks/compare_demo_tables.py and paste its table"
    # the page says every result cell is the same: the demo's outputs did not move between the commits
    assert records and all(r["same"] == r["cells"] for r in records), records


def test_the_native_tile_reader_runs_have_every_cell_of_their_counterparts():
    """The page says the two runs with the native-tile reader (bf16, and held to AVX2)
    have every result cell of the runs at cf01c9a on the same machine: the stored tables
    say so too."""
    module = _compare_module()
    results = REPO / "benchmarks" / "results"
    for before, after in (("demo_bf16_cf01c9a", "demo_bf16_21d7917"), ("demo_avx2_fp32_cf01c9a", "demo_avx2_fp32_4d94c18")):
        records = module.compare(results / before / "tables.md", results / after / "tables.md")
        assert records and all(r["same"] == r["cells"] for r in records), (before, after, records)
    assert "every result cell of each\nof the native-tile reader's runs is the same as its counterpart at cf01c9a" in \
        PAGE.read_text(encoding="utf-8")


def test_the_gpu_fed_data_path_run_has_every_cell_of_the_native_tile_readers():
    """The page says the demo with the GPU-fed data path (a72522b) has every result cell of
    the native-tile reader's run at 21d7917: the stored tables say so too."""
    module = _compare_module()
    results = REPO / "benchmarks" / "results"
    records = module.compare(results / "demo_bf16_21d7917" / "tables.md", results / "demo_bf16_a72522b" / "tables.md")
    assert records and all(r["same"] == r["cells"] for r in records), records
    assert "every result cell of the GPU-fed data path's run is the same as at\n21d7917" in PAGE.read_text(encoding="utf-8")


def test_the_store_run_has_every_cell_of_the_code_before_it_on_the_same_machine():
    """The page says the demo with the store (9779b5d) and the code before it (4109442), run
    one after the other on one AMX machine, agree in every result cell: the stored tables
    say so too."""
    module = _compare_module()
    results = REPO / "benchmarks" / "results"
    records = module.compare(results / "demo_amx_4109442" / "tables.md", results / "demo_amx_9779b5d" / "tables.md")
    assert records and all(r["same"] == r["cells"] for r in records), records
    assert "every result cell of the\nrun with the store" in PAGE.read_text(encoding="utf-8")
