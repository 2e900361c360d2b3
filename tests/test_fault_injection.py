"""SIGKILL at several moments, rerun, compare with a clean run (see fault_injection.py).

Per command: a clean, uninterrupted run in the test process; then, in another output
folder, subprocess runs each killed at a seeded moment (after it has made progress)
and a final run to completion. After each kill nothing may look finished (no marker
file; any published file equal to the clean run's; only hidden temporary files
besides), and the final outputs must equal the clean run's."""

from __future__ import annotations

import subprocess
import sys

import cv2
import pytest
from fault_injection import (
    Kill,
    assert_nothing_looks_finished,
    compare_trees,
    kill_then_finish,
    pathtwt_command,
    run_and_kill,
    seeded_kills,
    subprocess_env,
)
from wsi_writers import he_image, pyramid, write_generic_tiff

from pathtwt.cli import main


def test_harness_catches_a_non_atomic_writer(tmp_path):
    """The checks can fail: a writer that streams straight into its final name is
    caught with a half-written file when killed."""
    out = tmp_path / "out"
    out.mkdir()
    code = ("import json, sys, time\n"
            f"fh = open({str(out / 'result.json')!r}, 'w')\n"
            "fh.write('{\"values\": ['); fh.flush(); time.sleep(30)\n")
    result = run_and_kill([sys.executable, "-c", code], Kill(after="result.json", delay=0.05), watch=out)
    assert result.killed
    with pytest.raises(ValueError):  # the half-written JSON does not parse
        assert_nothing_looks_finished(out)
    with pytest.raises(AssertionError, match="result.json exists although the run was killed"):
        assert_nothing_looks_finished(out, markers=["result.json"])


@pytest.fixture(scope="module")
def slides(tmp_path_factory):
    folder = tmp_path_factory.mktemp("fi-slides")
    paths = []
    for i, name in enumerate(("a", "b", "c")):
        paths.append(write_generic_tiff(folder / f"{name}.tiff", pyramid(he_image(1536, 1536, seed=10 + i)), 0.5))
    return paths


def test_tile_killed_and_rerun(slides, tmp_path):
    clean = tmp_path / "clean"
    args = [str(slides[0]), "--tile-size", "64", "--mpp", "1.0"]
    assert main(["tile", *args, "--out", str(clean / "a.h5"), "--thumbnail", str(clean / "a.png")]) == 0
    resumed = tmp_path / "resumed"
    command = pathtwt_command(["tile", *args, "--out", resumed / "a.h5", "--thumbnail", resumed / "a.png"])
    # import and tissue detection take most of a tile run: kill at seeded moments in it,
    # the first so early (50 ms) that it always lands; a later one may come after the run
    # finished its work, which then ends the series
    kills = [Kill(delay=0.05)] + sorted(seeded_kills(0, after=[None, None], max_delay=0.6), key=lambda k: k.delay)
    results = kill_then_finish(command, kills, watch=resumed, markers=["a.h5"], reference=clean,
                               env=subprocess_env())
    assert results[0].killed, results
    assert compare_trees(clean, resumed) == ["a.h5", "a.png"]


def test_extract_killed_and_rerun(slides, tmp_path):
    """Three slides in one `pathtwt extract --skip-existing`: killed while the second
    slide is being embedded, then while the third is; finished slides stay, the
    unfinished one is redone."""
    coords = tmp_path / "coords"
    for slide in slides:
        assert main(["tile", str(slide), "--out", str(coords / f"{slide.stem}.h5"), "--tile-size", "56",
                     "--mpp", "1.0", "--tissue", "otsu"]) == 0

    def args(out):
        return ["extract", *map(str, slides), "--coords", *[str(coords / f"{s.stem}.h5") for s in slides],
                "--out", *[str(out / f"{s.stem}.h5") for s in slides], "--backbone", "vit-s14-tiny",
                "--random-init", "--batch-size", "8", "--workers", "0", "--device", "cpu", "--no-progress",
                "--skip-existing"]

    clean, resumed = tmp_path / "clean", tmp_path / "resumed"
    assert main(args(clean)) == 0
    kills = seeded_kills(1, after=[".b.h5.tmp-*", ".c.h5.tmp-*"], max_delay=0.05)
    results = kill_then_finish(pathtwt_command(args(resumed)), kills, watch=resumed, markers=[],
                               reference=clean, env=subprocess_env())
    assert [r.killed for r in results] == [True, True], results
    assert compare_trees(clean, resumed) == ["a.h5", "b.h5", "c.h5"]


