"""pathtwt.wsi.area_shrink gives cv2.INTER_AREA's pixels exactly: random tiles, real tissue
(BACH), the factors the readers meet (256, 267, 300, 448, 500 -> 224), non-square tiles,
single tiles and batches; with numba (the compiled passes) and without (OpenCV itself)."""

from __future__ import annotations

import importlib.util

import cv2
import numpy as np
import pytest

from conftest import SHARED_BACH
from pathtwt.wsi import area_shrink

SIZE = 224
BACH = sorted(SHARED_BACH.glob("*.jpeg"))[:3]
needs_bach = pytest.mark.skipif(len(BACH) < 3, reason="../shared/data/bach/images/*.jpeg are absent")
HAS_NUMBA = importlib.util.find_spec("numba") is not None
SHAPES = [(256, 256), (267, 267), (300, 300), (448, 448), (500, 500), (267, 300), (300, 267), (224, 300), (449, 224)]


@pytest.fixture(params=["numba", "opencv"])
def backend(request, monkeypatch):
    """Each test runs with the compiled passes and with the OpenCV fallback (no numba)."""
    if request.param == "numba":
        if not HAS_NUMBA:
            pytest.skip("numba is not installed (the `test` extra installs it): only the OpenCV fallback runs")
    else:
        monkeypatch.setattr(area_shrink, "_kernels", lambda: None)
    return request.param


def opencv(tiles: np.ndarray, size: int = SIZE) -> np.ndarray:
    return np.stack([cv2.resize(t, (size, size), interpolation=cv2.INTER_AREA) for t in tiles])


def random_tiles(n: int, h: int, w: int, seed: int = 0) -> np.ndarray:
    return np.random.default_rng(seed).integers(0, 256, (n, h, w, 3), dtype=np.uint8)


