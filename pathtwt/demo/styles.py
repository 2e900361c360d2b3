"""Colours and cell shapes of the synthetic H&E slides, as data.

Colour follows the Beer-Lambert model used by stain-deconvolution methods (Ruifrok &
Johnston 2001): each pixel's optical density is a sum of per-stain concentrations times
the stain's absorbance vector, and RGB = 255 * exp(-OD). A different lab's staining is a
different pair of absorbance vectors and intensity, while the concentrations (the tissue
content that carries the label) stay the same.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field

import numpy as np


def _unit(v: tuple[float, float, float]) -> tuple[float, float, float]:
    a = np.asarray(v, dtype=np.float64)
    a = a / np.linalg.norm(a)
    return (float(a[0]), float(a[1]), float(a[2]))


@dataclass(frozen=True)
class Stain:
    """Absorbance of one staining protocol."""

    hematoxylin: tuple[float, float, float]  # OD (R, G, B) per unit concentration
    eosin: tuple[float, float, float]
    intensity: float = 1.0  # scales every concentration: under-/over-staining
    background: tuple[float, float, float] = (0.035, 0.04, 0.035)  # glass and mounting medium

    def to_dict(self) -> dict:
        return asdict(self)


# Ruifrok & Johnston's H&E absorbance vectors: purple-blue nuclei, pink stroma.
STAIN_INTERNAL = Stain(hematoxylin=_unit((0.650, 0.704, 0.286)), eosin=_unit((0.072, 0.990, 0.105)))
# Another lab: bluer hematoxylin, red eosin, darker overall, yellowish glass.
STAIN_EXTERNAL = Stain(
    hematoxylin=_unit((0.66, 0.72, 0.22)),
    eosin=_unit((0.03, 0.86, 0.50)),
    intensity=1.2,
    background=(0.025, 0.04, 0.065),
)


def jitter_stain(base: Stain, rng: np.random.Generator, *, amount: float) -> Stain:
    """Slide-to-slide variation of one protocol: small changes in hue and intensity."""

    def shift(v: tuple[float, float, float]) -> tuple[float, float, float]:
        return _unit(tuple(np.clip(np.asarray(v) + rng.normal(0.0, amount, 3), 0.01, None)))

    return Stain(
        hematoxylin=shift(base.hematoxylin),
        eosin=shift(base.eosin),
        intensity=float(base.intensity * rng.uniform(1 - 2 * amount, 1 + 2 * amount)),
        background=base.background,
    )


@dataclass(frozen=True)
class NucleusStyle:
    """One population of nuclei, placed one per cell of a jittered grid (sizes in µm, so a
    slide scanned at another resolution shows the same cells)."""

    spacing_um: float
    presence: float  # probability that a grid cell holds a nucleus
    radius_um: tuple[float, float]  # geometric-mean radius range
    elongation: tuple[float, float]  # major / minor axis ratio range
    darkness: tuple[float, float]  # hematoxylin concentration range

    def coverage(self) -> float:
        """Expected share of area covered by nuclei (overlapping discs: 1 - exp(-density)),
        what nuclei average to when a pixel is much larger than a nucleus."""
        r0, r1 = self.radius_um
        mean_r2 = (r0 * r0 + r0 * r1 + r1 * r1) / 3.0
        return float(1.0 - np.exp(-self.presence * np.pi * mean_r2 / self.spacing_um**2))

    def mean_darkness(self) -> float:
        return float(sum(self.darkness) / 2.0)


@dataclass(frozen=True)
class TissueStyle:
    """Background staining of a tissue type and its two nucleus populations."""

    eosin: float  # stroma eosin concentration
    hematoxylin: float  # stroma hematoxylin (cytoplasm tint)
    fibre_um: float  # feature size of the fibrous stroma texture
    normal: NucleusStyle
    tumour: NucleusStyle  # at atypia 0; see ``tumour_nuclei``
    tumour_eosin: float  # multiplies eosin inside tumour regions
    tumour_hematoxylin: float  # added cytoplasm hematoxylin inside tumour regions
    atypia_growth: dict = field(default_factory=lambda: {"radius": 0.6, "darkness": 0.25, "presence": 0.15})

    def tumour_nuclei(self, atypia: float) -> NucleusStyle:
        """Higher grade: larger, darker, more crowded and more irregular tumour nuclei."""
        g = self.atypia_growth
        t = self.tumour
        grow = 1.0 + g["radius"] * atypia
        dark = 1.0 + g["darkness"] * atypia
        return NucleusStyle(
            spacing_um=t.spacing_um,
            presence=min(1.0, t.presence + g["presence"] * atypia),
            radius_um=(t.radius_um[0] * grow, t.radius_um[1] * grow),
            elongation=(t.elongation[0], t.elongation[1] + 0.8 * atypia),
            darkness=(t.darkness[0] * dark, t.darkness[1] * dark),
        )


TISSUES: dict[str, TissueStyle] = {
    # Prostate-like stroma: pink fibres with sparse spindle nuclei; tumour is crowded
    # round dark nuclei with purple-tinted cytoplasm (the graded cohort).
    "stroma": TissueStyle(
        eosin=0.55,
        hematoxylin=0.10,
        fibre_um=6.0,
        normal=NucleusStyle(spacing_um=14.0, presence=0.45, radius_um=(2.2, 3.0), elongation=(2.0, 4.0), darkness=(0.8, 1.1)),
        tumour=NucleusStyle(spacing_um=10.0, presence=0.8, radius_um=(3.0, 4.0), elongation=(1.0, 1.4), darkness=(0.9, 1.15)),
        tumour_eosin=0.6,
        tumour_hematoxylin=0.25,
    ),
    # Lymph-node-like: densely packed small dark lymphocytes on little eosin; a
    # metastasis is a nest of large pale epithelial nuclei with pink cytoplasm.
    "lymph-node": TissueStyle(
        eosin=0.45,
        hematoxylin=0.12,
        fibre_um=4.0,
        normal=NucleusStyle(spacing_um=7.5, presence=0.85, radius_um=(2.6, 3.3), elongation=(1.0, 1.2), darkness=(1.0, 1.3)),
        tumour=NucleusStyle(spacing_um=12.0, presence=0.9, radius_um=(4.5, 6.0), elongation=(1.1, 1.6), darkness=(0.7, 0.95)),
        tumour_eosin=1.5,
        tumour_hematoxylin=0.0,
    ),
}
