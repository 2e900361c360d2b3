"""Slides that are not what tiling expects, each met with one line or an explicit option:
fluorescence scans (as RGB JPEG in an NDPI-like file and as one page per channel),
coords from another slide, formats no reader here handles (Olympus VSI, MIRAX without
its folder, a label image as the largest image), upsampling, truncated files, folders
given as slides or outputs, slides smaller than one tile, and what killed runs and
reader libraries leave behind."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import textwrap

import numpy as np
import pytest
import tifffile
from wsi_writers import (
    fluorescence_channels,
    he_image,
    pyramid,
    write_channel_pages,
    write_generic_tiff,
    write_ndpi_like,
)

from pathtwt.cli import main
from pathtwt.io.h5 import read_attrs, read_coords
from pathtwt.wsi.slides import open_options_from_attrs, open_slide

MPP = 0.5
CMU = "CMU-1-Small-Region.svs"


def _error_line(capsys) -> str:
    err = capsys.readouterr().err
    lines = err.strip().splitlines()
    assert len(lines) == 1, err  # one line, no traceback, no reader chatter
    return lines[0]


@pytest.fixture(scope="module")
def fluorescence(tmp_path_factory):
    folder = tmp_path_factory.mktemp("fluorescence")
    channels, truth = fluorescence_channels(2048, 1536, seed=4)
    return {
        "ndpi": write_ndpi_like(folder / "fluo-ndpi.tiff", pyramid(channels), MPP),
        "pages": write_channel_pages(folder / "fluo-pages.ome.tiff", channels, MPP),
        "channels": channels,
        "truth": truth,
    }


# -- 1. fluorescence stored as RGB JPEG is not tiled as brightfield -------------------------
def test_fluorescence_rgb_jpeg_is_refused_as_brightfield(fluorescence, tmp_path, capsys):
    out = tmp_path / "fluo.h5"
    assert main(["tile", str(fluorescence["ndpi"]), "--out", str(out)]) == 1
    line = _error_line(capsys)
    assert "fluo-ndpi.tiff" in line and "not a brightfield slide" in line and "dark" in line
    assert "--channels" in line and "modality: fluorescence" in line
    assert not out.exists() and list(tmp_path.iterdir()) == []


def test_brightfield_slide_is_refused_in_fluorescence_mode(shared_slides, tmp_path, capsys):
    out = tmp_path / "cmu.h5"
    assert main(["tile", str(shared_slides / CMU), "--out", str(out), "--modality", "fluorescence"]) == 1
    line = _error_line(capsys)
    assert CMU in line and "not a fluorescence slide" in line and "background is bright" in line
    assert not out.exists()


# -- 2. with --channels, tissue is found by intensity ----------------------------------------
def _tiles_on_truth(coords: np.ndarray, truth: np.ndarray, side: int) -> np.ndarray:
    return np.array([truth[y : y + side, x : x + side].mean() for x, y in coords.tolist()])


@pytest.mark.parametrize("layout, options", [
    ("ndpi", ["--channels", "0,1,2"]),
    ("ndpi", ["--modality", "fluorescence"]),
    ("pages", ["--channels", "0,1,2"]),
])
def test_fluorescence_tissue_found_by_intensity(fluorescence, tmp_path, layout, options):
    out = tmp_path / "fluo.h5"
    assert main(["tile", str(fluorescence[layout]), "--out", str(out), *options]) == 0
    coords, _, attrs = read_coords(out)
    assert attrs["status"] == "ok" and attrs["modality"] == "fluorescence" and attrs["tissue_signal"] == "intensity"
    assert attrs["channel_map"] == [0, 1, 2] and attrs["reader"] == "tiffslide"
    truth = fluorescence["truth"]
    on_tissue = _tiles_on_truth(coords, truth, 256)
    # every kept tile is tissue, and every tile lying wholly on tissue is kept
    assert len(coords) >= 6 and on_tissue.min() > 0.5, on_tissue
    whole = [(x, y) for y in range(0, 1536 - 255, 256) for x in range(0, 2048 - 255, 256)
             if truth[y : y + 256, x : x + 256].all()]
    assert set(whole) <= {tuple(c) for c in coords.tolist()}


def test_channel_pages_are_refused_without_channels_and_mapped_to_rgb_with_them(fluorescence, tmp_path, capsys):
    out = tmp_path / "pages.h5"
    assert main(["tile", str(fluorescence["pages"]), "--out", str(out)]) == 1
    line = _error_line(capsys)
    assert "fluo-pages.ome.tiff" in line and "not 8-bit RGB" in line and "`channels`" in line
    # the documented mapping: channel I -> red, J -> green, K -> blue, as in extraction
    assert main(["tile", str(fluorescence["pages"]), "--out", str(out), "--channels", "2,0,1"]) == 0
    coords, _, attrs = read_coords(out)
    channels = fluorescence["channels"]
    with open_slide(fluorescence["pages"], **open_options_from_attrs(attrs)) as slide:
        x, y = (int(v) for v in coords[0])
        np.testing.assert_array_equal(slide.read_tile(x, y, 256, 0, 256), channels[y : y + 256, x : x + 256][..., [2, 0, 1]])


def test_fluorescence_extraction_writes_features(fluorescence, tmp_path):
    from pathtwt.features.extract import extract_slide
    from pathtwt.io.h5 import read_features
    from pathtwt.models.registry import create_backbone

    coords = tmp_path / "pages.h5"
    assert main(["tile", str(fluorescence["pages"]), "--out", str(coords), "--channels", "0,1,2", "--mpp", "1.0",
                 "--tile-size", "112"]) == 0
    backbone = create_backbone("vit-s14-tiny", pretrained=False)
    out = tmp_path / "features.h5"
    extract_slide(fluorescence["pages"], coords, out, backbone, batch_size=8, workers=0, progress=False)
    feats, xy, attrs = read_features(out)
    assert attrs["status"] == "ok" and len(feats) == len(xy) > 0 and np.isfinite(feats).all()
    assert attrs["slide_check"] == "fingerprint"


# -- 3. coords belong to their slide ---------------------------------------------------------
@pytest.fixture(scope="module")
def two_slides(tmp_path_factory):
    folder = tmp_path_factory.mktemp("two")
    a = write_generic_tiff(folder / "slide_a.tiff", pyramid(he_image(1024, 768, seed=1)), MPP)
    b = write_generic_tiff(folder / "slide_b.tiff", pyramid(he_image(1024, 768, seed=2)), MPP)
    coords_b = folder / "coords_b.h5"
    assert main(["tile", str(b), "--out", str(coords_b), "--tile-size", "224", "--tissue", "otsu"]) == 0
    return a, b, coords_b


def test_coords_record_the_slide_fingerprint(two_slides):
    from pathtwt.wsi.fingerprint import head_tail_sha256

    _, b, coords_b = two_slides
    attrs = read_attrs(coords_b)
    size, digest = head_tail_sha256(b)
    assert attrs["slide_size_bytes"] == size == b.stat().st_size and attrs["slide_head_tail_sha256"] == digest
    assert attrs["slide_level_count"] == 3 and attrs["level0_width"] == 1024 and attrs["level0_mpp"] == pytest.approx(MPP)


def test_extract_refuses_coords_of_another_slide(two_slides, tmp_path, capsys):
    a, b, coords_b = two_slides
    out = tmp_path / "a.h5"
    args = ["extract", str(a), "--coords", str(coords_b), "--out", str(out), "--backbone", "vit-s14-tiny",
            "--random-init", "--device", "cpu", "--workers", "0", "--no-progress"]
    # same size, levels and mpp: only the file fingerprint tells them apart
    assert main(args) == 1
    line = _error_line(capsys)
    assert "slide_a.tiff" in line and "coords_b.h5" in line and "slide_b.tiff" in line
    assert "slide_head_tail_sha256" in line and "--force" in line
    assert not out.exists()
    # a copy of slide B under another name is the same scan
    copy = tmp_path / "renamed_b.tiff"
    shutil.copyfile(b, copy)
    assert main([*args[:1], str(copy), *args[2:]]) == 0
    assert read_attrs(out)["slide_check"] == "fingerprint"
    # --force: the documented way round, recorded in the features file
    forced = tmp_path / "forced.h5"
    assert main([*args[:5], str(forced), *args[6:], "--force"]) == 0
    assert read_attrs(forced)["slide_check"] == "forced"


def test_extract_refuses_a_slide_of_another_size_with_old_coords(two_slides, shared_slides, tmp_path, capsys):
    """Coords written before the fingerprint existed still have the geometry to compare."""
    import h5py

    _, _, coords_b = two_slides
    old = tmp_path / "old.h5"
    shutil.copyfile(coords_b, old)
    with h5py.File(old, "r+") as h5:
        for key in ("slide_level_count", "slide_size_bytes", "slide_head_tail_sha256"):
            del h5.attrs[key]
    assert main(["extract", str(shared_slides / CMU), "--coords", str(old), "--out", str(tmp_path / "x.h5"),
                 "--backbone", "vit-s14-tiny", "--random-init", "--device", "cpu", "--workers", "0", "--no-progress"]) == 1
    line = _error_line(capsys)
    assert CMU in line and "old.h5" in line and "level0_width 1024 vs 2220" in line


# -- 4. formats that need a reader pathtwt lacks ---------------------------------------------
def _overview_tiff(path, description=None):
    image = he_image(400, 300, seed=3)
    tifffile.imwrite(path, image, photometric="rgb", description=description, metadata=None)
    return path


def test_olympus_vsi_is_refused_by_name(tmp_path, capsys):
    vsi = _overview_tiff(tmp_path / "case 7.vsi")  # the .vsi holds only the overview image
    (tmp_path / "_case 7_" / "stack1").mkdir(parents=True)
    (tmp_path / "_case 7_" / "stack1" / "frame_t.ets").write_bytes(b"SIS\x00" + bytes(60))
    for extra in ([], ["--slide-mpp", "0.5"]):  # following the mpp advice must not tile the overview
        out = tmp_path / "vsi.h5"
        assert main(["tile", str(vsi), "--out", str(out), *extra]) == 1
        line = _error_line(capsys)
        assert "case 7.vsi" in line and "Olympus VSI" in line and "bfconvert" in line and not out.exists()
    assert main(["tile", str(tmp_path / "_case 7_"), "--out", str(tmp_path / "d.h5")]) == 1
    line = _error_line(capsys)
    assert "is a folder" in line and ".vsi" in line


def test_mirax_without_its_folder_is_refused_by_name(tmp_path, capsys):
    mrxs = tmp_path / "slide.mrxs"
    mrxs.write_text("[GENERAL]\nSLIDE_VERSION = 01.02\n")
    assert main(["tile", str(mrxs), "--out", str(tmp_path / "m.h5")]) == 1
    line = _error_line(capsys)
    assert "slide.mrxs" in line and "MIRAX without its data folder" in line and "Slidedat.ini" in line


def test_label_image_as_largest_image_is_refused(tmp_path, capsys):
    label = _overview_tiff(tmp_path / "export.tiff", description="Aperio Image Library v12.0.15\nlabel 400x300")
    assert main(["tile", str(label), "--out", str(tmp_path / "l.h5"), "--slide-mpp", "0.5"]) == 1
    line = _error_line(capsys)
    assert "export.tiff" in line and "is a label image" in line and "bfconvert" in line


# -- 5. no silent upsampling -----------------------------------------------------------------
def test_upsampling_is_an_error_unless_allowed(two_slides, tmp_path, capsys):
    a, _, _ = two_slides
    out = tmp_path / "up.h5"
    assert main(["tile", str(a), "--out", str(out), "--mpp", "0.25"]) == 1
    line = _error_line(capsys)
    assert "slide_a.tiff" in line and "0.25 um/px" in line and "(0.5 um/px" in line and "--allow-upsample" in line
    assert not out.exists()
    # within 1 %: the slide's own resolution, no complaint
    assert main(["tile", str(a), "--out", str(out), "--mpp", "0.496", "--tissue", "otsu"]) == 0
    assert capsys.readouterr().err == ""
    assert main(["tile", str(a), "--out", str(out), "--mpp", "0.25", "--allow-upsample", "--tissue", "otsu"]) == 0
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "warning" in err[0] and "upsampled 2.00x" in err[0]  # warned once
    attrs = read_attrs(out)
    assert attrs["allow_upsample"] and attrs["upsample_factor"] == pytest.approx(2.0) and attrs["patch_size_level0"] == 128


def test_slide_mpp_fallback_does_not_upsample_silently(shared_slides, tmp_path, capsys):
    out = tmp_path / "boxes.h5"
    assert main(["tile", str(shared_slides / "boxes.tiff"), "--out", str(out), "--slide-mpp", "2.0"]) == 1
    line = _error_line(capsys)
    assert "boxes.tiff" in line and "(2 um/px, from fallback)" in line and "upsampled 4.00x" in line


# -- 6. one-line errors ----------------------------------------------------------------------
def test_truncated_svs_says_truncated_with_both_readers_reasons(shared_slides, tmp_path, capsys):
    cut = tmp_path / "cut.svs"
    cut.write_bytes((shared_slides / CMU).read_bytes()[:1_000_000])
    out = tmp_path / "cut.h5"
    assert main(["tile", str(cut), "--out", str(out)]) == 1
    line = _error_line(capsys)  # tifffile's own log line is inside it, not printed apart
    assert "cut.svs" in line and "truncated" in line and "OpenSlide:" in line and "tiffslide:" in line
    assert "invalid offset to first page" in line and not out.exists()


def test_folder_as_slide_and_as_output(shared_slides, two_slides, tmp_path, capsys):
    assert main(["tile", str(tmp_path), "--out", str(tmp_path / "x.h5")]) == 1
    line = _error_line(capsys)
    assert str(tmp_path) in line and "is a folder, not a slide file" in line
    assert main(["extract", str(tmp_path), "--coords", str(two_slides[2]), "--out", str(tmp_path / "f.h5"),
                 "--backbone", "vit-s14-tiny", "--random-init", "--device", "cpu"]) == 1
    line = _error_line(capsys)
    assert str(tmp_path) in line and "is a folder, not a slide file" in line and "coords_b.h5" in line
    folder = tmp_path / "out"
    folder.mkdir()
    assert main(["tile", str(shared_slides / CMU), "--out", str(folder)]) == 1
    line = _error_line(capsys)
    assert f"--out {folder}: is a folder" in line
    assert main(["extract", str(shared_slides / CMU), "--coords", str(tmp_path / "c.h5"), "--out", str(folder),
                 "--backbone", "vit-s14-tiny", "--random-init"]) == 1
    assert "is a folder" in _error_line(capsys)
    assert list(folder.iterdir()) == []


def test_atomic_output_refuses_a_folder(tmp_path):
    from pathtwt.errors import PathtwtError
    from pathtwt.io.atomic import write_text_atomic

    with pytest.raises(PathtwtError, match="is a folder"):
        write_text_atomic(tmp_path, "x")


def test_slide_smaller_than_one_tile_is_too_small(tmp_path):
    small = write_generic_tiff(tmp_path / "tiny.tiff", [he_image(50, 50, seed=1)], MPP, compression=None)
    out = tmp_path / "tiny.h5"
    assert main(["tile", str(small), "--out", str(out), "--tissue", "otsu"]) == 0
    coords, _, attrs = read_coords(out)
    assert attrs["status"] == "too_small" and coords.shape == (0, 2)


# -- 7. leftovers ----------------------------------------------------------------------------
def test_rerun_removes_temporaries_of_killed_runs(two_slides, tmp_path):
    from pathtwt.io.atomic import remove_stale_temporaries

    a, _, _ = two_slides
    out = tmp_path / "coords.h5"
    # a writer killed with SIGKILL while its temporary file exists
    code = textwrap.dedent(f"""
        import sys, time
        from pathtwt.io.atomic import atomic_output
        with atomic_output({str(out)!r}) as tmp:
            tmp.write_bytes(b"half")
            print(tmp, flush=True)
            time.sleep(60)
    """)
    proc = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True,
                            env={**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)})
    tmp_file = proc.stdout.readline().strip()
    assert ".coords.h5.tmp-" in tmp_file and f"-{proc.pid}-" in tmp_file
    assert remove_stale_temporaries(out) == []  # its writer is alive: left alone
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()
    proc.stdout.close()
    left = [p.name for p in tmp_path.iterdir()]
    assert left == [os.path.basename(tmp_file)]
    other_host = tmp_path / ".coords.h5.tmp-othernode-1-abc.h5"  # may belong to a live job elsewhere
    other_host.write_bytes(b"")
    assert main(["tile", str(a), "--out", str(out), "--tissue", "otsu"]) == 0
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(["coords.h5", other_host.name])


def test_reader_warnings_go_to_the_coords_file_not_the_terminal(tmp_path):
    # tifffile logs "invalid offset to first page" for a file named .ndpi that lacks the
    # 64-bit offsets of a real NDPI (OpenSlide reads it). In its own process, so the
    # terminal is the real one (pytest's log capture would hide the line).
    path = write_ndpi_like(tmp_path / "scan.ndpi", pyramid(he_image(1024, 768, seed=6)), MPP)
    out = tmp_path / "scan.h5"
    result = subprocess.run([sys.executable, "-m", "pathtwt", "tile", str(path), "--out", str(out), "--tissue", "otsu"],
                            capture_output=True, text=True, timeout=120,
                            env={**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)})
    assert result.returncode == 0 and result.stderr == "", result.stderr
    assert len(result.stdout.strip().splitlines()) == 1
    notes = json.loads(read_attrs(out)["reader_notes"])  # a list of strings, stored as JSON
    assert any(n.startswith("tifffile:") and "invalid offset to first page" in n for n in notes), notes
