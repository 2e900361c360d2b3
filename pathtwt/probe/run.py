"""One probe run end to end: embed the tiles, fit both probes, write ``probe.json`` and
``predictions.csv`` (one row per test tile) atomically, ``probe.json`` last so that its
presence marks a finished run."""

from __future__ import annotations

import csv
import io
import os
from pathlib import Path
from typing import Any, Callable


from pathtwt.io.atomic import write_json_atomic, write_text_atomic
from pathtwt.probe.data import ProbeSet
from pathtwt.probe.fit import BOOTSTRAP_ROUNDS, KNN_K, LOGISTIC_C, ProbeResult, embed_probe_set, run_probes

FORMAT = "pathtwt-probe/1"


def predictions_csv(probe_set: ProbeSet, results: list[ProbeResult]) -> str:
    test = probe_set.in_split("test")
    buf = io.StringIO()
    writer = csv.writer(buf, lineterminator="\n")
    header = ["path", "label"]
    for r in results:
        header += [f"{r.name}_prediction"] + [f"{r.name}_p_{c}" for c in probe_set.classes]
    writer.writerow(header)
    for i, tile in enumerate(test):
        row: list[Any] = [tile.path, probe_set.classes[tile.label]]
        for r in results:
            row += [probe_set.classes[int(r.probs[i].argmax())]] + [f"{p:.6f}" for p in r.probs[i]]
        writer.writerow(row)
    return buf.getvalue()


def probe_backbone(
    backbone: Any,
    probe_set: ProbeSet,
    out: str | os.PathLike,
    *,
    variant: str,
    name: str,
    seed: int = 0,
    batch_size: int = 32,
    max_per_class: int | None = None,
    random_init: bool = False,
    progress: Callable[[int, int], None] | None = None,
    bf16_autocast: bool = False,
) -> dict[str, Any]:
    """Probe ``backbone`` (a ``pathtwt.models.registry.Backbone``) on ``probe_set``; returns
    probe.json's content. ``bf16_autocast``: embed under bf16 autocast when the first tiles
    agree with fp32 (:mod:`pathtwt.models.bf16_guard`), as extraction does."""
    out = Path(out)
    features, precision = embed_probe_set(backbone, probe_set, batch_size=batch_size, progress=progress,
                                          bf16_autocast=bf16_autocast)
    results = run_probes(features, probe_set, seed=seed)
    counts = {
        split: {c: sum(1 for t in probe_set.in_split(split) if t.label == i) for i, c in enumerate(probe_set.classes)}
        for split in ("train", "test")
    }
    summary = {
        "format": FORMAT,
        "backbone": backbone.spec.base_backbone or backbone.spec.name,
        "variant": variant,
        "random_init": bool(random_init),
        "weights_sha256": backbone.weights_sha256,
        "weights_source": backbone.source,
        "probe_set": name,
        "tiles": str(probe_set.root),
        "split": probe_set.split_source,
        "max_per_class": max_per_class,
        "seed": seed,
        "n_train": len(probe_set.in_split("train")),
        "n_test": len(probe_set.in_split("test")),
        "classes": probe_set.classes,
        "counts": counts,
        "embedding_dim": int(features.shape[1]),
        **precision,
        "settings": {
            "logistic": f"standardised features, L2 logistic regression, C={LOGISTIC_C}",
            "knn": f"k={KNN_K}, cosine distance, majority vote",
            "ci95": f"percentile bootstrap of the test tiles, {BOOTSTRAP_ROUNDS} class-stratified resamples, seed {seed}",
        },
        "probes": {r.name: r.metrics for r in results},
    }
    write_text_atomic(out / "predictions.csv", predictions_csv(probe_set, results))
    write_json_atomic(out / "probe.json", summary)
    return summary


def as_float(value: Any) -> float:
    return float("nan") if value is None else float(value)


def summary_line(summary: dict[str, Any]) -> str:
    parts = [
        f"{name} balanced accuracy {as_float(m['balanced_accuracy']):.3f} "
        f"[{m['balanced_accuracy_ci95'][0]:.3f}, {m['balanced_accuracy_ci95'][1]:.3f}]"
        for name, m in summary["probes"].items()
    ]
    return f"{summary['variant']} on {summary['probe_set']} ({summary['n_train']} train / {summary['n_test']} test): " + "; ".join(parts)


