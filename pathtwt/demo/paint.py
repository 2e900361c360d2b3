"""Painting H&E pixels for any region of a synthetic slide at any downsample.

Stain concentrations come from the scene fields (interpolated), a fibrous texture (value
noise) and nuclei drawn with anti-aliased ellipses; the stain model turns them into RGB.
"""

from __future__ import annotations

from typing import Any, Protocol

import cv2
import numpy as np

from pathtwt.demo.noise import bilinear_points, hash_uniform, value_noise
from pathtwt.demo.scene import FAINT, INTENSITY, TISSUE, TUMOUR
from pathtwt.demo.styles import NucleusStyle, Stain


class SyntheticSlide(Protocol):
    """What painting reads of a slide (pathtwt.demo.synthetic.SyntheticSlide provides it)."""

    recipe: Any
    mpp: float
    edge_px: float
    scene: Any
    style: Any
    nuclei: tuple[NucleusStyle, NucleusStyle]


# Nuclei are drawn one by one while the smallest is at least this many output pixels in
# radius; below that they are painted as their mean coverage.
DRAW_MIN_RADIUS_PX = 1.0
_NUCLEUS_SCALE = 120.0  # uint8 value per unit hematoxylin concentration in the nuclei layer
_SHIFT = 4  # cv2 fixed-point bits: sub-pixel nucleus centres and axes
FAINT_LOSS = 0.45  # share of stain missing at the heart of a faint region


def paint(slide: SyntheticSlide, x: float, y: float, w: int, h: int, ds: float) -> np.ndarray:
    """Float RGB (h, w, 3) in [0, 255] of the level-0 region starting at (x, y), one output
    pixel per ds x ds level-0 pixels, sampled at pixel centres."""
    f = slide.scene.sample(x, y, w, h, ds)
    inv_edge = np.float32(1.0 / slide.edge_px)
    alpha = np.clip(f[TISSUE] * inv_edge + 0.5, 0.0, 1.0)
    tumour = np.clip(f[TUMOUR] * inv_edge + 0.5, 0.0, 1.0)
    tumour *= alpha
    strength = 1.0 - FAINT_LOSS * f[FAINT]
    strength *= f[INTENSITY]
    strength *= alpha * np.float32(slide.recipe.stain.intensity)

    style = slide.style
    fibre_px = style.fibre_um / slide.mpp
    cx, cy = x + 0.5 * ds, y + 0.5 * ds
    noise = {"step": ds, "w": w, "h": h, "key": slide.recipe.key}
    texture = value_noise(cx, cy, scale=fibre_px, channel=1, **noise)
    texture *= 0.45
    texture += 0.25 * value_noise(cx, cy, scale=fibre_px / 3.0, channel=2, **noise) + 0.6
    eosin = strength * np.float32(style.eosin)
    eosin *= texture
    eosin *= 1.0 + np.float32(style.tumour_eosin - 1.0) * tumour
    hema = strength * np.float32(style.hematoxylin)
    hema += np.float32(style.tumour_hematoxylin) * tumour * strength

    stain = slide.recipe.stain
    smallest_um = min(n.radius_um[0] for n in slide.nuclei)
    if smallest_um / slide.mpp / ds >= DRAW_MIN_RADIUS_PX:
        nuclei = _drawn_nuclei(slide, x, y, w, h, ds)
        # chromatin: nuclei are not flat discs
        nuclei *= 0.8 + 0.4 * value_noise(cx, cy, scale=1.2 / slide.mpp, channel=3, **noise)
        return _to_rgb(hema, eosin, nuclei * strength, stain)
    # Nuclei far below a pixel: mix the colours of nucleus and stroma by the expected
    # covered area (mixing in RGB, not in optical density, as averaging pixels would).
    normal, malignant = slide.nuclei
    cover = np.float32(normal.coverage()) + np.float32(malignant.coverage() - normal.coverage()) * tumour
    dark = np.float32(normal.mean_darkness()) + np.float32(malignant.mean_darkness() - normal.mean_darkness()) * tumour
    stroma = _to_rgb(hema, eosin, None, stain)
    nuclear = _to_rgb(hema, eosin, dark * strength, stain)
    return stroma + (nuclear - stroma) * cover[..., None]


