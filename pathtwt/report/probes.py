"""The "Tile probe" table: balanced accuracy (bootstrap 95 % interval) of the logistic
and kNN probes per backbone variant and probe set, read from
``results/probes/{backbone}/{variant}/{probe}/probe.json`` (written by `pathtwt probe`).
The uncompressed teacher and the random-init floor are reference rows: a compressed
variant is worth what it keeps of the gap between them."""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

from pathtwt.errors import PathtwtError
from pathtwt.io.layout import RANDOM_INIT
from pathtwt.io.layout import UNCOMPRESSED as TEACHER
from pathtwt.report.selection import EVERYTHING, Selection

PROBES = (("logistic", "logistic"), ("knn", "kNN"))


@dataclass
class ProbeRow:
    backbone: str
    variant: str
    # probe set -> probe.json content
    results: dict[str, dict[str, Any]] = field(default_factory=dict)


def find_probe_runs(results: Path, selection: Selection = EVERYTHING) -> tuple[list[ProbeRow], list[str]]:
    """Rows (teacher first, random-init last) and the probe sets, from every finished
    probe.json of a backbone and variant ``selection`` keeps."""
    rows: dict[tuple[str, str], ProbeRow] = {}
    sets: list[str] = []
    for path in sorted((results / "probes").glob("*/*/*/probe.json")):
        probe_set, variant, backbone = path.parent.name, path.parent.parent.name, path.parent.parent.parent.name
        if not selection.keeps(backbone=backbone, variant=variant):
            continue
        try:
            summary = json.loads(path.read_text())
        except (OSError, json.JSONDecodeError) as exc:
            raise PathtwtError(f"{path}: unreadable probe results ({exc}); re-run this `pathtwt probe` job") from None
        if not isinstance(summary.get("probes"), dict):
            raise PathtwtError(f"{path}: no 'probes' section; it was not written by `pathtwt probe`")
        rows.setdefault((backbone, variant), ProbeRow(backbone, variant)).results[probe_set] = summary
        if probe_set not in sets:
            sets.append(probe_set)
    return list(rows.values()), sorted(sets)


def _variant_order(variant: str, depth: int | None) -> tuple:
    return (variant == RANDOM_INIT, variant != TEACHER, -(depth or 0), variant)


def _bacc(summary: dict[str, Any] | None, probe: str) -> tuple[float, float, float]:
    m = (summary or {}).get("probes", {}).get(probe) or {}
    value = m.get("balanced_accuracy")
    lo, hi = (m.get("balanced_accuracy_ci95") or [None, None])[:2]
    as_f = lambda v: math.nan if v is None else float(v)  # noqa: E731
    return as_f(value), as_f(lo), as_f(hi)


def variant_label(variant: str) -> str:
    return {TEACHER: "uncompressed (teacher)", RANDOM_INIT: "random-init (floor)"}.get(variant, variant)


