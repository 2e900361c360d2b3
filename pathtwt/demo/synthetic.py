"""A synthetic H&E whole-slide image: tissue islands with holes and faint regions on white
glass, stroma and nuclei in H&E colours, and a tumour texture whose amount carries the
slide label. Pixels are a pure function of (recipe, position, downsample), so any region
of any level can be rendered on its own and is identical every time.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field, fields

import numpy as np

from pathtwt.demo.paint import paint
from pathtwt.demo.scene import TISSUE, TUMOUR, Layout, build_scene
from pathtwt.demo.styles import STAIN_INTERNAL, TISSUES, NucleusStyle, Stain

BACKGROUND, TISSUE_LABEL, TUMOUR_LABEL = 0, 1, 2  # values of label_map()


@dataclass(frozen=True)
class SlideRecipe:
    """Everything that determines one synthetic slide (JSON-serialisable via to_dict)."""

    key: int  # seeds the layout and every texture
    width: int  # level-0 pixels
    height: int
    mpp: float = 0.25  # level-0 microns per pixel (0.25: a 40x scan)
    tissue: str = "stroma"  # a key of styles.TISSUES
    stain: Stain = field(default_factory=lambda: STAIN_INTERNAL)
    islands: int = 2
    coverage: float = 0.45
    faint_share: float = 0.1
    tumour_share: float = 0.0  # share of tissue with tumour texture (grading)
    tumour_foci: int = 0  # number of small tumour nests (metastasis)
    focus_radius_um: tuple[float, float] = (45.0, 75.0)
    atypia: float = 0.5  # 0..1: how large, dark and irregular the tumour nuclei are

    def to_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict) -> SlideRecipe:
        known = {f.name for f in fields(cls)}
        values = {k: v for k, v in data.items() if k in known}
        values["stain"] = Stain(**{k: tuple(v) if isinstance(v, list) else v for k, v in data["stain"].items()})
        values["focus_radius_um"] = tuple(values.get("focus_radius_um", cls.focus_radius_um))
        return cls(**values)


class SyntheticSlide:
    """Renders a recipe. ``render`` has the signature the pyramidal TIFF writer expects."""

    edge_um = 1.5  # width of the soft tissue and tumour outlines

    def __init__(self, recipe: SlideRecipe):
        if recipe.tissue not in TISSUES:
            raise ValueError(f"unknown tissue style {recipe.tissue!r}; choose one of {sorted(TISSUES)}")
        self.recipe = recipe
        self.width, self.height, self.mpp = recipe.width, recipe.height, recipe.mpp
        self.style = TISSUES[recipe.tissue]
        self.nuclei: tuple[NucleusStyle, NucleusStyle] = (self.style.normal, self.style.tumour_nuclei(recipe.atypia))
        self.edge_px = self.edge_um / recipe.mpp
        layout = Layout(
            width=recipe.width,
            height=recipe.height,
            mpp=recipe.mpp,
            islands=recipe.islands,
            coverage=recipe.coverage,
            faint_share=recipe.faint_share,
            tumour_share=recipe.tumour_share,
            tumour_foci=recipe.tumour_foci,
            focus_radius_um=recipe.focus_radius_um,
        )
        self.scene = build_scene(layout, np.random.default_rng([recipe.key, 0x5CE7E]))

    def render(self, x: int, y: int, w: int, h: int, downsample: float = 1.0) -> np.ndarray:
        """RGB uint8 (h, w, 3) of the level-0 region at (x, y), each pixel covering
        downsample x downsample level-0 pixels. Downsampled levels are the 2 x 2 area
        average of a render at half the downsample, as a scanner's pyramid would be."""
        if downsample >= 2.0:
            fine = paint(self, x, y, 2 * w, 2 * h, downsample / 2.0)
            rgb = fine.reshape(h, 2, w, 2, 3).mean(axis=(1, 3))
        else:
            rgb = paint(self, x, y, w, h, downsample)
        return np.clip(np.rint(rgb), 0, 255).astype(np.uint8)

    def _fields_at(self, downsample: float) -> np.ndarray:
        w = int(np.ceil(self.width / downsample))
        h = int(np.ceil(self.height / downsample))
        return np.stack(self.scene.sample(0, 0, w, h, downsample), axis=-1)

    def label_map(self, downsample: float) -> np.ndarray:
        """Ground truth at pixel centres of a ceil(H/ds) x ceil(W/ds) grid: 0 background,
        1 tissue, 2 tumour tissue."""
        f = self._fields_at(downsample)
        tissue = f[..., TISSUE] > 0
        labels = tissue.astype(np.uint8) * TISSUE_LABEL
        labels[tissue & (f[..., TUMOUR] > 0)] = TUMOUR_LABEL
        return labels

    def tissue_mask(self, downsample: float) -> np.ndarray:
        return self.label_map(downsample) != BACKGROUND

    def tumour_share(self, downsample: float = 8.0) -> float:
        """Share of tissue pixels that carry the tumour texture."""
        labels = self.label_map(downsample)
        tissue = int((labels != BACKGROUND).sum())
        return float((labels == TUMOUR_LABEL).sum()) / tissue if tissue else 0.0

