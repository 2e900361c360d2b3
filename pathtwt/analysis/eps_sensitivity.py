"""Number of blocks of the exact min-blocks partition as eps sweeps its range, for one
or several backbones (read from `pathtwt discover` folders)."""

from __future__ import annotations

import json
import os
from pathlib import Path

import numpy as np

from pathtwt.compress.partition import check_similarity, eps_sweep
from pathtwt.errors import ConfigError


def load_discovery(folder: str | os.PathLike) -> tuple[str, np.ndarray]:
    """(backbone name, S) from a discover output folder."""
    folder = Path(folder)
    matrix, plan = folder / "similarity.npy", folder / "plan.json"
    if not matrix.is_file():
        raise ConfigError(f"{folder}: no similarity.npy; run `pathtwt discover --out {folder}` first")
    name = json.loads(plan.read_text()).get("backbone", folder.name) if plan.is_file() else folder.name
    return str(name), check_similarity(np.load(matrix))


def sensitivity(matrices: dict[str, np.ndarray], n_eps: int = 41) -> tuple[np.ndarray, dict[str, list[int]]]:
    """One shared eps grid from 0 to the largest discrepancy of any backbone, and the
    block counts of each backbone on it."""
    top = max(float(S.max()) for S in matrices.values())
    grid = np.linspace(0.0, top, n_eps)
    return grid, {name: eps_sweep(S, grid) for name, S in matrices.items()}
