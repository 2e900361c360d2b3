"""Calibration draw: proportional, seeded, split into disjoint fit / select / report, readable back."""

from __future__ import annotations

import h5py
import numpy as np
import pytest
from PIL import Image

from pathtwt.cli import main
from pathtwt.compress.calibration import allocate, draw_tiles, expand_sources, load_calibration
from pathtwt.errors import ConfigError
from pathtwt.io.h5 import write_coords


def write_slide_coords(path, slide, coords, patch_size=64, status="ok"):
    write_coords(
        path, np.asarray(coords), np.ones(len(coords)), {
            "patch_size": patch_size, "patch_size_level0": 2 * patch_size, "target_mpp": 1.0, "level0_mpp": 0.499,
            "read_level": 0, "level0_width": 2220, "level0_height": 2967, "target_magnification": 10,
            "status": status, "slide_path": str(slide),
        },
    )


@pytest.fixture
def image_dir(tmp_path):
    rng = np.random.default_rng(0)
    d = tmp_path / "images"
    (d / "sub").mkdir(parents=True)
    Image.fromarray(rng.integers(0, 255, (200, 300, 3), np.uint8)).save(d / "big.png")  # 4 x 3 grid of 64
    Image.fromarray(rng.integers(0, 255, (40, 50, 3), np.uint8)).save(d / "sub" / "small.tif")  # one, resized up
    Image.fromarray(rng.integers(0, 255, (64, 64, 3), np.uint8)).save(d / ".tmp-partial.png")  # must be ignored
    return d


def test_allocate_is_proportional_and_capped():
    assert allocate([10, 30, 60], 10) == [1, 3, 6]
    assert sum(allocate([7, 5, 3], 9)) == 9
    assert allocate([2, 3], 100) == [2, 3]
    assert allocate([1, 1, 1], 2) == [1, 1, 0]  # ties go to the earlier source


def test_image_sources_are_cut_resized_and_seeded(image_dir):
    _, coords, images = expand_sources([image_dir])
    assert not coords and [p.name for p in images] == ["big.png", "small.tif"]
    everything = draw_tiles([], images, n_tiles=100, seed=0, holdout=0.0, resize_to=64)
    assert everything.tiles.shape == (13, 64, 64, 3)
    big = np.asarray(Image.open(image_dir / "big.png"))
    x, y = everything.origins[0]
    np.testing.assert_array_equal(everything.tiles[0], big[y : y + 64, x : x + 64])

    a = load_calibration([image_dir], n_tiles=5, seed=3, holdout=0.4, resize_to=64)
    b = load_calibration([image_dir], n_tiles=5, seed=3, holdout=0.4, resize_to=64)
    assert (len(a.fit), len(a.select), len(a.report)) == (3, 1, 1)
    assert a.splits_record() == {"fit": 3, "select": 1, "report": 1, "seed": 3}
    for part in ("fit", "select", "report"):
        np.testing.assert_array_equal(getattr(a, part), getattr(b, part))
    # disjoint: the 5 tiles (distinct crops of distinct images) appear once across the parts
    assert len({t.tobytes() for t in a.all}) == 5
    draws = {
        load_calibration([image_dir], n_tiles=5, seed=s, holdout=0.4, resize_to=64).fit.tobytes() for s in range(6)
    }
    assert len(draws) > 1  # the seed matters


