"""The results tables of a study, like the paper's Tables 2-3: per task, one row per
backbone variant x MIL head; per evaluated cohort the metric's mean +- std over seeds;
the change against the uncompressed backbone with the same head; parameters and MACs.

Everything is read from the files the workflow writes (README.md, "The pipeline and its files"):
``results/mil/{backbone}/{variant}/{task}/{head}/seed{n}/metrics.json`` and
``results/models/{backbone}/{variant}/model.json``. The uncompressed teacher's cost is
counted on its architecture (no weights needed) with the same counter.
"""

from __future__ import annotations

import json
import math
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterable

from pathtwt.errors import PathtwtError

UNCOMPRESSED = "uncompressed"
# Cohort names of the label-table splits in metrics.json; "test" is the internal test.
INTERNAL, VALIDATION = "test", "val"
METRIC_LABELS = {
    "qwk": "QWK",
    "accuracy": "Acc",
    "balanced_accuracy": "BAcc",
    "auc_macro": "AUC",
}
COUNTING_NOTE = (
    "Parameters count unique tensors (shared weights once); MACs are per tile, counted "
    "analytically by pathtwt.models.flops: every linear layer, the attention matmuls "
    "QK^T and AV, and the patch embedding; norms and activations excluded. The paper's "
    "'GFLOPs' are these MACs."
)
SEED_DIR = re.compile(r"^seed(\d+)$")


@dataclass
class Run:
    backbone: str
    variant: str
    task: str
    head: str
    seed: int
    cohorts: dict[str, dict[str, Any]]


@dataclass
class Cost:
    params: int | None
    macs: int | None
    depth: int | None
    method: str
    teacher: str
    weights_sha256: str | None = None
    source: str = ""


@dataclass
class Row:
    backbone: str
    variant: str
    head: str
    seeds: list[int]
    cost: Cost
    # (cohort, metric) -> (mean, std, n)
    values: dict[tuple[str, str], tuple[float, float, int]] = field(default_factory=dict)
    delta: dict[str, float | None] = field(default_factory=dict)


def find_runs(results: Path) -> list[Run]:
    """Every finished MIL run (metrics.json is written last, so it marks completion)."""
    runs = []
    for path in sorted((results / "mil").glob("*/*/*/*/seed*/metrics.json")):
        seed_dir = path.parent
        match = SEED_DIR.match(seed_dir.name)
        if match is None:
            continue
        head_dir = seed_dir.parent
        task_dir = head_dir.parent
        variant_dir = task_dir.parent
        try:
            metrics = json.loads(path.read_text())
        except (OSError, json.JSONDecodeError) as exc:
            raise PathtwtError(f"{path}: unreadable MIL metrics ({exc}); re-run this `pathtwt train-mil` job") from None
        cohorts = metrics.get("cohorts")
        if not isinstance(cohorts, dict):
            raise PathtwtError(f"{path}: no 'cohorts' section; it was not written by `pathtwt train-mil`")
        runs.append(Run(
            backbone=variant_dir.parent.name, variant=variant_dir.name, task=task_dir.name,
            head=head_dir.name, seed=int(match.group(1)), cohorts=cohorts,
        ))
    return runs


def variant_cost(results: Path, backbone: str, variant: str) -> Cost:
    """Parameters and MACs of a variant: model.json of a compressed one, the registry
    architecture (counted on the meta device) of the uncompressed teacher."""
    meta_path = results / "models" / backbone / variant / "model.json"
    if meta_path.is_file():
        meta = json.loads(meta_path.read_text())
        prov = meta.get("provenance", {})
        return Cost(
            params=meta.get("params"), macs=meta.get("macs_per_tile"), depth=meta.get("depth"),
            method=meta.get("method", variant), teacher=prov.get("teacher", meta.get("base_backbone", backbone)),
            weights_sha256=meta.get("teacher_weights_sha256"), source=str(prov.get("teacher_source", "")),
        )
    cost = Cost(params=None, macs=None, depth=None, method="none" if variant == UNCOMPRESSED else variant, teacher=backbone)
    if variant in (UNCOMPRESSED, "random-init"):  # the random-init floor has the teacher's architecture
        try:
            from pathtwt.models.flops import describe_cost, meta_model

            described = describe_cost(meta_model(backbone))
            cost.params, cost.macs, cost.depth = described["params"], described["macs_per_tile"], described["depth"]
        except (ImportError, KeyError, PathtwtError):
            pass  # not a registry name: the table shows "n/a" rather than a guess
    cost.weights_sha256, cost.source = teacher_weights(results, backbone)
    return cost


