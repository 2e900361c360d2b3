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

REFERENCES = (("teacher", "teacher (reference)"), ("constant", "constant (reference)"),
              ("random_init", "random-init (reference)"))
HEADER = ["Backbone", "Variant", "R²", "Centred cosine", "CKA", "Cosine (uncentred)", "R² at init",
          "R² per block", "Report tiles", "Params (M)", "GMACs"]


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


def _blocks(m: dict[str, Any] | None) -> str:
    values = (m or {}).get("block_r2")
    if not isinstance(values, list) or not values:
        return "n/a"
    return " · ".join(_f(_num({"v": v}, "v"), 2) for v in values)


def read_models(results: Path) -> dict[str, list[tuple[str, dict[str, Any]]]]:
    """backbone -> [(variant, model.json)] of every exported variant."""
    out: dict[str, list[tuple[str, dict[str, Any]]]] = {}
    for path in sorted((results / "models").glob("*/*/model.json")):
        try:
            meta = json.loads(path.read_text())
        except (OSError, json.JSONDecodeError) as exc:
            raise PathtwtError(f"{path}: unreadable model metadata ({exc}); re-run `pathtwt compress` for it") from None
        out.setdefault(path.parent.parent.name, []).append((path.parent.name, meta))
    return out


def _row(backbone: str, label: str, final: dict | None, initial: dict | None, n_tiles: Any, cost: Any) -> tuple[list[str], dict]:
    values = {k: _num(final, k) for k in ("r2", "centred_cosine", "cka", "cosine")}
    init_r2 = _num(initial, "r2")
    cells = [backbone, label] + [_f(values[k]) for k in ("r2", "centred_cosine", "cka", "cosine")]
    cells += [_f(init_r2), _blocks(final), "n/a" if n_tiles is None else str(n_tiles)]
    params, macs = (None, None) if cost is None else (cost.params, cost.macs)
    cells += ["—" if cost is None else ("n/a" if params is None else f"{params / 1e6:.2f}"),
              "—" if cost is None else ("n/a" if macs is None else f"{macs / 1e9:.2f}")]
    record = {"backbone": backbone, "variant": label, **values, "r2_at_init": init_r2,
              "block_r2": " ".join(_f(_num({"v": v}, "v"), 4) for v in (final or {}).get("block_r2") or []),
              "report_tiles": n_tiles, "params": params, "macs_per_tile": macs}
    return cells, record


def fidelity_table(results: Path, cost_of: Callable[[str, str], Any]) -> tuple[list[str], list[list[str]], list[dict[str, Any]], list[str]]:
    """(header, cells, CSV records, notes). ``cost_of(backbone, variant)`` gives params and MACs."""
    models = read_models(results)
    body, records, notes = [], [], []
    for backbone in sorted(models):
        variants = sorted(models[backbone], key=lambda vm: (-(vm[1].get("depth") or 0), vm[0]))
        fids = {v: (m.get("fidelity") or {}) for v, m in variants}
        with_refs = [v for v, f in fids.items() if isinstance(f.get("references"), dict)]
        refs = fids[with_refs[0]]["references"] if with_refs else {}
        teacher_cost = cost_of(backbone, "uncompressed")

        def n_of(metrics: dict | None, fid: dict) -> Any:
            return (metrics or {}).get("n_tiles", fid.get("holdout_tiles"))

        ordered = [("teacher", None)] + [(v, "variant") for v, _ in variants] + [("constant", None), ("random_init", None)]
        labels = dict(REFERENCES)
        for name, kind in ordered:
            if kind == "variant":
                fid = fids[name]
                cells, rec = _row(backbone, name, fid.get("final"), fid.get("initial"), n_of(fid.get("final"), fid),
                                  cost_of(backbone, name))
            else:
                m = refs.get(name)
                cost = None if name == "constant" else teacher_cost
                cells, rec = _row(backbone, labels[name], m, None, n_of(m, {}), cost)
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
    return (HEADER if body else []), body, records, notes
