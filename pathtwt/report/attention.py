"""The report's MIL attention figures.

For each task and each class, the slide of the task's own cohort that the teacher's
first attention head (lowest seed) classified correctly with the highest probability: a
slide of the test split, or, in a cross-validation, a slide tested out of fold. A binary
task thus shows a positive slide beside a negative one, and each figure can show whether
attention finds what the label is about. One figure per slide: the per-tile attention of
every variant (columns) and head (rows) over the slide's tiling thumbnail.

A near-uniform map (no tile holds twice a uniform share of the slide's attention) scaled
to its own maximum would paint every tile the top colour and hide the tissue; it is drawn
faint instead, and its panel says it is near-uniform.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from pathtwt.explain.grid import attention_grid, grid_pitch, scale_scores
from pathtwt.io.atomic import atomic_output
from pathtwt.io.layout import TILES, UNCOMPRESSED
from pathtwt.mil import heads as mil_heads
from pathtwt.mil.layout import run_dir

# the task's own cohort in metrics.json and predictions.csv: its test split, or its
# out-of-fold slides in a cross-validation (each fold's run tests its own fold as "test")
INTERNAL = "test"
# near-uniform: the most attended tile holds less than this multiple of 1/N
NEAR_UNIFORM = 2.0
ALPHA, FAINT_ALPHA = 0.7, 0.2


def near_uniform(scores: Any) -> bool:
    """True when no tile holds ``NEAR_UNIFORM`` times a uniform share of the scores (a bag
    of one tile is uniform)."""
    s = np.asarray(scores, dtype=np.float64).reshape(-1)
    total = float(s.sum())
    if len(s) < 2 or total <= 0:
        return True
    return float(s.max()) / total * len(s) < NEAR_UNIFORM


@dataclass(frozen=True)
class Pick:
    """A slide chosen for a figure: the reference head's prediction on it was right."""

    slide: str
    label: int
    probability: float  # the reference head's probability of the true (= predicted) class
    fold: int | None  # the fold whose heads tested it out of fold (None: a test split)


def _runs(results: Path, row: Any, task: str, head: str | None = None, variant: str | None = None,
          backbone: str | None = None) -> list[tuple[int | None, Path]]:
    """(fold, run folder) of the row's lowest seed: one run of a test split, one per fold
    of a cross-validation."""
    backbone, variant, head = backbone or row.backbone, variant or row.variant, head or row.head
    seed = row.seeds[0]
    if not getattr(row, "folds", None):
        return [(None, Path(run_dir(backbone, variant, task, head, seed, results=str(results))))]
    task_dir = Path(run_dir(backbone, variant, task, head, seed, 0, results=str(results))).parent.parent
    folds = sorted(int(p.name[4:]) for p in task_dir.glob("fold*") if p.name[4:].isdigit())
    return [(f, Path(run_dir(backbone, variant, task, head, seed, f, results=str(results)))) for f in folds]


def pick_slides(results: Path, row: Any, task: str, per_class: int) -> tuple[list[Pick], list[int]]:
    """Per class of the task's own cohort, the ``per_class`` slides ``row``'s head (lowest
    seed) classified correctly with the highest probability (ties by slide id), from its
    predictions.csv; and the classes with no correctly classified slide."""
    from pathtwt.mil.summary import read_predictions

    right: list[Pick] = []
    classes: set[int] = set()
    for fold, path in _runs(results, row, task):
        p = read_predictions(path).get(INTERNAL)
        if not p:
            continue
        for slide, label, pred, probs in zip(p["slide_id"], p["label"], p["prediction"], p["probs"]):
            classes.add(int(label))
            if pred == label and int(label) < len(probs):
                right.append(Pick(str(slide), int(label), float(probs[int(label)]), fold))
    picks, missing = [], []
    for c in sorted(classes):
        best = sorted((x for x in right if x.label == c), key=lambda x: (-x.probability, x.slide))[:per_class]
        picks += best
        if not best:
            missing.append(c)
    return picks, missing


def slide_background(results: Path, slide: str) -> tuple[np.ndarray, float, float] | None:
    """The slide's tiling thumbnail and its scale (thumbnail px per level-0 px in x, y),
    from ``results/thumbnails/*/{slide}.png`` and the coords file beside it."""
    from PIL import Image

    from pathtwt.io.h5 import read_attrs

    for png in sorted((results / "thumbnails").glob(f"*/{slide}.png")):
        coords = results / TILES.format(cohort=png.parent.name, slide=slide)
        if not coords.is_file():
            continue
        try:
            attrs = read_attrs(coords)
            image = np.asarray(Image.open(png).convert("RGB"))
            w, h = float(attrs["level0_width"]), float(attrs["level0_height"])
        except (OSError, KeyError, ValueError):
            continue
        return image, image.shape[1] / w, image.shape[0] / h
    return None


def draw_panel(ax: Any, scores: np.ndarray, coords: np.ndarray, background: tuple[np.ndarray, float, float] | None) -> tuple[Any, bool]:
    """One variant's attention on one axis, over the thumbnail where there is one; returns
    the image (for the colour bar) and whether the map is near-uniform (drawn faint)."""
    flat = near_uniform(scores)
    pitch = grid_pitch(coords)
    grid = attention_grid(coords, scale_scores(scores, "max"), pitch)
    alpha = FAINT_ALPHA if flat else ALPHA
    if background is None:
        return ax.imshow(grid, cmap="inferno", vmin=0, vmax=1, interpolation="nearest", alpha=alpha if flat else None), flat
    image, sx, sy = background
    x0, y0 = (int(v) for v in np.asarray(coords).min(axis=0))
    ax.imshow(image)
    extent = (x0 * sx, (x0 + grid.shape[1] * pitch) * sx, (y0 + grid.shape[0] * pitch) * sy, y0 * sy)
    return ax.imshow(grid, cmap="inferno", vmin=0, vmax=1, interpolation="nearest", alpha=alpha, extent=extent), flat