def teacher_weights(results: Path, backbone: str) -> tuple[str | None, str]:
    """The teacher's weights hash and source as recorded in its features files."""
    from pathtwt.io.h5 import read_attrs

    for path in sorted((results / "features" / backbone / UNCOMPRESSED).glob("*/[!.]*.h5"))[:1]:
        attrs = read_attrs(path)
        return (attrs.get("weights_sha256") or None), str(attrs.get("weights_source", ""))
    return None, ""


def _mean_std(values: list[float]) -> tuple[float, float, int]:
    n = len(values)
    if n == 0:
        return math.nan, math.nan, 0
    mean = sum(values) / n
    # sample standard deviation over seeds (0 for a single seed)
    std = math.sqrt(sum((v - mean) ** 2 for v in values) / (n - 1)) if n > 1 else 0.0
    return mean, std, n


def variant_sort_key(variant: str, cost: Cost) -> tuple:
    return (variant != UNCOMPRESSED, -(cost.depth or 0), variant)


def task_table(
    runs: Iterable[Run], results: Path, *, task: str, metric: str, cost_cache: dict | None = None
) -> tuple[list[Row], list[str], list[str]]:
    """Rows of one task, the cohorts evaluated (internal test first) and the metrics shown."""
    runs = [r for r in runs if r.task == task]
    cost_cache = {} if cost_cache is None else cost_cache
    cohorts: list[str] = []
    for r in runs:
        for c in r.cohorts:
            if c != VALIDATION and c not in cohorts:
                cohorts.append(c)
    cohorts.sort(key=lambda c: (c != INTERNAL, c))
    metrics = [metric] + (["accuracy"] if metric != "accuracy" else [])
    groups: dict[tuple[str, str, str], list[Run]] = {}
    for r in runs:
        groups.setdefault((r.backbone, r.variant, r.head), []).append(r)
    rows = []
    for (backbone, variant, head), members in groups.items():
        if (backbone, variant) not in cost_cache:
            cost_cache[backbone, variant] = variant_cost(results, backbone, variant)
        row = Row(backbone=backbone, variant=variant, head=head, seeds=sorted(r.seed for r in members),
                  cost=cost_cache[backbone, variant])
        for cohort in cohorts:
            for m in metrics:
                vals = [r.cohorts[cohort][m] for r in members if r.cohorts.get(cohort, {}).get(m) is not None]
                row.values[cohort, m] = _mean_std([float(v) for v in vals])
        rows.append(row)
    rows.sort(key=lambda r: (r.backbone, r.head, *variant_sort_key(r.variant, r.cost)))
    base = {(r.backbone, r.head): r for r in rows if r.variant == UNCOMPRESSED}
    for row in rows:
        ref = base.get((row.backbone, row.head))
        for cohort in cohorts:
            mine, theirs = row.values[cohort, metric][0], ref.values[cohort, metric][0] if ref else math.nan
            row.delta[cohort] = None if ref is None or math.isnan(mine) or math.isnan(theirs) else mine - theirs
    return rows, cohorts, metrics


def _fmt(value: float, digits: int = 3) -> str:
    return "n/a" if value is None or (isinstance(value, float) and math.isnan(value)) else f"{value:.{digits}f}"


