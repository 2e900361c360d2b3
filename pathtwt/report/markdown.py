"""The README's result tables, exactly as `pathtwt report --markdown` prints them (and
``report/tables.md`` holds them): one table per task, then the tile-probe and fidelity
tables, between two marker lines, headed by the commit and the machine they came from.
``readme_layout`` gives the header and row keys those tables have for a config, without
any results, so a test can check that the README's pasted tables still have that shape."""

from __future__ import annotations

import os
import platform
import subprocess
from datetime import date
from pathlib import Path
from typing import Any, Mapping

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


def readme_markdown(sections: list[dict[str, Any]], tables: list[dict[str, Any]], *, results: Path,
                    commit: str | None = None, where: str | None = None) -> str:
    from pathtwt.report.tables import markdown_table, task_markdown

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


def readme_layout(config: Mapping[str, Any]) -> dict[str, tuple[list[str], list[tuple[str, str]]]]:
    """task -> (header, [(variant cell, head)]) of the MIL tables `pathtwt report --markdown`
    writes for a finished run of ``config`` (the chance row last)."""
    from pathtwt.report.tables import (Cost, Row, row_label, role_of, shown_metrics, sort_cohorts, table_header,
                                       variant_sort_key)

    variants = []
    for name, spec in (config.get("variants") or {}).items():
        spec = spec or {}
        cost = Cost(params=None, macs=None, depth=spec.get("depth"), method=spec.get("method", name), teacher="")
        variants.append((name, cost))
    heads = list((config.get("mil") or {}).get("heads") or [])
    layout = {}
    for task, spec in (config.get("tasks") or {}).items():
        metric = spec.get("metric", "accuracy")
        cohorts = sort_cohorts(["test", *(spec.get("external") or [])])
        keys = []
        for backbone in sorted(config.get("backbones") or {}):
            for head in sorted(heads):
                for name, cost in sorted(variants, key=lambda vc: variant_sort_key(*vc)):
                    row = Row(backbone=backbone, variant=name, head=head, seeds=[], cost=cost, role=role_of(name, cost))
                    keys.append((row_label(row), head))
        keys.append(("chance (reference)", "-"))
        layout[task] = (table_header(cohorts, shown_metrics(metric), metric), keys)
    return layout


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
