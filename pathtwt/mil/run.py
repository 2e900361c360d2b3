"""A complete MIL run: train (:func:`pathtwt.mil.train.fit`), evaluate the selected
model on every cohort, and write the results, each file atomically:

- ``checkpoint.pt``: the selected weights with what is needed to rebuild the head;
- ``predictions.csv``: slide_id, cohort, label, prediction, prob_0..prob_{C-1};
- ``attention/{cohort}.h5``: one group per slide with ``attention`` (N,) and ``coords``
  (N, 2), for heatmaps;
- ``metrics.json`` (written last, so its presence means the run finished): per cohort
  QWK (raw and x100), accuracy, balanced accuracy and macro AUC, the selected epoch,
  the per-epoch history and the config used.

``resume.pt`` (model, optimiser, scheduler, history after each epoch) exists only while a
run is unfinished; rerunning the same command continues from it.
"""

from __future__ import annotations

import platform
from pathlib import Path
from typing import Callable

import numpy as np
import pandas as pd
import torch

from pathtwt import __version__
from pathtwt.devices import device_provenance
from pathtwt.io.atomic import atomic_output, write_json_atomic
from pathtwt.io.h5_writer import writing_h5
from pathtwt.mil.data import MILData, features_provenance
from pathtwt.mil.heads import get_head
from pathtwt.mil.protocols import MILConfig
from pathtwt.mil.train import RESUME_FILE, Evaluation, evaluate, fit

METRICS_FORMAT = "pathtwt-mil-metrics/1"


def run_mil(
    data: MILData,
    config: MILConfig,
    *,
    out_dir: str | Path,
    device: str | torch.device = "cpu",
    progress: bool = True,
    resume: bool = True,
    sources: dict | None = None,
    on_epoch_end: Callable[[int], None] | None = None,
) -> dict:
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    # what the head was trained on, so `pathtwt predict` can refuse another backbone or embedding
    provenance = features_provenance(data.train.bags[0].path) if data.train.bags else {}
    head = get_head(config.aggregator)
    fit_at_once = head.fitter
    if fit_at_once is not None:  # fitted in one go, not by the epoch loop
        from pathtwt.mil.metrics import slide_metrics

        checkpoint, summary, probs = fit_at_once(data, config)
        checkpoint = {**checkpoint, "config": config.to_dict(), "selected_epoch": summary["selected_epoch"]}
        evaluations = [Evaluation(cohort=c, probs=probs[c.name], metrics=slide_metrics(c.labels, probs[c.name], data.n_classes))
                       for c in data.evaluated]
    else:
        model, summary = fit(data, config, out_dir=out_dir, device=device, progress=progress, resume=resume, on_epoch_end=on_epoch_end)
        evaluations = [evaluate(model, c, n_classes=data.n_classes, device=torch.device(device), keep_attention=True) for c in data.evaluated]
        checkpoint = {
            "model": model.state_dict(),
            "aggregator": config.aggregator,
            "in_dim": data.dim,
            "n_classes": data.n_classes,
            "config": config.to_dict(),
            "selected_epoch": summary["selected_epoch"],
        }
    checkpoint["features"] = provenance
    if data.fold is not None:
        checkpoint["fold"] = data.fold
    with atomic_output(out_dir / "checkpoint.pt") as tmp:
        torch.save(checkpoint, tmp)
    for evaluation in evaluations:
        if evaluation.attention is not None:
            write_attention(out_dir / "attention" / f"{evaluation.cohort.name}.h5", evaluation)
    write_predictions(out_dir / "predictions.csv", evaluations, fold=data.fold)
    metrics = {
        "format": METRICS_FORMAT,
        "protocol": config.protocol,
        "aggregator": config.aggregator,
        "seed": config.seed,
        "fold": data.fold,
        "n_classes": data.n_classes,
        "feature_dim": data.dim,
        "features": provenance,
        "selected_epoch": summary["selected_epoch"],
        "selection": {
            "rule": head.selection or config.selection,
            "metric": f"val {config.selection_metric}",
            "window": config.selection_window if config.selection == "moving-average" else 1,
            "fallback_to_last": summary["selection_fallback_to_last"],
            **({"C": summary["selected_C"]} if "selected_C" in summary else {}),
        },
        "cohorts": {e.cohort.name: e.metrics for e in evaluations},
        "n_train_slides": len(data.train.bags),
        "skipped": data.skipped(),
        "history": summary["history"],
        "config": config.to_dict(),
        "sources": sources or {},
        "versions": {"pathtwt": __version__, "torch": torch.__version__, "python": platform.python_version()},
        "device": device_provenance(device),
    }
    write_json_atomic(out_dir / "metrics.json", metrics)
    # the run is complete: the resume state (weights + optimiser) is no longer needed
    (out_dir / RESUME_FILE).unlink(missing_ok=True)
    return metrics


def write_predictions(path: Path, evaluations: list[Evaluation], fold: int | None = None) -> None:
    """One row per evaluated slide; ``group`` (the label table's patient or case) where the
    table has one, ``fold`` (the run's test fold) in a cross-validation run."""
    rows = []
    for e in evaluations:
        for bag, probs in zip(e.cohort.bags, e.probs):
            row = {"slide_id": bag.slide_id, "cohort": e.cohort.name, "label": bag.label, "prediction": int(np.argmax(probs))}
            if bag.group is not None:
                row["group"] = bag.group
            if fold is not None:
                row["fold"] = fold
            row.update({f"prob_{c}": float(p) for c, p in enumerate(probs)})
            rows.append(row)
    with atomic_output(path) as tmp:
        pd.DataFrame(rows).to_csv(tmp, index=False, float_format="%.6g")


def write_attention(path: Path, evaluation: Evaluation) -> None:
    with atomic_output(path) as tmp:
        with writing_h5(tmp) as h5:
            h5.attrs["cohort"] = evaluation.cohort.name
            h5.attrs["description"] = "per-tile attention of the selected MIL head; one group per slide"
            for bag, probs, (scores, coords) in zip(evaluation.cohort.bags, evaluation.probs, evaluation.attention):
                group = h5.create_group(bag.slide_id)
                group.create_dataset("attention", data=scores.astype(np.float32))
                group.create_dataset("coords", data=coords.astype(np.int64))
                group.attrs["label"] = bag.label
                group.attrs["prediction"] = int(np.argmax(probs))