def _attention(path: Path, slide: str) -> tuple[np.ndarray, np.ndarray, Any] | str:
    """(scores, coords, prediction) of a slide in an attention file, or why there are none."""
    import h5py

    if not path.is_file():
        return "no run"
    with h5py.File(path, "r") as h5:
        if slide not in h5:
            return "slide not evaluated"
        group = h5[slide]
        return group["attention"][()], group["coords"][()], group.attrs.get("prediction")


def how_tested(pick: Pick) -> str:
    if pick.fold is None:
        return "tested on the test split (held out from training and from the choice of epoch)"
    return f"tested out of fold (by the heads of fold {pick.fold}, which did not train on it)"


def attention_figures(results: Path, out: Path, task: str, rows: list, per_class: int) -> tuple[list[tuple[str, str]], list[str]]:
    """The task's figures (path under ``out``, caption) and notes (classes without a
    figure), ``per_class`` slides of each class (see the module's docstring)."""
    # a registered head without per-tile attention has nothing to draw
    no_attention = set(mil_heads.names()) - set(mil_heads.attention_names())
    rows = [r for r in rows if getattr(r, "role", "variant") != "chance" and r.seeds and r.head not in no_attention]
    if per_class <= 0 or not rows:
        return [], []
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    ref = next((r for r in rows if r.variant == UNCOMPRESSED), rows[0])
    reference = f"{'teacher' if ref.variant == UNCOMPRESSED else ref.variant}'s {mil_heads.get_head(ref.head).display} head (seed {ref.seeds[0]})"
    picks, missing = pick_slides(results, ref, task, per_class)
    columns = list(dict.fromkeys((r.backbone, r.variant) for r in rows))
    several = len({b for b, _ in columns}) > 1
    heads = list(dict.fromkeys(r.head for r in rows))
    by_key = {(r.backbone, r.variant, r.head): r for r in rows}
    figs = []
    for pick in picks:
        background = slide_background(results, pick.slide)
        # Panels as tall as the thumbnail is, laid out by constrained layout so titles and
        # colour bar take only their own room.
        aspect = background[0].shape[0] / background[0].shape[1] if background is not None else 1.0
        fig, axes = plt.subplots(len(heads), len(columns), squeeze=False, layout="constrained",
                                 figsize=(3.2 * len(columns) + 0.8, (3.2 * aspect + 0.45) * len(heads) + 0.3))
        im, faint, drawn_any = None, False, False
        for i, head in enumerate(heads):
            for j, (backbone, variant) in enumerate(columns):
                ax = axes[i][j]
                ax.set_axis_off()
                name = f"{backbone} {variant}" if several else variant
                row = by_key.get((backbone, variant, head))
                runs = [] if row is None else [p for f, p in _runs(results, row, task) if f == pick.fold]
                got = _attention(runs[0] / "attention" / f"{INTERNAL}.h5", pick.slide) if runs else "no run"
                if isinstance(got, str):
                    ax.set_title(f"{name} / {head}: {got}", fontsize=8)
                    continue
                scores, coords, pred = got
                if len(scores) == 0:
                    continue
                drawn, flat = draw_panel(ax, scores, coords, background)
                drawn_any = True
                if not flat:
                    im = drawn
                faint |= flat
                ax.set_title(f"{name} / {head}: predicted {pred}" + ("\nnear-uniform (drawn faint)" if flat else ""),
                             fontsize=8)
        if not drawn_any:
            plt.close(fig)
            continue
        where = "test split" if pick.fold is None else f"out of fold, fold {pick.fold}"
        fig.suptitle(f"{task}, class {pick.label}: slide {pick.slide} ({where})", fontsize=9)
        if im is not None:
            fig.colorbar(im, ax=axes.ravel().tolist(), fraction=0.025, label="attention / slide max")
        name = f"attention_{task}_{pick.slide}.png"
        with atomic_output(out / "figures" / name) as tmp:
            fig.savefig(tmp, dpi=90, bbox_inches="tight", format="png")
        plt.close(fig)
        seeds = sorted({r.seeds[0] for r in rows})
        figs.append((f"figures/{name}", (
            f"{task}, class {pick.label}: slide {pick.slide}, {how_tested(pick)}; of the slides of class {pick.label}, "
            f"the one the {reference} classified correctly with the highest probability ({pick.probability:.2f}). "
            f"Attention of every variant (columns) and head (rows), seed {'/'.join(map(str, seeds))}, each scaled to "
            "its own maximum on this slide, "
            + ("over the slide's tiling thumbnail." if background is not None else "one square per tile (no thumbnail).")
            + (f" Panels marked near-uniform: no tile holds {NEAR_UNIFORM:g} times a uniform share of the attention, "
               "so the map says little about where the head looked; drawn faint so the tissue shows." if faint else "")
        )))
    notes = []
    if missing:
        where = "out-of-fold slides" if ref.folds else "test split"
        notes.append(f"{task}: the {reference} classified no slide of class {', '.join(map(str, missing))} of the "
                     f"{where} correctly, so no attention figure shows that class.")
    return figs, notes
