"""Synthetic demo cohorts: pyramidal TIFFs both readers open with the stated mpp, true masks
that match the tissue, labels that follow the planted content, determinism, stain shift."""

from __future__ import annotations

import csv
import json
from pathlib import Path

import cv2
import numpy as np
import openslide
import pytest
import tiffslide
from PIL import Image

from pathtwt.cli import main
from pathtwt.demo.cohorts import SCALES, plan_cohort, planned_slides, single_slide_recipe
from pathtwt.demo.corrupt import corrupt_middle_tile
from pathtwt.demo.make import write_slide
from pathtwt.demo.synthetic import SlideRecipe, SyntheticSlide
from pathtwt.demo.tiff_writer import pyramid_dims, write_pyramidal_tiff
from pathtwt.io.atomic import sha256_file


@pytest.fixture(scope="module")
def demo_dir(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("demo")
    assert main(["demo", "make-slides", "--out", str(out), "--scale", "test", "--seed", "0"]) == 0
    return out


@pytest.fixture(scope="module")
def manifest(demo_dir) -> dict:
    return json.loads((demo_dir / "demo.json").read_text())


def _labels(demo_dir: Path, cohort: str) -> list[dict]:
    with open(demo_dir / cohort / "labels.csv", newline="") as fh:
        return list(csv.DictReader(fh))


def _slide(demo_dir: Path, cohort: str, slide_id: str) -> Path:
    return demo_dir / cohort / "slides" / f"{slide_id}.tiff"


def test_layout_labels_and_splits(demo_dir, manifest):
    expected = {"grading": ({"train", "val", "test"}, 6), "grading-external": ({"test"}, 6),
                "metastasis": ({"train", "val", "test"}, 2), "metastasis-external": ({"test"}, 2)}  # fmt: skip
    assert set(manifest["cohorts"]) == set(expected)
    for cohort, (splits, classes) in expected.items():
        rows = _labels(demo_dir, cohort)
        assert list(rows[0]) == ["slide_id", "label", "split"]
        assert {r["split"] for r in rows} == splits
        assert {int(r["label"]) for r in rows} == set(range(classes))
        for split in splits:  # every class in every split
            assert {int(r["label"]) for r in rows if r["split"] == split} == set(range(classes))
        masks = json.loads((demo_dir / cohort / "masks" / "masks.json").read_text())
        for r in rows:
            assert _slide(demo_dir, cohort, r["slide_id"]).is_file()
            mask = np.asarray(Image.open(demo_dir / cohort / "masks" / masks["slides"][r["slide_id"]]))
            w, h = SCALES["test"].width, SCALES["test"].height
            assert mask.shape == (-(-h // masks["downsample"]), -(-w // masks["downsample"]))
            assert set(np.unique(mask)) <= {0, 255}
    # atomic writes leave no temporary (dot) files behind
    assert not [p for p in demo_dir.rglob(".*")]
    # the slide list is known before anything is rendered (for workflow wiring)
    planned = planned_slides("test", seed=0)
    for cohort in expected:
        rows = [(r["slide_id"], int(r["label"]), r["split"]) for r in _labels(demo_dir, cohort)]
        assert rows == [(p.slide_id, p.label, p.split) for p in planned[cohort]]


def test_both_readers_open_levels_and_mpp(demo_dir, manifest):
    for cohort in ("grading", "metastasis-external"):
        row = manifest["cohorts"][cohort]["slides"][0]
        path = _slide(demo_dir, cohort, row["slide_id"])
        dims = [tuple(d) for d in row["levels"]]
        assert len(dims) >= 3 and dims == pyramid_dims(SCALES["test"].width, SCALES["test"].height)
        with openslide.OpenSlide(path) as o:
            assert o.level_count >= 3
            assert list(o.level_dimensions) == dims
            assert o.level_downsamples[:3] == pytest.approx([1.0, 2.0, 4.0])
            assert float(o.properties["openslide.mpp-x"]) == pytest.approx(0.25, rel=1e-4)
            assert float(o.properties["openslide.mpp-y"]) == pytest.approx(0.25, rel=1e-4)
        t = tiffslide.TiffSlide(path)
        try:
            assert list(t.level_dimensions) == dims
            assert float(t.properties["tiffslide.mpp-x"]) == pytest.approx(0.25, rel=1e-4)
            assert float(t.properties["tiffslide.mpp-y"]) == pytest.approx(0.25, rel=1e-4)
        finally:
            t.close()


def test_pixels_read_back_match_the_generator(demo_dir, manifest):
    row = manifest["cohorts"]["grading"]["slides"][3]
    slide = SyntheticSlide(SlideRecipe.from_dict(row["recipe"]))
    path = _slide(demo_dir, "grading", row["slide_id"])
    with openslide.OpenSlide(path) as o:
        for level, (x, y, size) in enumerate([(300, 260, 300), (256, 512, 200), (128, 64, 120)]):
            ds = 2**level
            got = np.asarray(o.read_region((x, y), level, (size, size)).convert("RGB")).astype(int)
            want = slide.render(x, y, size, size, ds).astype(int)
            assert got.std() > 10  # a region with texture, not blank glass
            assert np.abs(got - want).mean() < 5.0, level  # JPEG error only
            # a shift by a few pixels would not match: the comparison is sensitive
            shifted = slide.render(x + 6 * ds, y, size, size, ds).astype(int)
            assert np.abs(got - shifted).mean() > 2 * np.abs(got - want).mean()


def _saturation(rgb: np.ndarray) -> np.ndarray:
    return cv2.cvtColor(np.ascontiguousarray(rgb), cv2.COLOR_RGB2HSV)[..., 1].astype(float)


def test_true_mask_matches_the_tissue(demo_dir, manifest):
    for cohort in ("grading", "grading-external", "metastasis"):
        masks = json.loads((demo_dir / cohort / "masks" / "masks.json").read_text())
        ds = masks["downsample"]
        for row in manifest["cohorts"][cohort]["slides"][:3]:
            mask = np.asarray(Image.open(demo_dir / cohort / "masks" / f"{row['slide_id']}.png")) > 0
            with openslide.OpenSlide(_slide(demo_dir, cohort, row["slide_id"])) as o:
                level = o.get_best_level_for_downsample(ds)
                assert o.level_downsamples[level] == pytest.approx(ds)
                rgb = np.asarray(o.read_region((0, 0), level, o.level_dimensions[level]).convert("RGB"))
            sat = _saturation(rgb)
            assert sat.shape == mask.shape
            assert 0.2 < mask.mean() < 0.8
            assert sat[mask].mean() > 3 * sat[~mask].mean() + 20
            # holes are in the tissue islands' outline but not in the mask
            # a plain Otsu threshold recovers the mask: the tissue is detectable
            _, otsu = cv2.threshold(cv2.medianBlur(sat.astype(np.uint8), 3), 0, 255, cv2.THRESH_BINARY + cv2.THRESH_OTSU)
            otsu = otsu > 0
            iou = (otsu & mask).sum() / (otsu | mask).sum()
            assert iou > 0.9, (row["slide_id"], iou)


def test_grading_label_follows_tumour_share_and_image(demo_dir, manifest):
    rows = manifest["cohorts"]["grading"]["slides"] + manifest["cohorts"]["grading-external"]["slides"]
    share_by_grade: dict[int, list[float]] = {}
    darkness, grades = [], []
    for row in rows:
        cohort = "grading-external" if row["slide_id"].startswith("grading-external") else "grading"
        labels = np.asarray(Image.open(demo_dir / cohort / "labelmaps" / f"{row['slide_id']}.png"))
        share = (labels == 2).sum() / (labels > 0).sum()
        assert share == pytest.approx(row["tumour_share"], abs=1e-3)
        share_by_grade.setdefault(row["label"], []).append(share)
        if cohort == "grading":  # image content: hematoxylin-dark pixels grow with the grade
            with openslide.OpenSlide(_slide(demo_dir, cohort, row["slide_id"])) as o:
                rgb = np.asarray(o.read_region((0, 0), 2, o.level_dimensions[2]).convert("RGB")).astype(float)
            tissue = cv2.resize(labels, rgb.shape[1::-1], interpolation=cv2.INTER_NEAREST) > 0
            darkness.append(float((rgb[..., 0][tissue] < 150).mean()))
            grades.append(row["label"])
    assert share_by_grade[0] == [0.0] * len(share_by_grade[0])
    for g in range(1, 6):  # disjoint, increasing share ranges
        assert min(share_by_grade[g]) > max(share_by_grade[g - 1])
    mean_dark = [np.mean([d for d, g in zip(darkness, grades) if g == k]) for k in range(6)]
    assert all(b > a for a, b in zip(mean_dark, mean_dark[1:])), mean_dark


def test_metastasis_label_means_tumour_foci(demo_dir, manifest):
    for cohort in ("metastasis", "metastasis-external"):
        for row in manifest["cohorts"][cohort]["slides"]:
            labels = np.asarray(Image.open(demo_dir / cohort / "labelmaps" / f"{row['slide_id']}.png"))
            tumour = int((labels == 2).sum())
            if row["label"] == 1:
                assert tumour > 0 and row["recipe"]["tumour_foci"] >= 1
                assert 0 < row["tumour_share"] < 0.5  # small foci, not a tumour slide
            else:
                assert tumour == 0 and row["recipe"]["tumour_foci"] == 0


def test_external_stain_differs(demo_dir, manifest):
    def mean_tissue_colour(cohort: str, row: dict) -> np.ndarray:
        mask = np.asarray(Image.open(demo_dir / cohort / "masks" / f"{row['slide_id']}.png")) > 0
        with openslide.OpenSlide(_slide(demo_dir, cohort, row["slide_id"])) as o:
            level = o.get_best_level_for_downsample(8)
            rgb = np.asarray(o.read_region((0, 0), level, o.level_dimensions[level]).convert("RGB")).astype(float)
        return rgb[mask].mean(axis=0)

    for task in ("grading", "metastasis"):
        internal = [r for r in manifest["cohorts"][task]["slides"] if r["label"] == 0]
        external = [r for r in manifest["cohorts"][f"{task}-external"]["slides"] if r["label"] == 0]
        a = [mean_tissue_colour(task, r) for r in internal[:2]]
        b = mean_tissue_colour(f"{task}-external", external[0])
        within = np.linalg.norm(a[0] - a[1])
        between = min(np.linalg.norm(x - b) for x in a)
        assert between > 25 and between > 3 * within, (task, within, between)


def test_deterministic_per_seed(tmp_path):
    spec = SCALES["test"]
    first = plan_cohort(spec.cohorts[0], 0, spec, seed=0)
    again = plan_cohort(spec.cohorts[0], 0, spec, seed=0)
    other = plan_cohort(spec.cohorts[0], 0, spec, seed=1)
    assert [(p.slide_id, p.label, p.split, p.recipe) for p in first] == [(p.slide_id, p.label, p.split, p.recipe) for p in again]
    assert [p.recipe.key for p in first] != [p.recipe.key for p in other]
    recipe = SlideRecipe.from_dict(first[0].recipe.to_dict())
    assert recipe == first[0].recipe
    small = SlideRecipe.from_dict({**recipe.to_dict(), "width": 512, "height": 512})
    for folder in ("a", "b"):
        write_slide(small, tmp_path / folder, "s", mask_downsample=8)
    for part in ("slides/s.tiff", "masks/s.png", "labelmaps/s.png"):
        assert sha256_file(tmp_path / "a" / part) == sha256_file(tmp_path / "b" / part)
    other_slide = SlideRecipe.from_dict({**small.to_dict(), "key": small.key + 1})
    assert not np.array_equal(SyntheticSlide(small).render(0, 0, 256, 256), SyntheticSlide(other_slide).render(0, 0, 256, 256))


def test_make_slides_is_idempotent_per_folder(demo_dir, capsys):
    manifest = demo_dir / "demo.json"
    slide = next((demo_dir / "grading" / "slides").glob("*.tiff"))
    before = (manifest.stat().st_mtime_ns, slide.stat().st_mtime_ns)
    assert main(["demo", "make-slides", "--out", str(demo_dir), "--scale", "test", "--seed", "0"]) == 0
    assert (manifest.stat().st_mtime_ns, slide.stat().st_mtime_ns) == before
    capsys.readouterr()
    assert main(["demo", "make-slides", "--out", str(demo_dir), "--scale", "test", "--seed", "1"]) == 1
    err = capsys.readouterr().err.strip()
    assert "demo.json" in err and "--force" in err and len(err.splitlines()) == 1


@pytest.mark.parametrize("spool", [True, False])
def test_writer_streams_a_level0_only_function(tmp_path, spool):
    # Odd size, no memory budget: lower levels go through a scratch file (spool) or are
    # asked from the function and area-averaged; edge tiles are partial.
    def tile_fn(x, y, w, h):
        yy, xx = np.mgrid[y : y + h, x : x + w]
        return np.stack([(xx // 7) % 256, (yy // 5) % 256, ((xx + yy) // 11) % 256], -1).astype(np.uint8)

    path = tmp_path / "gradient.tiff"
    dims = write_pyramidal_tiff(path, 1000, 700, tile_fn, mpp=0.5, levels=3, memory_budget_mb=0, spool=spool, quality=95)
    assert dims == [(1000, 700), (500, 350), (250, 175)]
    with openslide.OpenSlide(path) as o:
        assert list(o.level_dimensions) == dims
        assert float(o.properties["openslide.mpp-x"]) == pytest.approx(0.5)
        got = np.asarray(o.read_region((400, 300), 1, (100, 80)).convert("RGB")).astype(float)
    want = tile_fn(400, 300, 200, 160).reshape(80, 2, 100, 2, 3).mean(axis=(1, 3))
    assert np.abs(got - want).mean() < 3.0
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".")]


def test_corrupt_tile_fails_on_read_only_there(tmp_path):
    path = tmp_path / "corrupt.tiff"
    slide = SyntheticSlide(single_slide_recipe(width=1024, height=768, task="metastasis", label=1, islands=1))
    write_pyramidal_tiff(path, slide.width, slide.height, slide.render, mpp=slide.mpp)
    x, y = corrupt_middle_tile(path)
    assert (x, y) == (512, 256)
    with openslide.OpenSlide(path) as o:
        o.read_region((0, 0), 0, (64, 64))  # other tiles still decode
        with pytest.raises(openslide.OpenSlideError):
            o.read_region((x + 10, y + 10), 0, (32, 32))
