"""Planted-signal MIL cohorts for the tests (helpers, not tests): bags of random
embeddings in which a few *key* instances (background + a fixed direction) decide the
label, so both heads must learn the task and attend to the key instances.

- ``metastasis``: label 1 iff the bag holds 1..3 key instances (binary detection);
- ``grading``: the share of key instances sets the grade (0, ~step, ~2 step, ...).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd

from pathtwt.io.atomic import atomic_output
from pathtwt.io.h5 import write_features


@dataclass
class PlantedCohort:
    table: pd.DataFrame  # slide_id, label, split
    keys: dict[str, np.ndarray]  # slide_id -> boolean mask of the key instances
    labels_csv: Path
    features_dir: Path


def planted_bag(rng: np.random.Generator, *, n: int, n_keys: int, direction: np.ndarray, strength: float) -> tuple[np.ndarray, np.ndarray]:
    features = rng.standard_normal((n, len(direction))).astype(np.float32)
    keys = np.zeros(n, dtype=bool)
    keys[rng.choice(n, size=n_keys, replace=False)] = True
    features[keys] += strength * direction.astype(np.float32)
    return features, keys


def write_planted_cohort(
    out_dir: str | Path,
    *,
    task: str,
    splits: dict[str, int],
    dim: int = 32,
    n_classes: int = 2,
    bag_size: tuple[int, int] = (30, 60),
    strength: float = 3.0,
    grade_share_step: float = 0.15,
    seed: int = 0,
    direction_seed: int = 1234,
) -> PlantedCohort:
    """Write ``out_dir/features/{slide}.h5`` and ``out_dir/labels.csv`` for ``splits``
    (split name -> number of bags). ``direction_seed`` fixes the key direction, so two
    cohorts with different ``seed`` share the signal (e.g. an external cohort)."""
    out_dir = Path(out_dir)
    direction = np.random.default_rng(direction_seed).standard_normal(dim)
    direction /= np.linalg.norm(direction)
    rng = np.random.default_rng(seed)
    rows, keys = [], {}
    for split, count in splits.items():
        for i in range(count):
            slide_id = f"{split}-{i:03d}"
            label = int(i % n_classes)  # balanced classes
            n = int(rng.integers(bag_size[0], bag_size[1] + 1))
            if task == "metastasis":
                n_keys = int(rng.integers(1, 4)) if label == 1 else 0
            elif task == "grading":
                share = label * grade_share_step + (rng.uniform(-0.03, 0.03) if label else 0.0)
                n_keys = int(round(max(0.0, share) * n))
            else:
                raise ValueError(f"unknown planted task {task!r}")
            features, mask = planted_bag(rng, n=n, n_keys=n_keys, direction=direction, strength=strength)
            coords = np.stack([np.arange(n) % 16 * 224, np.arange(n) // 16 * 224], axis=1)
            write_features(out_dir / "features" / f"{slide_id}.h5", features, coords, {"status": "ok", "variant": "planted"})
            rows.append({"slide_id": slide_id, "label": label, "split": split})
            keys[slide_id] = mask
    table = pd.DataFrame(rows)
    with atomic_output(out_dir / "labels.csv") as tmp:
        table.to_csv(tmp, index=False)
    return PlantedCohort(table=table, keys=keys, labels_csv=out_dir / "labels.csv", features_dir=out_dir / "features")