def table_records(rows: list[Row], cohorts: list[str], metrics: list[str], metric: str) -> list[dict[str, Any]]:
    """Machine-readable rows (one CSV line each): means, stds and deltas as numbers."""
    records = []
    for r in rows:
        rec: dict[str, Any] = {
            "backbone": r.backbone, "variant": r.variant, "method": r.cost.method, "depth": r.cost.depth,
            "head": r.head, "n_seeds": len(r.seeds),
        }
        for cohort in cohorts:
            for m in metrics:
                mean, std, _ = r.values[cohort, m]
                rec[f"{cohort}_{m}_mean"], rec[f"{cohort}_{m}_std"] = mean, std
            rec[f"{cohort}_{metric}_delta"] = r.delta[cohort]
        rec["params"], rec["macs_per_tile"] = r.cost.params, r.cost.macs
        records.append(rec)
    return records


def table_cells(rows: list[Row], cohorts: list[str], metrics: list[str], metric: str) -> tuple[list[str], list[list[str]]]:
    """Human-readable header and cells (Markdown and HTML share them)."""
    header = ["Backbone", "Variant", "Head"]
    for cohort in cohorts:
        label = "internal test" if cohort == INTERNAL else cohort
        header += [f"{METRIC_LABELS.get(m, m)} {label}" for m in metrics] + [f"Δ{METRIC_LABELS.get(metric, metric)} {label}"]
    header += ["Params (M)", "GMACs"]
    body = []
    for r in rows:
        cells = [r.backbone, r.variant, r.head]
        for cohort in cohorts:
            for m in metrics:
                mean, std, n = r.values[cohort, m]
                cells.append("n/a" if n == 0 else f"{mean:.3f} ± {std:.3f}")
            d = r.delta[cohort]
            cells.append("—" if r.variant == UNCOMPRESSED else ("n/a" if d is None else f"{d:+.3f}"))
        cells.append("n/a" if r.cost.params is None else f"{r.cost.params / 1e6:.2f}")
        cells.append("n/a" if r.cost.macs is None else f"{r.cost.macs / 1e9:.2f}")
        body.append(cells)
    return header, body


def markdown_table(header: list[str], body: list[list[str]]) -> str:
    lines = ["| " + " | ".join(header) + " |", "|" + "|".join("---" for _ in header) + "|"]
    lines += ["| " + " | ".join(cells) + " |" for cells in body]
    return "\n".join(lines) + "\n"


def csv_text(records: list[dict[str, Any]]) -> str:
    import csv
    import io

    buf = io.StringIO()
    if records:
        writer = csv.DictWriter(buf, fieldnames=list(records[0]), lineterminator="\n")
        writer.writeheader()
        writer.writerows(records)
    return buf.getvalue()


def teacher_lines(costs: dict[tuple[str, str], Cost]) -> list[str]:
    """One sentence per teacher: name, weights hash and source, random weights flagged."""
    lines = []
    for backbone in sorted({b for b, _ in costs}):
        teacher = costs.get((backbone, UNCOMPRESSED)) or next(c for (b, _), c in costs.items() if b == backbone)
        sha, source = teacher.weights_sha256, teacher.source
        if not sha or "random" in source.lower():
            lines.append(
                f"{backbone}: RANDOM weights (the pretrained weights were not available); "
                "the numbers check the pipeline, not the method."
            )
        else:
            lines.append(f"{backbone}: pretrained weights sha256 {sha} ({source or 'source not recorded'}).")
    return lines