def test_calibrate_cli_reads_slide_tiles_and_round_trips(tmp_path, shared_slides, image_dir):
    from pathtwt.wsi.slides import open_slide

    slide = shared_slides / "CMU-1-Small-Region.svs"
    cdir = tmp_path / "coords"
    grid = [(x, y) for x in range(0, 1280, 128) for y in range(0, 1280, 128)]  # 100 tiles
    write_slide_coords(cdir / "a.h5", slide, grid[:75])
    write_slide_coords(cdir / "b.h5", slide, grid[75:])  # 25 tiles
    write_slide_coords(cdir / "empty.h5", slide, [], status="no_tissue")
    out = tmp_path / "calib.h5"
    assert main(["calibrate", "--coords", str(cdir), "--out", str(out), "--n-tiles", "20", "--holdout", "0.25",
                 "--seed", "1"]) == 0
    with h5py.File(out) as h5:
        tiles, split, src = h5["tiles"][()], h5["split"][()], h5["source_index"][()]
        origins, sources = h5["origins"][()], [s.decode() for s in h5["sources"][()]]
        assert h5["tiles"].chunks == (1, 64, 64, 3)  # one tile per chunk: subsets read lazily
    assert tiles.shape == (20, 64, 64, 3) and np.bincount(split).tolist() == [15, 3, 2]
    assert np.bincount(src).tolist() == [15, 5]  # proportional to 75 : 25
    assert [s.rsplit("/", 1)[1] for s in sources] == ["a.h5", "b.h5"]
    with open_slide(slide) as s:
        for k in (0, 19):
            x, y = origins[k]
            np.testing.assert_array_equal(tiles[k], s.read_tile(int(x), int(y), 128, 0, 64))

    back = load_calibration([out], n_tiles=None)
    np.testing.assert_array_equal(back.fit, tiles[split == 0])
    np.testing.assert_array_equal(back.select, tiles[split == 1])
    np.testing.assert_array_equal(back.report, tiles[split == 2])
    assert back.splits_record() == {"fit": 15, "select": 3, "report": 2, "seed": 1}
    sub = load_calibration([out], n_tiles=8, seed=0)
    assert (len(sub.fit), len(sub.select), len(sub.report)) == (6, 1, 1)
    # one stored part alone, as fit
    held = load_calibration([out], part="report", n_tiles=100)
    assert held.provenance["part"] == "report" and held.fit.shape[0] == 2 and len(held.select) == len(held.report) == 0
    assert {t.tobytes() for t in held.fit} == {t.tobytes() for t in tiles[split == 2]}
    assert len(load_calibration([out], part="fit", n_tiles=4).fit) == 4
    assert len(load_calibration([out], part="all", n_tiles=None).fit) == 20
    with pytest.raises(ConfigError, match="calibration part 'train'"):
        load_calibration([out], part="train")
    # raw sources have no split: a fresh draw, all of it, which the caller can tell
    fresh = load_calibration([image_dir], part="report", n_tiles=2)
    assert fresh.provenance["part"] == "all" and len(fresh.fit) == 2
    # a file of the old fit/holdout format is refused with what to do
    old = tmp_path / "old.h5"
    import shutil

    shutil.copy(out, old)
    with h5py.File(old, "r+") as h5:
        h5.attrs["format"] = "pathtwt-calibration/1"
    with pytest.raises(ConfigError, match="rerun pathtwt calibrate"):
        load_calibration([old], n_tiles=None)

    # the same draw again is byte-identical; coords and images mix into one set
    again = tmp_path / "again.h5"
    main(["calibrate", "--coords", str(cdir), "--out", str(again), "--n-tiles", "20", "--holdout", "0.25",
          "--seed", "1"])
    with h5py.File(again) as h5:
        np.testing.assert_array_equal(h5["tiles"][()], tiles)
    # only training slides when a label table is given
    labels = tmp_path / "labels.csv"
    labels.write_text("slide_id,label,split\na,1,train\nb,0,test\nempty,0,train\n")
    assert main(["calibrate", "--coords", str(cdir), "--labels", str(labels), "--out", str(again),
                 "--n-tiles", "30", "--holdout", "0"]) == 0
    with h5py.File(again) as h5:
        assert [s.decode().rsplit("/", 1)[1] for s in h5["sources"][()]] == ["a.h5"]
    labels.write_text("slide_id,label,split\na,1,train\n")
    assert main(["calibrate", "--coords", str(cdir), "--labels", str(labels), "--out", str(again)]) == 1

    mixed = load_calibration([cdir, image_dir], n_tiles=50, holdout=0.1)
    assert mixed.patch_size == 64 and len(mixed.all) == 50
    assert not any(".tmp" in s for s in mixed.sources)


def test_bad_sources_give_one_line_errors(tmp_path, image_dir, shared_slides):
    with pytest.raises(ConfigError, match="does not exist"):
        load_calibration([tmp_path / "missing"])
    write_slide_coords(tmp_path / "c" / "a.h5", shared_slides / "CMU-1-Small-Region.svs", [(0, 0)], patch_size=64)
    write_slide_coords(tmp_path / "c" / "b.h5", shared_slides / "CMU-1-Small-Region.svs", [(0, 0)], patch_size=32)
    with pytest.raises(ConfigError, match="patch_size"):
        load_calibration([tmp_path / "c"])
    resized = load_calibration([tmp_path / "c"], resize_to=48, holdout=0)  # the backbone's size wins
    assert resized.fit.shape == (2, 48, 48, 3)
    assert main(["calibrate", "--images", str(tmp_path / "c"), "--out", str(tmp_path / "x.h5")]) == 1