def probe_table(results: Path, cost_of: Callable[[str, str], Any],
                selection: Selection = EVERYTHING) -> tuple[list[str], list[list[str]], list[dict[str, Any]]]:
    """(header, cells, CSV records) of the tile-probe table; empty when nothing was probed.
    ``cost_of(backbone, variant)`` gives a variant's params and MACs (random-init: the teacher's)."""
    rows, sets = find_probe_runs(results, selection)
    if not rows:
        return [], [], []
    costs = {(r.backbone, r.variant): cost_of(r.backbone, TEACHER if r.variant == RANDOM_INIT else r.variant) for r in rows}
    rows.sort(key=lambda r: (r.backbone, *_variant_order(r.variant, costs[r.backbone, r.variant].depth)))
    header = ["Backbone", "Variant"]
    for s in sets:
        header += [f"{s}: BAcc {label} [95% CI]" for _, label in PROBES]
    header += ["Params (M)", "GMACs"]
    body, records = [], []
    for r in rows:
        cost = costs[r.backbone, r.variant]
        cells = [r.backbone, variant_label(r.variant)]
        for s in sets:
            summary = r.results.get(s)
            for probe, _ in PROBES:
                value, lo, hi = _bacc(summary, probe)
                cells.append("n/a" if math.isnan(value) else f"{value:.3f} [{lo:.3f}, {hi:.3f}]")
                if summary is not None:
                    m = summary["probes"].get(probe) or {}
                    records.append({
                        "backbone": r.backbone, "variant": r.variant, "probe_set": s, "probe": probe,
                        "balanced_accuracy": value, "ci95_low": lo, "ci95_high": hi,
                        "accuracy": m.get("accuracy"), "macro_auc": m.get("macro_auc"),
                        "n_train": summary.get("n_train"), "n_test": summary.get("n_test"),
                        "weights_sha256": summary.get("weights_sha256"),
                        "params": cost.params, "macs_per_tile": cost.macs,
                    })
        cells.append("n/a" if cost.params is None else f"{cost.params / 1e6:.2f}")
        cells.append("n/a" if cost.macs is None else f"{cost.macs / 1e9:.2f}")
        body.append(cells)
    # chance: balanced accuracy 1 / C of any constant guess, per probe set
    chance = ["-", "chance (reference)"]
    for s in sets:
        n_classes = len(next(r.results[s] for r in rows if s in r.results).get("classes") or [])
        chance += [f"{1 / n_classes:.3f}" if n_classes else "n/a"] * len(PROBES)
    body.append(chance + ["-", "-"])
    return header, body, records


def below_floor_notes(results: Path, selection: Selection = EVERYTHING) -> list[str]:
    """One sentence per probe score under the random-init floor of the same backbone, probe
    set and probe, saying what it means."""
    rows, sets = find_probe_runs(results, selection)
    floors = {(r.backbone, s, p): _bacc(r.results.get(s), p)[0] for r in rows if r.variant == RANDOM_INIT
              for s in sets for p, _ in PROBES}
    notes = []
    for r in rows:
        if r.variant == RANDOM_INIT:
            continue
        for s in sets:
            for probe, label in PROBES:
                value, floor = _bacc(r.results.get(s), probe)[0], floors.get((r.backbone, s, probe), math.nan)
                if math.isnan(value) or math.isnan(floor) or value >= floor:
                    continue
                summary = r.results[s]
                n_test, n_classes = summary.get("n_test") or 0, len(summary.get("classes") or []) or 1
                why = ("kNN votes by cosine on the raw, unstandardised embeddings, where a few large dimensions "
                       "can outweigh the rest (the logistic probe standardises them)" if probe == "knn" else
                       "the logistic probe has one fixed regularisation (C = 1) for every backbone")
                step = f"; with {n_test} test tiles one tile moves balanced accuracy by about {n_classes / n_test:.3f}" \
                    if n_test else ""
                notes.append(
                    f"{r.backbone}/{variant_label(r.variant)} {label} on {s}: {value:.3f}, below the random-init floor "
                    f"{floor:.3f}. This probe does not show that the backbone carries more than random features "
                    f"here: {why}{step}; it is not evidence that the random network is the better backbone."
                )
    return notes


def probe_sets_note(results: Path, selection: Selection = EVERYTHING) -> str:
    """One sentence per probe set: where its tiles came from and how many were used."""
    rows, sets = find_probe_runs(results, selection)
    parts = []
    for s in sets:
        summary = next(r.results[s] for r in rows if s in r.results)
        cap = summary.get("max_per_class")
        parts.append(
            f"{s}: {summary.get('n_train')} train / {summary.get('n_test')} test tiles of "
            f"{len(summary.get('classes', []))} classes from {summary.get('tiles')} (split: {summary.get('split')}"
            + (f"; at most {cap} per class and split" if cap else "") + ")."
        )
    return " ".join(parts)
