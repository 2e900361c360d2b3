"""The demo cohorts: which slides exist, their labels, splits and recipes.

Two tasks, each with an internal cohort (train/val/test) and an external cohort (test
only) stained by "another lab":
- ``grading``: 6-class ordinal, ISUP-like 0..5. Grade 0 has no tumour; from grade 1 to 5
  the share of tissue carrying the tumour texture grows and the tumour nuclei become
  larger, darker and more crowded (atypia).
- ``metastasis``: binary lymph-node task; positive slides hold 1-3 small tumour nests.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from pathtwt.errors import ConfigError
from pathtwt.demo.styles import STAIN_EXTERNAL, STAIN_INTERNAL, Stain, jitter_stain
from pathtwt.demo.synthetic import SlideRecipe

GRADES = 6
# Tumour share of the tissue per grade: disjoint ranges so the label is recoverable.
GRADE_TUMOUR_SHARE: tuple[tuple[float, float], ...] = (
    (0.0, 0.0),
    (0.06, 0.14),
    (0.18, 0.28),
    (0.32, 0.44),
    (0.48, 0.60),
    (0.66, 0.80),
)


@dataclass(frozen=True)
class CohortSpec:
    name: str
    task: str  # "grading" | "metastasis"
    tissue: str  # a key of styles.TISSUES
    stain: Stain
    splits: dict[str, int]  # split -> slides per class

    @property
    def classes(self) -> int:
        return GRADES if self.task == "grading" else 2


@dataclass(frozen=True)
class Scale:
    width: int  # level-0 size of every slide
    height: int
    mpp: float
    mask_downsample: int
    cohorts: tuple[CohortSpec, ...]
    islands: tuple[int, int] = (1, 3)  # inclusive range of tissue islands per slide
    coverage: tuple[float, float] = (0.46, 0.56)
    focus_radius_um: tuple[float, float] = (50.0, 90.0)  # metastasis nests


def _cohorts(grading: dict, grading_ext: dict, metastasis: dict, metastasis_ext: dict) -> tuple[CohortSpec, ...]:
    return (
        CohortSpec("grading", "grading", "stroma", STAIN_INTERNAL, grading),
        CohortSpec("grading-external", "grading", "stroma", STAIN_EXTERNAL, grading_ext),
        CohortSpec("metastasis", "metastasis", "lymph-node", STAIN_INTERNAL, metastasis),
        CohortSpec("metastasis-external", "metastasis", "lymph-node", STAIN_EXTERNAL, metastasis_ext),
    )


SCALES: dict[str, Scale] = {
    # ~10-15 tissue tiles of 224 px at 0.5 µm/px per slide, 104 slides: about a thousand
    # tiles, which a CPU embeds with a ViT-S in a couple of minutes.
    "demo": Scale(
        width=2560,
        height=2048,
        mpp=0.25,
        mask_downsample=8,  # the coarsest level
        cohorts=_cohorts(
            grading={"train": 5, "val": 1, "test": 2},
            grading_ext={"test": 2},
            metastasis={"train": 10, "val": 2, "test": 4},
            metastasis_ext={"test": 6},
        ),
    ),
    # A few small slides per cohort, for fast tests of every stage.
    "test": Scale(
        width=1024,
        height=1024,
        mpp=0.25,
        mask_downsample=4,  # the coarsest level of a 1024-px slide
        cohorts=_cohorts(
            grading={"train": 1, "val": 1, "test": 1},
            grading_ext={"test": 1},
            metastasis={"train": 2, "val": 1, "test": 1},
            metastasis_ext={"test": 2},
        ),
        # one island covering most of the small slide, so every slide has tissue tiles
        islands=(1, 1),
        coverage=(0.55, 0.6),
        focus_radius_um=(30.0, 45.0),
    ),
}


@dataclass(frozen=True)
class PlannedSlide:
    slide_id: str
    label: int
    split: str
    recipe: SlideRecipe


def _slide_key(seed: int, cohort_index: int, slide_index: int) -> np.random.SeedSequence:
    # Independent of generation order and of the other cohorts' sizes; slide_index 0 is
    # the cohort's own stream (the id shuffle), slides count from 1.
    return np.random.SeedSequence([int(seed), 0xDE30, cohort_index, slide_index])


def plan_cohort(spec: CohortSpec, cohort_index: int, scale: Scale, *, seed: int) -> list[PlannedSlide]:
    """Slides of one cohort in id order; ids are shuffled against labels so that the
    id never reveals the class."""
    rows = [(label, split) for split, n in spec.splits.items() for label in range(spec.classes) for _ in range(n)]
    order = np.random.default_rng(_slide_key(seed, cohort_index, 0).generate_state(1)[0]).permutation(len(rows))
    planned = []
    for index, row in enumerate(order):
        label, split = rows[int(row)]
        ss = _slide_key(seed, cohort_index, index + 1)
        rng = np.random.default_rng(ss)
        planned.append(
            PlannedSlide(
                slide_id=f"{spec.name}-{index:03d}",
                label=label,
                split=split,
                recipe=_recipe(spec, scale, label, rng, key=int(ss.generate_state(1)[0])),
            )
        )
    return planned


def _recipe(spec: CohortSpec, scale: Scale, label: int, rng: np.random.Generator, *, key: int) -> SlideRecipe:
    common = {
        "key": key,
        "width": scale.width,
        "height": scale.height,
        "mpp": scale.mpp,
        "tissue": spec.tissue,
        "stain": jitter_stain(spec.stain, rng, amount=0.03),
        "islands": int(rng.integers(scale.islands[0], scale.islands[1] + 1)),
        "coverage": float(rng.uniform(*scale.coverage)),
        "faint_share": float(rng.uniform(0.05, 0.15)),
    }
    if spec.task == "grading":
        lo, hi = GRADE_TUMOUR_SHARE[label]
        return SlideRecipe(**common, tumour_share=float(rng.uniform(lo, hi)), atypia=label / (GRADES - 1))
    foci = int(rng.integers(1, 4)) if label == 1 else 0
    return SlideRecipe(**common, tumour_foci=foci, focus_radius_um=scale.focus_radius_um, atypia=0.5)


def single_slide_recipe(
    *,
    width: int,
    height: int,
    mpp: float = 0.25,
    task: str = "grading",
    label: int = 3,
    external: bool = False,
    islands: int = 2,
    seed: int = 0,
) -> SlideRecipe:
    """One slide outside the cohorts (benchmarks, reader tests), drawn like a cohort slide
    of the given task and label."""
    spec = CohortSpec(
        name="single",
        task=task,
        tissue="stroma" if task == "grading" else "lymph-node",
        stain=STAIN_EXTERNAL if external else STAIN_INTERNAL,
        splits={"test": 1},
    )
    if not 0 <= label < spec.classes:
        raise ConfigError(f"--label {label} is not a {task} class: choose 0..{spec.classes - 1}")
    if width < 64 or height < 64 or islands < 1:
        raise ConfigError(f"slide of {width} x {height} with {islands} islands: width and height must be >= 64, islands >= 1")
    scale = Scale(width=width, height=height, mpp=mpp, mask_downsample=16, cohorts=(spec,), islands=(islands, islands))
    ss = _slide_key(seed, len(SCALES["demo"].cohorts), 1)  # a stream no demo cohort uses
    return _recipe(spec, scale, label, np.random.default_rng(ss), key=int(ss.generate_state(1)[0]))


def planned_slides(scale: str = "demo", *, seed: int = 0) -> dict[str, list[PlannedSlide]]:
    """Cohort -> its slides (id, label, split, recipe) without rendering anything: what
    ``pathtwt demo make-slides`` will write, for workflows that need the slide list up
    front."""
    if scale not in SCALES:
        raise ConfigError(f"unknown demo scale {scale!r}: choose one of {', '.join(SCALES)}")
    spec = SCALES[scale]
    return {c.name: plan_cohort(c, i, spec, seed=seed) for i, c in enumerate(spec.cohorts)}
