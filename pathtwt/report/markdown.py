"""The result tables of the docs (docs/results.md), exactly as `pathtwt report --markdown` prints them (and
``report/tables.md`` holds them): one table per task, then the tile-probe and fidelity
tables, between two marker lines, headed by the commit and the machine they came from.
``pathtwt.report.tables.readme_layout`` gives the header and row keys those tables have for
a config, without any results, so a test can check that the pasted tables still
have that shape."""

from __future__ import annotations

import os
import platform
import subprocess
from datetime import date
from pathlib import Path
from typing import Any

BEGIN = "<!-- pathtwt report --markdown: begin -->"
END = "<!-- pathtwt report --markdown: end -->"


def commit_of(path: Path) -> str:
    """Short commit of the checkout that holds ``path`` (+ "with local changes"), or "unknown"."""
    try:
        run = lambda *a: subprocess.run(["git", "-C", str(path), *a], capture_output=True, text=True, timeout=10)  # noqa: E731
        head = run("rev-parse", "--short=12", "HEAD")
        if head.returncode != 0:
            return "unknown (not a git checkout)"
        dirty = run("status", "--porcelain", "--untracked-files=no").stdout.strip()
        return head.stdout.strip() + (" with local changes" if dirty else "")
    except (OSError, subprocess.SubprocessError):
        return "unknown (git not available)"


def machine() -> str:
    """The machine in words: OS, CPU model and cores, GPU if torch sees one."""
    cpu = platform.processor() or platform.machine()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    gpu = "no GPU"
    try:
        import torch

        if torch.cuda.is_available():
            gpu = f"{torch.cuda.device_count()} x {torch.cuda.get_device_name(0)}"
    except Exception:  # noqa: BLE001 - a broken CUDA setup must not stop the report
        pass
    return f"{platform.system()} {platform.machine()}, {cpu}, {os.cpu_count()} CPU cores, {gpu}"


def markdown_table(header: list[str], body: list[list[str]]) -> str:
    lines = ["| " + " | ".join(header) + " |", "|" + "|".join("---" for _ in header) + "|"]
    lines += ["| " + " | ".join(cells) + " |" for cells in body]
    return "\n".join(lines) + "\n"


def task_markdown(section: dict[str, Any], level: str = "##") -> str:
    title = f"{level} {section['task']} ({section.get('label', section['metric'])})\n\n"
    if not section["rows"]:
        return title + "No finished runs yet.\n"
    return title + markdown_table(section["header"], section["body"]) + "".join(f"\n{n}\n" for n in section["notes"])


def readme_markdown(sections: list[dict[str, Any]], tables: list[dict[str, Any]], *, results: Path,
                    commit: str | None = None, where: str | None = None) -> str:
    commit = commit_of(Path.cwd()) if commit is None else commit
    where = machine() if where is None else where
    parts = [BEGIN, "",
             f"Written by `pathtwt report --markdown` from `{results}` at commit {commit} on {where} "
             f"({date.today().isoformat()}).", ""]
    for s in sections:
        parts.append(task_markdown(s, level="####"))
    for t in tables:
        parts.append(f"#### {t['title']}\n\n" + markdown_table(t["header"], t["body"])
                     + "".join(f"\n{n}\n" for n in t["notes"]))
    parts.append(END)
    return "\n".join(parts) + "\n"


def parse_tables(text: str) -> dict[str, tuple[list[str], list[list[str]]]]:
    """The tables between the markers of ``text``: title (the ``####`` heading before each)
    -> (header, rows of cells)."""
    if BEGIN not in text or END not in text:
        return {}
    section = text.split(BEGIN, 1)[1].split(END, 1)[0]
    tables: dict[str, tuple[list[str], list[list[str]]]] = {}
    title, rows = None, []
    for line in section.splitlines() + [""]:
        if line.startswith("#### "):
            title = line[5:].strip()
        elif line.startswith("|"):
            cells = [c.strip() for c in line.strip().strip("|").split("|")]
            if not all(set(c) <= {"-", ":"} for c in cells):
                rows.append(cells)
        elif rows and title is not None:
            tables[title] = (rows[0], rows[1:])
            rows = []
    return tables
