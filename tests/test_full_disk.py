"""A full disk, a full quota or a read-only folder at every writer: one line naming the
file, the space it needed and the space free, and what to do; exit status 1, no
traceback, no crash (extraction onto a full disk died with a segmentation fault in HDF5),
nothing left that looks finished; and once space is freed the same command resumes and
gives the results of a run that never met a full disk.

The disks are real: a small tmpfs (tests/small_disk.py, as root), filled to leave a chosen
number of bytes free. Where a failure must land at a precise moment, inside the HDF5
writer or in a quota, it is injected."""

from __future__ import annotations

import errno
import subprocess
import sys

import numpy as np
import pandas as pd
import pytest
from fault_injection import assert_nothing_looks_finished, compare_trees, pathtwt_command, subprocess_env, visible_files
from planted_cohorts import write_planted_cohort
from small_disk import mount_small_disk
from wsi_writers import he_image, pyramid, write_generic_tiff

from pathtwt.cli import main
from pathtwt.errors import OutputError
from pathtwt.io.atomic import atomic_output

BACKBONE = ["--backbone", "vit-s14-tiny", "--random-init"]
FAST = ["--device", "cpu", "--no-progress"]
TILING = ["--mpp", "1.0", "--tile-size", "56", "--tissue", "otsu"]


@pytest.fixture()
def disk(tmp_path):
    yield from mount_small_disk(tmp_path / "disk", "16m")


@pytest.fixture(scope="module")
def study(tmp_path_factory):
    """Three small slides tiled and embedded on an ordinary disk, their calibration tiles,
    and a planted MIL cohort: the inputs of every stage, and clean outputs to compare with."""
    root = tmp_path_factory.mktemp("study")
    slides = [write_generic_tiff(root / f"{name}.tiff", pyramid(he_image(1024, 1024, seed=30 + i)), 0.5)
              for i, name in enumerate("abc")]
    for slide in slides:
        assert main(["tile", str(slide), "--out", str(root / "coords" / f"{slide.stem}.h5"), *TILING]) == 0
    assert main(["calibrate", "--coords", str(root / "coords"), "--out", str(root / "calibration.h5"),
                 "--n-tiles", "16", "--holdout", "0.25"]) == 0
    cohort = write_planted_cohort(root / "cohort", task="metastasis", splits={"train": 8, "val": 4, "test": 4},
                                  dim=8, strength=6.0, bag_size=(10, 20), seed=0)
    return {"root": root, "slides": slides, "coords": root / "coords", "calibration": root / "calibration.h5",
            "cohort": cohort}


def _refused(capsys, argv: list[str], *names: str) -> str:
    """Run ``argv`` and return its one error line, checked: exit status 1, no traceback,
    the line names one of ``names`` and says the space."""
    code = main(argv)
    err = capsys.readouterr().err
    assert code == 1, err
    return _one_line(argv[0], err, names)


def _one_line(command: str, err: str, names) -> str:
    assert "Traceback" not in err, err
    errors = [line for line in err.splitlines() if "error:" in line]
    assert len(errors) == 1, err
    line = errors[0]
    assert line.startswith(f"pathtwt {command}: error: "), line
    assert any(name in line for name in names), line
    return line


def _full(line: str) -> None:
    assert "no space left on the device" in line and " free on " in line and "run the command again" in line, line


def test_tile_and_thumbnail_on_a_full_disk_then_rerun(study, disk, tmp_path, capsys):
    slide = study["slides"][0]

    def argv(out):
        return ["tile", str(slide), "--out", str(out / "a.h5"), "--thumbnail", str(out / "a.png"), *TILING]

    assert main(argv(tmp_path / "clean")) == 0
    disk.leave(0)
    _full(_refused(capsys, argv(disk.out), "a.png", "a.h5"))
    assert_nothing_looks_finished(disk.out, markers=["*"])
    disk.empty()
    assert main(argv(disk.out)) == 0
    assert compare_trees(tmp_path / "clean", disk.out) == ["a.h5", "a.png"]


def test_a_read_only_folder_is_one_line(study, disk, capsys):
    disk.read_only()
    line = _refused(capsys, ["tile", str(study["slides"][0]), "--out", str(disk.out / "a.h5"), "--thumbnail",
                             str(disk.out / "a.png"), *TILING], "a.png")
    assert "read-only file system" in line and "writable folder" in line
    # a folder a command makes itself, outside the atomic writers: the top-level handler
    line = _refused(capsys, ["discover", *BACKBONE, "--calibration", str(study["calibration"]), "--depth", "4",
                             "--out", str(disk.out / "plan"), *FAST], "plan")
    assert "read-only file system" in line


