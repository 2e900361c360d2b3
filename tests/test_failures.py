"""pathtwt.io.failures: one failures table per job."""

from __future__ import annotations

import pytest

from pathtwt.errors import PathtwtError
from pathtwt.io.failures import HEADER, failed_slides, read_failures, record_failure, write_failures


def test_record_and_read_back(tmp_path):
    table = tmp_path / "grading" / "failures.tsv"
    assert read_failures(table) == []
    record_failure(table, slide="s1", stage="extract", reason="cannot read tile\tat x=1,\ny=2", when="2026-01-01T00:00:00+00:00")
    record_failure(table, slide="s2", stage="tile", reason="")
    record_failure(table, slide="s1", stage="extract", reason="second try failed too")
    text = table.read_text()
    assert text.startswith(HEADER) and text.count(HEADER) == 1
    rows = read_failures(table)
    assert [r.slide for r in rows] == ["s1", "s2", "s1"]
    # tabs and newlines inside a reason are flattened so the table stays one row per failure
    assert rows[0].reason == "cannot read tile at x=1, y=2" and rows[0].time == "2026-01-01T00:00:00+00:00"
    assert rows[1].reason == "unknown" and rows[1].time.endswith("+00:00")
    assert failed_slides(table) == {"s1": "second try failed too", "s2": "unknown"}
    assert failed_slides(table, stage="tile") == {"s2": "unknown"}


def test_each_write_is_atomic_and_a_stray_partial_line_is_ignored(tmp_path):
    table = tmp_path / "failures.tsv"
    record_failure(table, slide="a", stage="extract", reason="r")
    assert not list(tmp_path.glob(".*"))  # no temporary or lock files left beside it
    with open(table, "a", encoding="utf-8") as fh:
        fh.write("b\textract\ttruncat")  # not written by this module, e.g. by hand
    assert [r.slide for r in read_failures(table)] == ["a"]
    record_failure(table, slide="c", stage="extract", reason="r")
    assert [r.slide for r in read_failures(table)] == ["a", "c"]
    assert table.read_text().endswith("\n") and "truncat" not in table.read_text()


def test_not_a_failures_table(tmp_path):
    table = tmp_path / "failures.tsv"
    table.write_text("slide,label\nx,1\n")
    with pytest.raises(PathtwtError, match="failures.tsv: not a failures table"):
        read_failures(table)
