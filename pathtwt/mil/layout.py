"""Where a MIL run lives: the one function that builds a run folder's path, and the one
that reads it back (the workflow, the report and anything that loads trained heads use
these two, so the layout is stated once).

    {results}/mil/{backbone}/{variant}/{task}/{head}/seed{n}/            one split
    {results}/mil/{backbone}/{variant}/{task}/{head}/fold{f}/seed{n}/    test fold f of k-fold CV

where ``{results}`` is a study's results folder (``results/{study}`` in the workflow).

A run folder holds ``metrics.json`` (written last: the run finished; it carries the
config), ``predictions.csv`` and ``checkpoint.pt`` (the head with its config), so a
folder describes itself. Torch-free: Snakemake imports it.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import PurePosixPath

from pathtwt.io import layout
from pathtwt.mil import heads

# a run folder's {head} component is a head's registry name
HEADS = heads.names()
_SEED = re.compile(r"^seed(\d+)$")
_FOLD = re.compile(r"^fold(\d+)$")


def run_dir(backbone: str, variant: str, task: str, head: str, seed: int | str, fold: int | str | None = None,
            results: str = "results") -> str:
    """The run folder of one (backbone variant, task, head, [fold,] seed), from the
    templates of :mod:`pathtwt.io.layout`. Wildcard patterns are built by passing "{seed}"
    and the like."""
    template = layout.MIL_RUN_DIR if fold is None else layout.MIL_FOLD_RUN_DIR
    return f"{results}/" + template.format(backbone=backbone, variant=variant, task=task, head=head, seed=seed, fold=fold)


@dataclass(frozen=True)
class RunKey:
    backbone: str
    variant: str
    task: str
    head: str
    seed: int
    fold: int | None


def parse_run_dir(path, results) -> RunKey | None:
    """The key of a run folder under ``results`` (None for a folder of another layout)."""
    rel = PurePosixPath(*PurePosixPath(str(path)).parts).relative_to(PurePosixPath(str(results)) / "mil").parts
    seed = _SEED.match(rel[-1]) if rel else None
    if seed is None or len(rel) not in (5, 6):
        return None
    fold = None
    if len(rel) == 6:
        m = _FOLD.match(rel[4])
        if m is None:
            return None
        fold = int(m.group(1))
    return RunKey(rel[0], rel[1], rel[2], rel[3], int(seed.group(1)), fold)