@pytest.fixture(scope="module")
def calibration_images(tmp_path_factory):
    folder = tmp_path_factory.mktemp("calib")
    image = he_image(512, 512, seed=21)
    for i in range(16):
        y, x = divmod(i, 4)
        crop = image[y * 128 : (y + 1) * 128, x * 128 : (x + 1) * 128]
        cv2.imwrite(str(folder / f"tile{i:02d}.png"), cv2.cvtColor(crop, cv2.COLOR_RGB2BGR))
    return folder


def test_compress_killed_and_rerun(calibration_images, tmp_path):
    """TWT compression of the tiny ViT (60 steps, so a kill lands mid-run on a fast machine too) with a checkpoint every 2 steps: killed after a
    checkpoint, twice; the rerun resumes and must export the same weights."""

    def args(out):
        return ["compress", "--method", "twt", "--backbone", "vit-s14-tiny", "--random-init", "--calibration",
                str(calibration_images), "--n-tiles", "16", "--batch-size", "4", "--depth", "4", "--steps", "60",
                "--audition-steps", "0", "--checkpoint-every", "2", "--device", "cpu", "--no-progress", "--out",
                str(out)]

    clean, resumed = tmp_path / "clean", tmp_path / "resumed"
    assert main(args(clean)) == 0
    kills = seeded_kills(2, after=["checkpoint.pt", "checkpoint.pt"], max_delay=0.1)
    results = kill_then_finish(pathtwt_command(args(resumed)), kills, watch=resumed,
                               markers=["model.json", "model.safetensors"], resume_files=["checkpoint.pt"],
                               reference=clean, env=subprocess_env())
    assert [r.killed for r in results] == [True, True], results
    assert compare_trees(clean, resumed) == ["README.md", "config.json", "model.json", "model.safetensors"]


def test_train_mil_killed_and_rerun(tmp_path):
    """ABMIL on fabricated features, resume state saved every epoch: killed after an
    epoch, twice; the rerun resumes and must give the same checkpoint and metrics."""
    from planted_cohorts import write_planted_cohort

    cohort = write_planted_cohort(tmp_path / "cohort", task="metastasis", splits={"train": 12, "val": 4, "test": 4},
                                  dim=8, strength=6.0, bag_size=(10, 20), seed=0)

    def args(out):
        return ["train-mil", "--features", str(cohort.features_dir), "--labels", str(cohort.labels_csv),
                "--protocol", "metastasis", "--aggregator", "abmil", "--seed", "0", "--out", str(out),
                "--epochs", "5", "--accumulation", "4", "--hidden-dim", "16", "--lr", "1e-3", "--device", "cpu",
                "--no-progress"]

    clean, resumed = tmp_path / "clean", tmp_path / "resumed"
    assert main(args(clean)) == 0
    kills = seeded_kills(3, after=["resume.pt", "resume.pt"], max_delay=0.05)
    results = kill_then_finish(pathtwt_command(args(resumed)), kills, watch=resumed, markers=["metrics.json"],
                               resume_files=["resume.pt"], reference=clean, env=subprocess_env())
    assert [r.killed for r in results] == [True, True], results
    compared = compare_trees(clean, resumed, ignore=["resume.pt"])
    assert {"metrics.json", "predictions.csv", "checkpoint.pt"} <= set(compared)


def test_seeded_kill_moments_are_reproducible():
    a = seeded_kills(7, after=[None, "x"], max_delay=1.0)
    assert a == seeded_kills(7, after=[None, "x"], max_delay=1.0) and a != seeded_kills(8, after=[None, "x"], max_delay=1.0)
    assert all(0 <= k.delay < 1.0 for k in a) and [k.after for k in a] == [None, "x"]
    assert subprocess.run([*pathtwt_command(["--version"])], capture_output=True, text=True).stdout.startswith("pathtwt ")
