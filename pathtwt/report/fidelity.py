"""The "Fidelity" table: how close each compressed variant's tile embeddings are to the
teacher's on the held-out report split of the calibration tiles, read from
``results/models/{backbone}/{variant}/model.json`` (``fidelity``).

Centred measures come first (R² of the teacher embedding, centred cosine, linear CKA);
the uncentred cosine is secondary, since the embeddings' common direction alone gives a
constant output a high cosine. Per backbone, three reference rows measured on the same
tiles frame the numbers: the teacher itself, a constant output (the teacher's mean
embedding on the fit split) and the teacher's architecture with random weights. Older
model.json files without these keys show "n/a"."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any, Callable

from pathtwt.errors import PathtwtError
from pathtwt.io.layout import UNCOMPRESSED
from pathtwt.models.registry import variant_depth
from pathtwt.report.selection import EVERYTHING, Selection

REFERENCES = (("teacher", "teacher (reference)"), ("constant", "constant (reference)"),
              ("random_init", "random-init (reference)"))
HEADER = ["Backbone", "Variant", "R²", "Centred cosine", "CKA", "Cosine (uncentred)", "R² at init",
          "Report tiles", "Params (M)", "GMACs"]
# Per-block R² columns follow HEADER, one per teacher layer: "R² L1", "R² L2", ...
BLOCK_COLUMN = "R² L{}"
NOT_MATCHED = "·"  # a teacher layer this student has no block boundary at


def _num(m: dict[str, Any] | None, key: str) -> float:
    value = (m or {}).get(key)
    if value is None and key == "cosine":
        value = (m or {}).get("embedding_cosine_mean")  # the name older model.json files use
    try:
        return math.nan if value is None else float(value)
    except (TypeError, ValueError):
        return math.nan


def _f(value: float, digits: int = 3) -> str:
    return "n/a" if math.isnan(value) else f"{value:.{digits}f}"


def block_layers(m: dict[str, Any] | None, meta: dict[str, Any] | None, teacher_depth: int | None) -> list[int] | None:
    """The teacher layer (1-based) each ``block_r2`` value was measured against: recorded
    with the values (``block_layers``), else the ends of model.json's plan blocks, else
    every teacher layer when there is one value per layer; None when it cannot be told."""
    values = (m or {}).get("block_r2")
    if not isinstance(values, list) or not values:
        return None
    recorded = (m or {}).get("block_layers")
    if isinstance(recorded, list) and len(recorded) == len(values):
        return [int(e) for e in recorded]
    blocks = ((meta or {}).get("plan") or {}).get("blocks")
    if isinstance(blocks, list) and len(blocks) == len(values):
        return [int(b[-1]) for b in blocks]
    if teacher_depth and len(values) == teacher_depth:
        return list(range(1, teacher_depth + 1))
    return None


def _block_cells(m: dict[str, Any] | None, layers: list[int] | None, depth: int) -> list[str]:
    values = (m or {}).get("block_r2")
    if not isinstance(values, list) or not values:
        return ["n/a"] * depth
    if layers is None:
        return ["?"] * depth
    cells = [NOT_MATCHED] * depth
    for layer, v in zip(layers, values):
        if 1 <= layer <= depth:
            cells[layer - 1] = _f(_num({"v": v}, "v"), 2)
    return cells


def read_models(results: Path, selection: Selection = EVERYTHING) -> dict[str, list[tuple[str, dict[str, Any]]]]:
    """backbone -> [(variant, model.json)] of every exported variant ``selection`` keeps."""
    out: dict[str, list[tuple[str, dict[str, Any]]]] = {}
    for path in sorted((results / "models").glob("*/*/model.json")):
        if not selection.keeps(backbone=path.parent.parent.name, variant=path.parent.name):
            continue
        try:
            meta = json.loads(path.read_text())
        except (OSError, json.JSONDecodeError) as exc:
            raise PathtwtError(f"{path}: unreadable model metadata ({exc}); re-run `pathtwt compress` for it") from None
        out.setdefault(path.parent.parent.name, []).append((path.parent.name, meta))
    return out


def _row(backbone: str, label: str, final: dict | None, initial: dict | None, n_tiles: Any, cost: Any,
         layers: list[int] | None, depth: int) -> tuple[list[str], dict]:
    values = {k: _num(final, k) for k in ("r2", "centred_cosine", "cka", "cosine")}
    init_r2 = _num(initial, "r2")
    cells = [backbone, label] + [_f(values[k]) for k in ("r2", "centred_cosine", "cka", "cosine")]
    cells += [_f(init_r2), "n/a" if n_tiles is None else str(n_tiles)]
    params, macs = (None, None) if cost is None else (cost.params, cost.macs)
    cells += ["—" if cost is None else ("n/a" if params is None else f"{params / 1e6:.2f}"),
              "—" if cost is None else ("n/a" if macs is None else f"{macs / 1e9:.2f}")]
    cells += _block_cells(final, layers, depth)
    record = {"backbone": backbone, "variant": label, **values, "r2_at_init": init_r2,
              "block_r2": " ".join(_f(_num({"v": v}, "v"), 4) for v in (final or {}).get("block_r2") or []),
              "block_layers": " ".join(str(e) for e in layers or []),
              "report_tiles": n_tiles, "params": params, "macs_per_tile": macs}
    return cells, record


def fidelity_table(results: Path, cost_of: Callable[[str, str], Any], selection: Selection = EVERYTHING,
                   ) -> tuple[list[str], list[list[str]], list[dict[str, Any]], list[str]]:
    """(header, cells, CSV records, notes). ``cost_of(backbone, variant)`` gives params and MACs."""
    models = read_models(results, selection)
    body, records, notes = [], [], []

    def teacher_depth(backbone: str) -> int:
        refs = next((m["fidelity"]["references"] for _, m in models[backbone]
                     if isinstance((m.get("fidelity") or {}).get("references"), dict)), {})
        blocks = (refs.get("teacher") or {}).get("block_r2")
        return len(blocks) if isinstance(blocks, list) and blocks else int(cost_of(backbone, UNCOMPRESSED).depth or 0)

    depths = {b: teacher_depth(b) for b in models}
    depth = max(depths.values(), default=0)
    for backbone in sorted(models):
        variants = sorted(models[backbone], key=lambda vm: (-(variant_depth(vm[1]) or 0), vm[0]))
        fids = {v: (m.get("fidelity") or {}) for v, m in variants}
        with_refs = [v for v, f in fids.items() if isinstance(f.get("references"), dict)]
        refs = fids[with_refs[0]]["references"] if with_refs else {}
        teacher_cost = cost_of(backbone, UNCOMPRESSED)

        def n_of(metrics: dict | None, fid: dict) -> Any:
            return (metrics or {}).get("n_tiles", fid.get("holdout_tiles"))

        ordered = [("teacher", None)] + [(v, "variant") for v, _ in variants] + [("constant", None), ("random_init", None)]
        labels = dict(REFERENCES)
        for name, kind in ordered:
            if kind == "variant":
                fid = fids[name]
                meta = dict(variants)[name]
                layers = block_layers(fid.get("final"), meta, depths[backbone])
                cells, rec = _row(backbone, name, fid.get("final"), fid.get("initial"), n_of(fid.get("final"), fid),
                                  cost_of(backbone, name), layers, depth)
                if layers is None and (fid.get("final") or {}).get("block_r2"):
                    notes.append(f"{backbone}/{name}: its per-block R² cannot be placed under teacher layers "
                                 "(no plan or block_layers in model.json); shown as ?.")
            else:
                m = refs.get(name)
                cost = None if name == "constant" else teacher_cost
                cells, rec = _row(backbone, labels[name], m, None, n_of(m, {}), cost,
                                  block_layers(m, None, depths[backbone]), depth)
                cells[6] = "—"
            body.append(cells)
            records.append(rec)
        splits = {json.dumps(f.get("splits"), sort_keys=True) for f in fids.values() if f.get("splits")}
        if with_refs:
            s = fids[with_refs[0]].get("splits") or {}
            notes.append(
                f"{backbone}: measured on the report split of the calibration tiles"
                + (f" ({s.get('report')} tiles; fit {s.get('fit')}, select {s.get('select')}, seed {s.get('seed')})" if s else "")
                + (f"; reference rows from {with_refs[0]}." if len(variants) > 1 else ".")
                + (" The variants were measured on different splits." if len(splits) > 1 else "")
            )
        else:
            notes.append(f"{backbone}: these model.json files predate the centred measures and reference rows (n/a).")
    if body:
        # no "L<i>": in Markdown pages an unknown tag like <i> is passed through as HTML
        notes.append(f"R² L1 to R² L{depth}: R² of the student's tokens at the end of the block that stands for "
                     f"teacher layers up to that layer, against the teacher's tokens after it; {NOT_MATCHED}: no "
                     "block of this student ends at that layer.")
    return ((HEADER + [BLOCK_COLUMN.format(i) for i in range(1, depth + 1)]) if body else []), body, records, notes
