"""Result files of a measurement: the rows measured so far and the facts of the run,
rewritten atomically after every row (:func:`pathtwt.io.atomic.write_json_atomic`), so an
interrupted run leaves every row it finished and no half row."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any, Callable

from pathtwt.io.atomic import write_json_atomic, write_text_atomic


def as_dict(row: Any) -> dict[str, Any]:
    """A row as a JSON object: a dataclass's fields, or a mapping's items."""
    return dataclasses.asdict(row) if dataclasses.is_dataclass(row) else dict(row)


class ResultsFile:
    """``{**facts, "rows": [...]}`` at ``path`` (None: kept in memory only), rewritten
    atomically on each :meth:`add` and :meth:`update`; ``render`` (rows, facts) -> text
    writes a companion text file (a Markdown table) next to it the same way, to
    ``text_path``."""

    def __init__(self, path: str | Path | None, facts: dict[str, Any] | None = None, *,
                 text_path: str | Path | None = None,
                 render: Callable[[list[dict[str, Any]], dict[str, Any]], str] | None = None) -> None:
        self.path = Path(path) if path else None
        self.text_path = Path(text_path) if text_path else None
        self.render = render
        self.facts: dict[str, Any] = dict(facts or {})
        self.rows: list[dict[str, Any]] = []

    def add(self, row: Any) -> dict[str, Any]:
        """Append a finished row and rewrite the files; the row as written."""
        self.rows.append(as_dict(row))
        self.write()
        return self.rows[-1]

    def update(self, **facts: Any) -> None:
        self.facts.update(facts)
        self.write()

    def data(self) -> dict[str, Any]:
        return {**self.facts, "rows": self.rows}

    def write(self) -> None:
        if self.path:
            write_json_atomic(self.path, self.data())
        if self.text_path and self.render:
            write_text_atomic(self.text_path, self.render(self.rows, self.facts))