def bach_crops(side: int, n: int = 33) -> np.ndarray:
    """n tissue tiles of side x side px cut on a grid from three BACH images."""
    crops = []
    for path in BACH:
        image = cv2.cvtColor(cv2.imread(str(path)), cv2.COLOR_BGR2RGB)
        ys = range(0, image.shape[0] - side + 1, max(1, (image.shape[0] - side) // 3))
        xs = range(0, image.shape[1] - side + 1, max(1, (image.shape[1] - side) // 3))
        crops += [image[y:y + side, x:x + side] for y in ys for x in xs]
    assert len(crops) >= n
    return np.ascontiguousarray(np.stack(crops[:n]))


@pytest.mark.parametrize("h,w", SHAPES, ids=[f"{h}x{w}" for h, w in SHAPES])
def test_random_tiles_equal_opencv(backend, h, w):
    tiles = random_tiles(33, h, w)
    out = area_shrink.shrink(tiles, SIZE)
    assert out.shape == (33, SIZE, SIZE, 3) and out.dtype == np.uint8
    np.testing.assert_array_equal(out, opencv(tiles))


@needs_bach
@pytest.mark.parametrize("side", [267, 256, 300, 448, 500])
def test_bach_tissue_equals_opencv(backend, side):
    tiles = bach_crops(side)
    np.testing.assert_array_equal(area_shrink.shrink(tiles, SIZE), opencv(tiles))


def test_one_tile_and_a_batch_of_one(backend):
    tiles = random_tiles(1, 267, 267, seed=3)
    single = area_shrink.shrink(tiles[0], SIZE)
    assert single.shape == (SIZE, SIZE, 3)
    np.testing.assert_array_equal(single, opencv(tiles)[0])
    np.testing.assert_array_equal(area_shrink.shrink(tiles, SIZE), opencv(tiles))


def test_many_shapes_sizes_and_extreme_content(backend):
    """Odd sizes, factors from just above 1 to above 3, and content that tests rounding and
    saturation: flat 0 and 255, a checkerboard of 0 and 255, one-level steps, and noise."""
    rng = np.random.default_rng(7)
    for size in (224, 97, 31):
        for _ in range(6):
            h, w = (int(v) for v in rng.integers(size, 3 * size + 2, 2))
            yy, xx = np.mgrid[:h, :w]
            patterns = [
                np.zeros((h, w), np.uint8), np.full((h, w), 255, np.uint8),
                ((yy + xx) % 2 * 255).astype(np.uint8), ((yy // 3 + xx // 2) % 2 + 127).astype(np.uint8),
            ]
            tiles = np.stack([np.repeat(p[..., None], 3, axis=2) for p in patterns] +
                             list(rng.integers(0, 256, (3, h, w, 3), dtype=np.uint8)))
            np.testing.assert_array_equal(area_shrink.shrink(tiles, size), opencv(tiles, size), err_msg=f"{h}x{w}->{size}")


def test_slivers_at_opencvs_threshold(backend):
    """1501 -> 1500 px: cell d starts d / 1500 px past a pixel edge, so the partial pixels
    run from 0.00067 (dropped: at most 1e-3) up (kept), in both axes."""
    tiles = random_tiles(1, 1501, 1501, seed=11)
    index, weight = area_shrink._taps(1501, 1500)
    assert (weight[1] == 0).sum() > 0 and (weight[1] > 0).sum() > 0  # cells with and without a sliver
    np.testing.assert_array_equal(area_shrink.shrink(tiles, 1500), opencv(tiles, 1500))


def test_non_contiguous_input():
    tiles = random_tiles(4, 300, 300)[:, 10:277, 5:272]  # 267 x 267 views into larger tiles
    np.testing.assert_array_equal(area_shrink.shrink(tiles, SIZE), opencv(np.ascontiguousarray(tiles)))


@pytest.mark.skipif(not HAS_NUMBA, reason="numba is not installed (the `test` extra installs it)")
def test_non_integer_factors_use_the_compiled_passes_and_whole_ones_opencv(monkeypatch):
    """267 and 300 px go through the numba passes, a whole factor in both axes (448, and
    448 x 672) to OpenCV's integer fast path, whose rounding the passes do not copy."""
    calls = []
    separable = area_shrink._separable
    monkeypatch.setattr(area_shrink, "_separable", lambda *a: calls.append((len(a[0]), *a[0][0].shape)) or separable(*a))
    for h, w in [(267, 267), (300, 267), (448, 448), (448, 672), (448, 300)]:
        area_shrink.shrink(random_tiles(2, h, w), SIZE)
    assert calls == [(2, 267, 267, 3), (2, 300, 267, 3), (2, 448, 300, 3)]


def test_a_list_of_tiles_goes_straight_into_out():
    """The readers' call: regions as they were cut (a list, not stacked) into a ring slot."""
    tiles = random_tiles(3, 267, 267)
    out = np.zeros((3, SIZE, SIZE, 3), np.uint8)
    assert area_shrink.shrink(list(tiles), SIZE, out=out) is out
    np.testing.assert_array_equal(out, opencv(tiles))
    with pytest.raises(ValueError, match="out must be uint8"):
        area_shrink.shrink(list(tiles), SIZE, out=np.zeros((2, SIZE, SIZE, 3), np.uint8))
    with pytest.raises(ValueError, match="of one shape"):
        area_shrink.shrink([tiles[0], tiles[1][:250]], SIZE)


def test_whole_factor_is_opencvs_test():
    assert area_shrink.whole_factor(448, 224) and area_shrink.whole_factor(672, 224)
    assert area_shrink.whole_factor(224, 224)
    assert not area_shrink.whole_factor(267, 224) and not area_shrink.whole_factor(449, 224)


def test_taps_cover_each_cell_once():
    """Every output cell's weights sum to 1 (float32 rounding aside) and its taps are the
    consecutive source pixels its span touches."""
    for src, dst in [(267, 224), (300, 224), (500, 224), (225, 224)]:
        index, weight = area_shrink._taps(src, dst)
        np.testing.assert_allclose(weight.sum(axis=0), 1.0, atol=1e-5)
        live = weight > 0
        assert live[0].all()
        first = index[0]
        assert first[0] == 0 and (np.diff(first) >= 1).all()
        for d in range(dst):
            n = int(live[:, d].sum())
            assert list(index[:n, d]) == list(range(first[d], first[d] + n))


def test_same_size_is_a_copy():
    tiles = random_tiles(2, SIZE, SIZE)
    out = area_shrink.shrink(tiles, SIZE)
    np.testing.assert_array_equal(out, tiles)
    assert not np.shares_memory(out, tiles)


@pytest.mark.parametrize("tiles,size,match", [
    (np.zeros((2, 200, 267, 3), np.uint8), SIZE, "shrinks only: tiles of 267 x 200 px"),
    (np.zeros((2, 267, 267, 4), np.uint8), SIZE, r"uint8 RGB tiles .* not uint8 \(267, 267, 4\)"),
    (np.zeros((267, 267, 3), np.float32), SIZE, "not float32"),
    (np.zeros((267, 267, 3), np.uint8), 0, "cannot become 0 x 0 px"),
])
def test_refusals_are_one_line(tiles, size, match):
    with pytest.raises(ValueError, match=match) as info:
        area_shrink.shrink(tiles, size)
    assert "\n" not in str(info.value)
