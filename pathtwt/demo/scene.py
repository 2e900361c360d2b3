"""The layout of one synthetic slide on a coarse grid: where tissue is (islands with holes),
where it stains faintly, and where the tumour is. Each region is stored as an approximate
signed distance in level-0 pixels, so the renderer, the true tissue mask and the label
map all threshold the same interpolated field and agree at every resolution.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from scipy import ndimage

from pathtwt.demo.noise import sample_grid, signed_distance, smooth_field

# Channels of SceneFields.grid
TISSUE, TUMOUR, FAINT, INTENSITY = range(4)
ABSENT = -1.0e4  # signed distance of a region that does not exist


@dataclass(frozen=True)
class Layout:
    """What the scene must contain (sizes in level-0 pixels unless named _um)."""

    width: int
    height: int
    mpp: float
    islands: int
    coverage: float  # share of the slide area covered by tissue islands (before holes)
    faint_share: float  # share of tissue that stains faintly
    tumour_share: float  # share of tissue with tumour texture (grading)
    tumour_foci: int  # number of small tumour foci (metastasis)
    focus_radius_um: tuple[float, float]
    tumour_scale_um: float = 80.0  # feature size of tumour regions in the share mode


@dataclass
class SceneFields:
    grid: np.ndarray  # (gh, gw, 4) float32, channels TISSUE, TUMOUR, FAINT, INTENSITY
    cell: int  # level-0 pixels per grid cell
    _channels: list[np.ndarray] | None = None

    def lattice(self, x: np.ndarray) -> np.ndarray:
        """Grid coordinates of level-0 positions (grid values sit at cell centres)."""
        return np.asarray(x, dtype=np.float64) / self.cell - 0.5

    def sample(self, x: float, y: float, w: int, h: int, ds: float) -> list[np.ndarray]:
        """The four fields (each (h, w)) at the centres of a (h, w) pixel grid starting at
        level-0 (x, y), each pixel ds level-0 pixels wide."""
        u0 = (x + 0.5 * ds) / self.cell - 0.5
        v0 = (y + 0.5 * ds) / self.cell - 0.5
        return [sample_grid(g, u0=u0, v0=v0, step=ds / self.cell, w=w, h=h) for g in self.channels]

    @property
    def channels(self) -> list[np.ndarray]:
        if self._channels is None:
            self._channels = [np.ascontiguousarray(self.grid[..., k]) for k in range(self.grid.shape[-1])]
        return self._channels


def grid_cell(width: int, height: int) -> int:
    # Fine enough for smooth outlines on demo slides, bounded memory on 60k x 40k ones.
    return max(8, int(np.ceil(max(width, height) / 1024)))


def build_scene(layout: Layout, rng: np.random.Generator) -> SceneFields:
    cell = grid_cell(layout.width, layout.height)
    gw, gh = int(np.ceil(layout.width / cell)), int(np.ceil(layout.height / cell))
    xs = (np.arange(gw) + 0.5) * cell
    ys = (np.arange(gh) + 0.5) * cell
    px_per_um = 1.0 / layout.mpp

    tissue = _islands(layout, rng, xs, ys, cell)
    tissue = np.minimum(tissue, _holes(rng, xs, ys, tissue, cell, px_per_um))
    inside = tissue > 0

    faint_noise = smooth_field(rng, (gh, gw), 120.0 * px_per_um / cell)
    faint = np.zeros((gh, gw), np.float32)
    if layout.faint_share > 0 and inside.any():
        q = np.quantile(faint_noise[inside], 1.0 - layout.faint_share)
        faint = np.clip((faint_noise - q) / 0.4 + 0.5, 0.0, 1.0)

    if layout.tumour_foci > 0:
        tumour = _foci(layout, rng, xs, ys, tissue, cell, px_per_um)
    elif layout.tumour_share > 0 and inside.any():
        noise = smooth_field(rng, (gh, gw), layout.tumour_scale_um * px_per_um / cell)
        q = np.quantile(noise[inside], 1.0 - layout.tumour_share)
        tumour = signed_distance(noise - q, cell)
    else:
        tumour = np.full((gh, gw), ABSENT, np.float32)

    intensity = 1.0 + 0.08 * smooth_field(rng, (gh, gw), 300.0 * px_per_um / cell)
    grid = np.stack([tissue, tumour, faint, intensity], axis=-1).astype(np.float32)
    return SceneFields(grid=grid, cell=cell)


def _islands(layout: Layout, rng: np.random.Generator, xs: np.ndarray, ys: np.ndarray, cell: int) -> np.ndarray:
    """Irregular tissue islands: rotated ellipses whose outline is pushed in and out by
    smooth noise, as signed distance in pixels."""
    w, h = layout.width, layout.height
    area = layout.coverage * w * h / layout.islands
    field = np.full((len(ys), len(xs)), -np.inf, np.float32)
    radii = []
    for _ in range(layout.islands):
        aspect = rng.uniform(0.6, 1.0)
        rx = np.sqrt(area / (np.pi * aspect))
        ry = aspect * rx
        theta = rng.uniform(0, np.pi)
        c, s = np.cos(theta), np.sin(theta)
        ex, ey = np.hypot(rx * c, ry * s), np.hypot(rx * s, ry * c)  # half extents of the rotated ellipse
        cx = rng.uniform(min(1.1 * ex, w / 2), max(w - 1.1 * ex, w / 2))
        cy = rng.uniform(min(1.1 * ey, h / 2), max(h - 1.1 * ey, h / 2))
        dx, dy = xs[None, :] - cx, ys[:, None] - cy
        u, v = (dx * c + dy * s) / rx, (-dx * s + dy * c) / ry
        field = np.maximum(field, 1.0 - np.sqrt(u * u + v * v))
        radii.append(ry)
    wobble = smooth_field(rng, field.shape, 0.3 * float(np.mean(radii)) / cell)
    return signed_distance(field + 0.22 * wobble, cell)


def _holes(
    rng: np.random.Generator, xs: np.ndarray, ys: np.ndarray, tissue: np.ndarray, cell: int, px_per_um: float
) -> np.ndarray:
    """Small empty lumina and tears inside the tissue (signed distance, > 0 outside holes)."""
    inside = np.argwhere(tissue > 30.0 * px_per_um)
    tissue_um2 = float((tissue > 0).sum()) * cell * cell / px_per_um**2
    n = min(int(rng.poisson(tissue_um2 / 40000.0)), len(inside))
    out = np.full(tissue.shape, np.inf, np.float32)
    for idx in rng.choice(len(inside), size=n, replace=False):
        iy, ix = inside[idx]
        r = rng.uniform(8.0, 28.0) * px_per_um
        aspect = rng.uniform(0.4, 1.0)
        theta = rng.uniform(0, np.pi)
        c, s = np.cos(theta), np.sin(theta)
        # only a window around the hole: far away its distance is positive anyway, and a
        # large slide has thousands of holes
        half = int(np.ceil(r / aspect / cell)) + 3
        win = np.s_[max(iy - half, 0) : iy + half + 1, max(ix - half, 0) : ix + half + 1]
        dx, dy = xs[None, win[1]] - xs[ix], ys[win[0], None] - ys[iy]
        u, v = (dx * c + dy * s), (-dx * s + dy * c) / aspect
        out[win] = np.minimum(out[win], np.sqrt(u * u + v * v) - r)
    return out


def _foci(
    layout: Layout, rng: np.random.Generator, xs: np.ndarray, ys: np.ndarray, tissue: np.ndarray, cell: int, px_per_um: float
) -> np.ndarray:
    """Small round tumour nests placed well inside the tissue (metastasis)."""
    depth = ndimage.distance_transform_edt(tissue > 0) * cell  # pixels to the tissue edge
    field = np.full(tissue.shape, -np.inf, np.float32)
    for _ in range(layout.tumour_foci):
        r = rng.uniform(*layout.focus_radius_um) * px_per_um
        ok = np.argwhere(depth >= 1.3 * r)
        if len(ok) == 0:  # small island: take the deepest point available
            ok = np.argwhere(depth >= depth.max())
        iy, ix = ok[rng.integers(len(ok))]
        d = np.hypot(xs[None, :] - xs[ix], ys[:, None] - ys[iy]) / r
        field = np.maximum(field, 1.0 - d)
    wobble = smooth_field(rng, field.shape, 0.3 * layout.focus_radius_um[0] * px_per_um / cell)
    return signed_distance(field + 0.15 * wobble, cell)