PROBE_NOTE = (
    "Balanced accuracy on each probe set's test split of a logistic-regression probe "
    "(standardised features, C = 1) and a cosine kNN (k = 20) fitted on its train split "
    "(pathtwt probe); in brackets the 95 % bootstrap interval over test tiles. The "
    "uncompressed teacher and the same architecture with random weights (the floor) are "
    "reference rows."
)
FIDELITY_NOTE = (
    "Student against teacher tile embeddings on held-out calibration tiles: R² of the "
    "teacher embedding (1 = the teacher, 0 = a constant at the teacher's fit mean), cosine "
    "after subtracting the teacher's fit mean, linear CKA; the uncentred cosine is "
    "secondary (a constant output already scores high on it). R² per block: at each block "
    "boundary. Reference rows are measured on the same tiles."
)


def reference_rows(body: list[list[str]]) -> list[int]:
    """Rows whose variant cell names a reference (teacher, floor, constant)."""
    return [i for i, cells in enumerate(body) if cells[1].endswith(("(reference)", "(teacher)", "(floor)"))]


def backbone_tables(results: Path, out: Path, costs: dict[tuple[str, str], Cost]) -> list[dict[str, Any]]:
    """The tile-probe and fidelity tables (``probes.*``, ``fidelity.*``), those that have rows."""
    from pathtwt.io.atomic import write_text_atomic
    from pathtwt.report.fidelity import fidelity_table
    from pathtwt.report.probes import probe_sets_note, probe_table

    def cost_of(backbone: str, variant: str) -> Cost:
        if (backbone, variant) not in costs:
            costs[backbone, variant] = variant_cost(results, backbone, variant)
        return costs[backbone, variant]

    tables = []
    header, body, records = probe_table(results, cost_of)
    if body:
        note = f"{PROBE_NOTE} {probe_sets_note(results)}"
        tables.append({"name": "probes", "title": "Tile probe", "header": header, "body": body,
                       "records": records, "notes": [note], "references": reference_rows(body)})
    header, body, records, notes = fidelity_table(results, cost_of)
    if body:
        tables.append({"name": "fidelity", "title": "Fidelity", "header": header, "body": body,
                       "records": records, "notes": [FIDELITY_NOTE, *notes], "references": reference_rows(body)})
    for t in tables:
        write_text_atomic(out / f"{t['name']}.csv", csv_text(t["records"]))
        notes_md = "".join(f"\n{n}\n" for n in t["notes"])
        write_text_atomic(out / f"{t['name']}.md", f"## {t['title']}\n\n" + markdown_table(t["header"], t["body"]) + notes_md)
    return tables


def write_report(results: str | Path, out: str | Path, *, metrics: dict[str, str], attention_slides: int = 3) -> Path:
    """Write ``{task}.csv``, ``{task}.md`` and ``index.html`` (with figures) into ``out``."""
    from pathtwt.io.atomic import write_text_atomic
    from pathtwt.report.html import render_html

    results, out = Path(results), Path(out)
    runs = find_runs(results)
    tasks = list(dict.fromkeys(list(metrics) + [r.task for r in runs]))
    if not tasks:
        raise PathtwtError(f"{results}: no finished MIL runs under mil/ and no task given; run the workflow first")
    costs: dict[tuple[str, str], Cost] = {}
    sections = []
    for task in tasks:
        metric = metrics.get(task, "accuracy")
        rows, cohorts, shown = task_table(runs, results, task=task, metric=metric, cost_cache=costs)
        header, body = table_cells(rows, cohorts, shown, metric)
        write_text_atomic(out / f"{task}.csv", csv_text(table_records(rows, cohorts, shown, metric)))
        md = f"## {task}\n\n" + (markdown_table(header, body) if rows else "No finished runs yet.\n")
        write_text_atomic(out / f"{task}.md", md)
        sections.append({"task": task, "metric": metric, "header": header, "body": body, "rows": rows, "cohorts": cohorts})
    extra = backbone_tables(results, out, costs)
    html = render_html(
        results, out, sections=sections, teachers=teacher_lines(costs), counting=COUNTING_NOTE,
        attention_slides=attention_slides, tables=extra,
    )
    write_text_atomic(out / "index.html", html)
    return out / "index.html"
