"""The README's demo tables have the shape `pathtwt report --markdown` writes for the
demo config: per task the same header and the same rows (variant x head, reference rows
included, in order), between the command's marker lines, with the line that says which
commit and machine they came from. The numbers are pasted from a fresh run; this test
keeps the pasted tables from drifting away from what the command writes."""

from __future__ import annotations

from pathlib import Path

from pathtwt.config.check import load_and_check
from pathtwt.report.markdown import BEGIN, END, parse_tables
from pathtwt.report.tables import METRIC_LABELS, readme_layout

REPO = Path(__file__).resolve().parents[1]


def test_readme_demo_tables_have_the_rows_and_columns_the_command_writes():
    text = (REPO / "README.md").read_text(encoding="utf-8")
    assert text.count(BEGIN) == 1 and text.count(END) == 1, "the README holds one pasted `pathtwt report --markdown`"
    section = text.split(BEGIN, 1)[1].split(END, 1)[0]
    assert "Written by `pathtwt report --markdown`" in section and " at commit " in section and " on " in section
    tables = parse_tables(text)
    config, _ = load_and_check([REPO / "config" / "config.yaml"], require_slides=False)
    layout = readme_layout(config)
    assert layout, "the demo config has tasks"
    for task, (header, keys) in layout.items():
        metric = config["tasks"][task]["metric"]
        title = f"{task} ({METRIC_LABELS.get(metric, metric)})"
        assert title in tables, f"README lacks the table '#### {title}'"
        got_header, body = tables[title]
        assert got_header == header, f"{title}: columns differ from what the command writes"
        assert [(cells[1], cells[2]) for cells in body] == keys, f"{title}: rows differ from what the command writes"
        assert all(len(cells) == len(header) for cells in body), f"{title}: a row has the wrong number of cells"