def _to_rgb(hema: np.ndarray, eosin: np.ndarray, nuclei: np.ndarray | None, stain: Stain) -> np.ndarray:
    """Beer-Lambert: RGB = 255 exp(-OD); nuclei add hematoxylin and displace eosin."""
    if nuclei is not None:
        hema = hema + nuclei
        eosin = eosin * (1.0 - 0.6 * np.minimum(nuclei, 1.0))
    channels = []
    for c in range(3):
        neg_od = hema * np.float32(-stain.hematoxylin[c])
        neg_od -= eosin * np.float32(stain.eosin[c])
        neg_od -= np.float32(stain.background[c])
        channels.append(cv2.exp(neg_od))  # a few times faster than np.exp on float32
    rgb = cv2.merge(channels)
    rgb *= 255.0
    return rgb


def _drawn_nuclei(slide: SyntheticSlide, x: float, y: float, w: int, h: int, ds: float) -> np.ndarray:
    """Hematoxylin of the nuclei touching the region: one layer, both populations; each
    nucleus belongs to the tumour or the normal population by where its centre lies."""
    layer = np.zeros((h, w), np.uint8)
    for population, style in enumerate(slide.nuclei):
        cx, cy, a, b, angle, dark = _nucleus_params(slide, style, population, x, y, w * ds, h * ds)
        if len(cx) == 0:
            continue
        scene = slide.scene
        at = bilinear_points(scene.grid, scene.lattice(cx), scene.lattice(cy))
        in_tumour = at[:, TUMOUR] > 0
        keep = (at[:, TISSUE] > -slide.edge_px) & (in_tumour if population == 1 else ~in_tumour)
        scale = float(1 << _SHIFT)
        # level-0 position -> output pixel coordinates, where pixel i's centre is at i
        px = np.round(((cx[keep] - x) / ds - 0.5) * scale).astype(np.int64)
        py = np.round(((cy[keep] - y) / ds - 0.5) * scale).astype(np.int64)
        ax = np.maximum(np.round(a[keep] / ds * scale), 1).astype(np.int64)
        by = np.maximum(np.round(b[keep] / ds * scale), 1).astype(np.int64)
        value = np.clip(dark[keep] * _NUCLEUS_SCALE, 0, 255).astype(np.int64)
        for i in range(len(px)):
            cv2.ellipse(
                layer, (int(px[i]), int(py[i])), (int(ax[i]), int(by[i])), float(angle[keep][i]),
                0, 360, int(value[i]), -1, cv2.LINE_AA, _SHIFT,
            )  # fmt: skip
    return layer.astype(np.float32) / _NUCLEUS_SCALE


def _nucleus_params(
    slide: SyntheticSlide, style: NucleusStyle, population: int, x: float, y: float, w0: float, h0: float
) -> tuple[np.ndarray, ...]:
    """Centres, semi-axes (level-0 px), angles and darkness of the nuclei whose ellipse
    may touch the level-0 box [x, x + w0) x [y, y + h0): one candidate per grid cell."""
    spacing = style.spacing_um / slide.mpp
    reach = style.radius_um[1] * np.sqrt(style.elongation[1]) / slide.mpp + spacing
    ix = np.arange(int(np.floor((x - reach) / spacing)), int(np.floor((x + w0 + reach) / spacing)) + 1)
    iy = np.arange(int(np.floor((y - reach) / spacing)), int(np.floor((y + h0 + reach) / spacing)) + 1)
    gx, gy = np.meshgrid(ix, iy)
    gx, gy = gx.ravel(), gy.ravel()
    key = slide.recipe.key

    def u(channel: int) -> np.ndarray:
        return hash_uniform(gx, gy, key=key, channel=16 + 8 * population + channel)

    present = u(0) < style.presence
    gx, gy = gx[present], gy[present]  # u(k) below is evaluated on the kept cells only
    cx = (gx + 0.1 + 0.8 * u(1)) * spacing
    cy = (gy + 0.1 + 0.8 * u(2)) * spacing
    radius = np.interp(u(3), [0, 1], style.radius_um) / slide.mpp
    elong = np.sqrt(np.interp(u(4), [0, 1], style.elongation))
    angle = u(5) * 180.0
    dark = np.interp(u(6), [0, 1], style.darkness)
    return cx, cy, radius * elong, radius / elong, angle, dark
