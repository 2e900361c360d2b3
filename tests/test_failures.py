"""pathtwt.io.failures: the per-cohort failures.tsv, appended by concurrent jobs."""

from __future__ import annotations

import multiprocessing

import pytest

from pathtwt.errors import PathtwtError
from pathtwt.io.failures import HEADER, failed_slides, read_failures, record_failure


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


def test_half_written_line_is_ignored_and_next_append_starts_fresh(tmp_path):
    table = tmp_path / "failures.tsv"
    record_failure(table, slide="a", stage="extract", reason="r")
    with open(table, "a", encoding="utf-8") as fh:
        fh.write("b\textract\ttruncat")  # a writer killed in the middle of its line
    assert [r.slide for r in read_failures(table)] == ["a"]
    record_failure(table, slide="c", stage="extract", reason="r")
    assert [r.slide for r in read_failures(table)] == ["a", "c"]


def test_not_a_failures_table(tmp_path):
    table = tmp_path / "failures.tsv"
    table.write_text("slide,label\nx,1\n")
    with pytest.raises(PathtwtError, match="failures.tsv: not a failures table"):
        read_failures(table)


def _append_many(table: str, worker: int, count: int) -> None:
    for i in range(count):
        record_failure(table, slide=f"w{worker}-s{i}", stage="extract", reason="x" * (500 + i))


def test_concurrent_appends_never_interleave(tmp_path):
    table = tmp_path / "failures.tsv"
    ctx = multiprocessing.get_context("fork")
    procs = [ctx.Process(target=_append_many, args=(str(table), w, 40)) for w in range(4)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(timeout=60)
        assert p.exitcode == 0
    rows = read_failures(table)
    assert len(rows) == 160 and table.read_text().count(HEADER) == 1
    assert {r.slide for r in rows} == {f"w{w}-s{i}" for w in range(4) for i in range(40)}
    assert all(r.reason == "x" * (500 + int(r.slide.split("-s")[1])) for r in rows)
    # every line of the file is a whole record
    assert all(len(line.split("\t")) == 4 for line in table.read_text().splitlines())