PAGE = 4096  # tmpfs gives files whole pages


def _pages(n_bytes: int) -> int:
    return -(-n_bytes // PAGE) * PAGE


@pytest.mark.parametrize("when", ["before", "while"])
def test_extract_stops_on_a_full_disk_and_resumes(study, disk, tmp_path, when):
    """Three slides in one job: the first fits, the second does not, found before its file
    is written (the free space is below the features' size) or while it is (the space
    holds the features but not the whole file). The job stops in one line (it died with a
    segmentation fault, exit 139), the finished file stays, and after space is freed the
    rerun keeps it and writes the others as a clean run does."""
    import h5py

    from pathtwt.io.h5 import FeaturesWriter

    slides = study["slides"]

    def argv(out):
        return ["extract", *map(str, slides), "--coords", *[str(study["coords"] / f"{s.stem}.h5") for s in slides],
                "--out", *[str(out / f"{s.stem}.h5") for s in slides], *BACKBONE, *FAST, "--workers", "0",
                "--skip-existing"]

    clean = tmp_path / "clean"
    assert main(argv(clean)) == 0
    first = (clean / "a.h5").stat().st_size
    if when == "before":
        room = first // 2
    else:  # at least the least the writer says the file takes, less than the whole file
        with h5py.File(clean / "b.h5") as h5:
            least = FeaturesWriter(clean / "b.h5", n_tiles=h5["features"].shape[0], dim=h5["features"].shape[1],
                                   attrs={}).size()
        room = _pages(least)
        assert room < _pages((clean / "b.h5").stat().st_size)
    disk.leave(_pages(first) + room)
    res = subprocess.run(pathtwt_command(argv(disk.out)), capture_output=True, text=True, env=subprocess_env(),
                         timeout=300)
    assert res.returncode == 1, res.stderr
    line = _one_line("extract", res.stderr, ["b.h5"])
    _full(line)
    assert "needs at least" in line
    assert [p.name for p in visible_files(disk.out)] == ["a.h5"]
    assert_nothing_looks_finished(disk.out, reference=clean)
    disk.empty()
    rerun = subprocess.run(pathtwt_command(argv(disk.out)), capture_output=True, text=True, env=subprocess_env(),
                           timeout=300)
    assert rerun.returncode == 0, rerun.stderr
    assert '"skipped": true' in rerun.stdout  # a.h5 was kept, not redone
    assert compare_trees(clean, disk.out) == ["a.h5", "b.h5", "c.h5"]


def test_calibration_and_discovery_on_a_full_disk(study, disk, tmp_path, capsys):
    calibrate = ["calibrate", "--coords", str(study["coords"]), "--n-tiles", "16", "--holdout", "0.25", "--out"]
    discover = ["discover", *BACKBONE, "--calibration", str(study["calibration"]), "--depth", "4", *FAST, "--out"]
    assert main([*calibrate, str(tmp_path / "clean" / "calibration.h5")]) == 0
    assert main([*discover, str(tmp_path / "clean" / "plan")]) == 0
    disk.leave(0)
    _full(_refused(capsys, [*calibrate, str(disk.out / "calibration.h5")], "calibration.h5"))
    _full(_refused(capsys, [*discover, str(disk.out / "plan")], "plan"))
    assert_nothing_looks_finished(disk.out, markers=["*"])
    disk.empty()
    assert main([*calibrate, str(disk.out / "calibration.h5")]) == 0
    assert main([*discover, str(disk.out / "plan")]) == 0
    assert {"calibration.h5", "plan/plan.json", "plan/similarity.npy"} <= set(compare_trees(tmp_path / "clean", disk.out))


def test_compress_keeps_its_checkpoint_when_the_export_does_not_fit_and_resumes(study, disk, tmp_path, capsys):
    """Distillation's checkpoint fits, the exported model does not: one line; the rerun
    resumes from the checkpoint (no step redone) and exports what a clean run exports."""

    def argv(out):
        return ["compress", "--method", "twt", *BACKBONE, "--calibration", str(study["calibration"]), "--depth", "4",
                "--steps", "4", "--batch-size", "4", "--audition-steps", "0", "--checkpoint-every", "100",
                "--keep-checkpoint", *FAST, "--out", str(out)]

    clean = tmp_path / "clean"
    assert main(argv(clean)) == 0
    disk.leave((clean / "checkpoint.pt").stat().st_size + (clean / "model.safetensors").stat().st_size // 2)
    _full(_refused(capsys, argv(disk.out), "model.safetensors", "model.json"))
    assert [p.name for p in visible_files(disk.out)] == ["checkpoint.pt"]  # the resume file, nothing finished
    disk.empty()
    assert main(argv(disk.out)) == 0
    assert '"resumed_from": 4' in (disk.out / "model.json").read_text()  # every step was kept
    assert compare_trees(clean, disk.out, ignore=["checkpoint.pt"]) == ["README.md", "config.json", "model.json",
                                                                       "model.safetensors"]


def test_train_mil_on_a_full_disk_then_rerun(study, disk, tmp_path, capsys):
    cohort = study["cohort"]

    def argv(out):
        return ["train-mil", "--features", str(cohort.features_dir), "--labels", str(cohort.labels_csv),
                "--protocol", "metastasis", "--aggregator", "abmil", "--seed", "0", "--epochs", "3",
                "--hidden-dim", "16", *FAST, "--out", str(out)]

    assert main(argv(tmp_path / "clean")) == 0
    disk.leave(0)
    _full(_refused(capsys, argv(disk.out / "run"), "run"))
    assert_nothing_looks_finished(disk.out, markers=["*"])
    disk.empty()
    assert main(argv(disk.out / "run")) == 0
    compared = compare_trees(tmp_path / "clean", disk.out / "run", ignore=["resume.pt"])
    assert {"metrics.json", "predictions.csv", "checkpoint.pt"} <= set(compared)


def test_report_predict_and_heatmap_on_a_full_disk(study, disk, tmp_path, capsys):
    cohort = study["cohort"]
    run = tmp_path / "results" / "mil" / "vit-s14-tiny" / "uncompressed" / "metastasis" / "abmil" / "seed0"
    assert main(["train-mil", "--features", str(cohort.features_dir), "--labels", str(cohort.labels_csv),
                 "--protocol", "metastasis", "--aggregator", "abmil", "--seed", "0", "--epochs", "2",
                 "--hidden-dim", "16", *FAST, "--out", str(run)]) == 0
    report = ["report", "--results", str(tmp_path / "results"), "--metric", "metastasis=accuracy", "--out"]
    assert main([*report, str(tmp_path / "clean")]) == 0
    disk.leave(0)
    _full(_refused(capsys, [*report, str(disk.out / "report")], "report"))
    # heatmap and predict with a head trained on the tiny ViT's features of the study slides
    slide, coords = study["slides"][0], study["coords"] / "a.h5"
    features = tmp_path / "features"
    assert main(["extract", str(slide), "--coords", str(coords), "--out", str(features / "a.h5"), *BACKBONE, *FAST,
                 "--workers", "0"]) == 0
    for i in range(4):
        (features / f"s{i}.h5").write_bytes((features / "a.h5").read_bytes())
    pd.DataFrame({"slide_id": [f"s{i}" for i in range(4)] + ["a"], "label": [0, 1, 0, 1, 0],
                  "split": ["train", "train", "train", "val", "val"]}).to_csv(tmp_path / "labels.csv", index=False)
    head = tmp_path / "head"
    assert main(["train-mil", "--features", str(features), "--labels", str(tmp_path / "labels.csv"), "--protocol",
                 "metastasis", "--aggregator", "abmil", "--epochs", "1", "--hidden-dim", "16", *FAST,
                 "--out", str(head)]) == 0
    capsys.readouterr()
    _full(_refused(capsys, ["heatmap", str(slide), "--coords", str(coords), "--features", str(features / "a.h5"),
                            "--run", str(head), "--out", str(disk.out / "heatmaps")], "heatmaps"))
    _full(_refused(capsys, ["predict", str(slide), *BACKBONE, "--run", str(head), *FAST, "--workers", "0",
                            "--out", str(disk.out / "predictions.csv")], "predictions.csv"))
    assert_nothing_looks_finished(disk.out, markers=["*"])
    disk.empty()
    assert main([*report, str(disk.out / "report")]) == 0
    assert "index.html" in compare_trees(tmp_path / "clean", disk.out / "report")


# -- the writers' libraries, each on a full disk -----------------------------------------------


def _torch_save(tmp):
    import torch

    torch.save({"w": torch.zeros(256, 256)}, tmp)


def _safetensors(tmp):
    import torch
    from safetensors.torch import save_file

    save_file({"w": torch.zeros(256, 256)}, str(tmp))


def _numpy_save(tmp):
    with open(tmp, "wb") as fh:
        np.save(fh, np.zeros((256, 256)))


def _png(tmp):
    from PIL import Image

    Image.fromarray(np.random.default_rng(0).integers(0, 255, (300, 300, 3), dtype=np.uint8)).save(tmp, format="PNG")


def _figure(tmp):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig = plt.figure()
    plt.imshow(np.random.default_rng(0).random((300, 300)))
    fig.savefig(tmp, format="png")
    plt.close(fig)


def _csv(tmp):
    pd.DataFrame(np.zeros((2000, 20))).to_csv(tmp)


def _hdf5(tmp):
    from pathtwt.io.h5_writer import writing_h5

    with writing_h5(tmp) as h5:
        h5.create_dataset("x", data=np.zeros((256, 256)))


@pytest.mark.parametrize("write", [_torch_save, _safetensors, _numpy_save, _png, _figure, _csv, _hdf5],
                         ids=lambda f: f.__name__.strip("_"))
def test_every_library_that_writes_is_told_apart_on_a_full_disk(disk, write):
    """Each library reports a full disk in its own words (torch.save: 'unexpected pos',
    numpy: 'N requested and M written'); atomic_output says it in one and leaves nothing."""
    disk.leave(8192)
    with pytest.raises(OutputError, match=r"out/result: cannot write it: no space left on the device "
                                          r"\((.* written when it failed; )?.* free on .*\)"):
        with atomic_output(disk.out / "result", suffix=".bin") as tmp:
            write(tmp)
    assert list(disk.out.iterdir()) == []
    disk.empty()
    with atomic_output(disk.out / "result", suffix=".bin") as tmp:
        write(tmp)
    assert (disk.out / "result").stat().st_size > 8192


def test_a_full_quota_and_an_unrelated_failure_are_told_apart(tmp_path):
    with pytest.raises(OutputError, match=r"x.json: cannot write it: disk quota exceeded .*quota"):
        with atomic_output(tmp_path / "x.json"):
            raise OSError(errno.EDQUOT, "Disk quota exceeded")
    with pytest.raises(ValueError, match="not a disk"):  # any other failure is left as it is
        with atomic_output(tmp_path / "x.json"):
            raise ValueError("not a disk")
    assert list(tmp_path.iterdir()) == []


HDF5_SWEEP = """
import errno, os, sys
import numpy as np
from pathtwt.errors import OutputError
from pathtwt.io.h5 import FeaturesWriter

out, real = sys.argv[1], os.pwrite
for fail_at in range(10_000):
    calls = [0]
    def pwrite(fd, data, offset):
        calls[0] += 1
        if calls[0] > fail_at:
            raise OSError(errno.ENOSPC, "No space left on device")
        return real(fd, data, offset)
    os.pwrite = pwrite
    try:
        with FeaturesWriter(out, n_tiles=3000, dim=64, attrs={"encoder": "x" * 500}) as w:
            w.coords[...] = np.full((3000, 2), 7)
            for i in range(0, 3000, 256):
                w.features[i:i + 256] = np.full((min(256, 3000 - i), 64), i, np.float32)
    except OutputError as exc:
        assert "no space left on the device" in str(exc), exc
        assert not os.listdir(os.path.dirname(out)), os.listdir(os.path.dirname(out))
        continue
    finally:
        os.pwrite = real
    print(fail_at)  # the first count of writes that lets the file through
    break
"""


def test_the_hdf5_writer_survives_a_failed_write_at_every_point(tmp_path):
    """HDF5 that met a failed write crashed at close or at exit; the features writer fails
    each of its writes in turn (in a process of its own, which must exit cleanly) and
    raises one OutputError, leaving nothing."""
    out = tmp_path / "w" / "x.h5"
    out.parent.mkdir()
    res = subprocess.run([sys.executable, "-c", HDF5_SWEEP, str(out)], capture_output=True, text=True, timeout=300)
    assert res.returncode == 0, res.stderr[-3000:]
    writes = int(res.stdout.split()[-1])
    assert writes > 5, res.stdout  # the failure was met at many points: data, metadata, close
    import h5py

    with h5py.File(out) as h5:
        assert h5["features"][2999, 0] == 2816 and h5["coords"][0, 0] == 7
