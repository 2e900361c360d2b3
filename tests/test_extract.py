"""Extraction end to end on a real slide: coords file -> features file, through the CLI too."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from pathtwt.io import h5 as h5io
from pathtwt.models.registry import create_backbone
from pathtwt.cli import main
from pathtwt.errors import NumericsError, PathtwtError, SlideError
from pathtwt.features.extract import extract_slide
from cmu_coords import CMU, write_cmu_coords

XY = [(0, 0), (448, 0), (896, 448), (1344, 896), (448, 1792), (1700, 2400), (224, 2500)]


@pytest.fixture(scope="module")
def tiny():
    return create_backbone("h0-mini-tiny", pretrained=False, init_seed=3)


def test_extract_real_slide_with_workers_keeps_order(tmp_path, shared_slides, tiny):
    from pathtwt.wsi.slides import open_slide

    slide = shared_slides / CMU
    coords = write_cmu_coords(tmp_path / "c.h5", slide, XY)
    summary = extract_slide(slide, coords, tmp_path / "f.h5", tiny, batch_size=3, workers=2, progress=False)
    assert summary["tiles"] == len(XY)
    feats, xy, attrs = h5io.read_features(tmp_path / "f.h5")
    assert feats.shape == (len(XY), 128) and np.isfinite(feats).all()
    assert xy.tolist() == [list(p) for p in XY]
    assert attrs["backbone"] == "h0-mini-tiny" and attrs["embedding_recipe"] == "cls+mean"
    assert attrs["patch_size_level0"] == 448 and attrs["read_level"] == 0 and attrs["status"] == "ok"
    # the same tiles embedded in this process, in another order, give the same rows
    with open_slide(slide) as s:
        tiles = [s.read_tile(x, y, 448, 0, 224) for x, y in XY[::-1]]
    with torch.inference_mode():
        direct = tiny.embed_tiles(tiny.transform.batch(tiles)).numpy()[::-1]
    assert np.allclose(feats, direct, atol=1e-5)
    assert not [p.name for p in tmp_path.iterdir() if p.name.startswith(".")]


def test_zero_tile_slide_gives_valid_empty_file(tmp_path, shared_slides, tiny):
    coords = write_cmu_coords(tmp_path / "c.h5", shared_slides / CMU, [], status="no_tissue")
    extract_slide(shared_slides / CMU, coords, tmp_path / "f.h5", tiny, progress=False)
    feats, xy, attrs = h5io.read_features(tmp_path / "f.h5")
    assert feats.shape == (0, 128) and xy.shape == (0, 2)
    assert attrs["n_tiles"] == 0 and attrs["coords_status"] == "no_tissue"


def test_cli_manifest_extracts_several_slides_with_one_backbone(tmp_path, shared_slides, capsys):
    slide = shared_slides / CMU
    write_cmu_coords(tmp_path / "a.h5", slide, XY[:2])
    write_cmu_coords(tmp_path / "b.h5", slide, [])
    manifest = tmp_path / "jobs.tsv"
    manifest.write_text(
        "slide\tcoords\tout\n"
        f"{slide}\t{tmp_path / 'a.h5'}\t{tmp_path / 'out' / 'a.h5'}\n"
        f"{slide}\t{tmp_path / 'b.h5'}\t{tmp_path / 'out' / 'b.h5'}\n"
    )
    argv = ["extract", "--manifest", str(manifest), "--backbone", "vit-s14-tiny", "--random-init",
            "--workers", "0", "--no-progress", "--device", "cpu"]
    assert main(argv) == 0
    assert h5io.read_features(tmp_path / "out" / "a.h5")[0].shape == (2, 128)
    assert h5io.read_features(tmp_path / "out" / "b.h5")[0].shape == (0, 128)
    capsys.readouterr()
    assert main(argv + ["--skip-existing"]) == 0
    assert capsys.readouterr().out.count('"skipped": true') == 2
    assert main(["extract", str(slide), "--coords", str(tmp_path / "a.h5"), "--backbone", "nope",
                 "--out", str(tmp_path / "x.h5")]) == 1
    err = capsys.readouterr().err
    assert "known backbones: " in err and "h0-mini," in err
    if not torch.cuda.is_available():
        assert main(argv + ["--decode", "gpu"]) == 1
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and "decode gpu: CUDA is not available" in err[0]


def test_unreadable_tile_names_slide_and_coords_and_leaves_nothing(tmp_path, shared_slides, tiny):
    slide = shared_slides / "unreadable.svs"
    coords = write_cmu_coords(tmp_path / "c.h5", slide, [(0, 0)])
    with pytest.raises(SlideError) as err:
        extract_slide(slide, coords, tmp_path / "f.h5", tiny, workers=1, progress=False)
    # the slide is opened (to check it against the coords) before any worker starts: its
    # damaged first tile fails there, named by slide and position
    assert "unreadable.svs" in str(err.value) and "x=0 y=0" in str(err.value) and "\n" not in str(err.value)
    assert list(tmp_path.iterdir()) == [coords]


def test_nan_features_raise_numerics_error(tmp_path, shared_slides):
    broken = create_backbone("vit-s14-tiny", pretrained=False)
    with torch.no_grad():
        broken.model.blocks[4].mlp.fc1.weight[0, 0] = float("nan")
    coords = write_cmu_coords(tmp_path / "c.h5", shared_slides / CMU, XY[:2])
    with pytest.raises(NumericsError, match=CMU):
        extract_slide(shared_slides / CMU, coords, tmp_path / "f.h5", broken, workers=0, progress=False)
    assert not (tmp_path / "f.h5").exists()


def test_failures_table_records_a_corrupt_slide_and_the_cohort_goes_on(tmp_path, shared_slides, capsys):
    import cv2

    from pathtwt.io.failures import read_failures

    good, bad = shared_slides / CMU, shared_slides / "unreadable.svs"
    write_cmu_coords(tmp_path / "good.h5", good, XY[:3])
    write_cmu_coords(tmp_path / "bad.h5", bad, [(0, 0)])
    manifest = tmp_path / "jobs.tsv"
    manifest.write_text(
        f"{bad}\t{tmp_path / 'bad.h5'}\t{tmp_path / 'feats' / 'bad.h5'}\n"
        f"{good}\t{tmp_path / 'good.h5'}\t{tmp_path / 'feats' / 'good.h5'}\n"
    )
    cv2.resize(np.zeros((64, 64, 3), np.uint8), (32, 32))  # OpenCV used before forking workers
    argv = ["extract", "--manifest", str(manifest), "--backbone", "vit-s14-tiny", "--random-init",
            "--workers", "1", "--no-progress", "--device", "cpu"]
    assert main(argv) == 1  # without --failures the first failure stops the run
    assert "unreadable.svs" in capsys.readouterr().err
    assert main(argv + ["--failures", str(tmp_path / "failures.tsv")]) == 0
    feats, _, attrs = h5io.read_features(tmp_path / "feats" / "bad.h5")
    assert feats.shape == (0, 128) and attrs["status"] == "failed" and "unreadable.svs" in attrs["failure_reason"]
    assert h5io.read_features(tmp_path / "feats" / "good.h5")[0].shape == (3, 128)
    rows = read_failures(tmp_path / "failures.tsv")
    assert [(r.slide, r.stage) for r in rows] == [("unreadable", "extract")]


def test_cls_embedding_is_the_cls_half_of_cls_mean(tmp_path, shared_slides, tiny):
    slide = shared_slides / CMU
    coords = write_cmu_coords(tmp_path / "c.h5", slide, XY[:3])
    extract_slide(slide, coords, tmp_path / "a.h5", tiny, workers=0, progress=False)
    extract_slide(slide, coords, tmp_path / "b.h5", tiny, workers=0, progress=False, embedding="cls")
    both, _, both_attrs = h5io.read_features(tmp_path / "a.h5")
    cls, _, cls_attrs = h5io.read_features(tmp_path / "b.h5")
    assert cls.shape == (3, 64) and np.allclose(cls, both[:, :64], atol=1e-6)
    assert not np.allclose(both[:, 64:], both[:, :64], atol=1e-3)
    assert (cls_attrs["embedding_recipe"], cls_attrs["embedding_dim"]) == ("cls", 64)
    assert (both_attrs["embedding_recipe"], both_attrs["embedding_dim"]) == ("cls+mean", 128)
    with pytest.raises(PathtwtError, match="use one of cls\\+mean, cls"):
        extract_slide(slide, coords, tmp_path / "c.h5", tiny, workers=0, progress=False, embedding="mean")


def test_the_device_path_gives_the_cpu_paths_rows(tmp_path, shared_slides, tiny):
    """The GPU path end to end on a CPU: forked readers ship each batch's compressed native
    tiles and a cut plan, the embedding process decodes them (the host decoder standing in
    for nvImageCodec: the same libjpeg-turbo as the CPU path), cuts with one gather and
    shrinks on the device. Same pixels as the CPU path, so the same rows."""
    from pathtwt.features import gpu_decoders, jpeg_reference

    slide = shared_slides / CMU
    coords = write_cmu_coords(tmp_path / "c.h5", slide, XY)
    extract_slide(slide, coords, tmp_path / "cpu.h5", tiny, batch_size=3, workers=2, progress=False, decode="cpu")
    extract_slide(slide, coords, tmp_path / "gpu.h5", tiny, batch_size=3, workers=2, progress=False,
                  gpu_decoder="host")
    cpu, gpu = h5io.read_features(tmp_path / "cpu.h5"), h5io.read_features(tmp_path / "gpu.h5")
    assert np.abs(cpu[0] - gpu[0]).max() <= 1e-5 and np.array_equal(cpu[1], gpu[1])
    assert gpu[2]["decode"] == "GPU (host, embedding process)" and cpu[2]["decode"] == "CPU (reading processes)"
    # what the first-stream check of each slide allows a decoder that states no tolerance: the
    # one measured bound, not a second figure
    assert gpu_decoders.BatchDecoder("plain", list).tolerance == jpeg_reference.TOLERANCE


def _off_by_three(tolerance: int):
    """A GPU decoder stand-in whose pixels are its reference's (libjpeg, fancy upsampling)
    plus 3 grey levels."""
    from pathtwt.features.gpu_decoders import BatchDecoder
    from pathtwt.features.jpeg_reference import fancy

    def decode(streams):
        return [torch.from_numpy(np.clip(fancy(s).astype(np.int16) + 3, 0, 255).astype(np.uint8))
                for s in streams]

    return BatchDecoder(f"tolerance{tolerance}", decode, tolerance=tolerance, decodes_rgb=True)


def test_a_gpu_decoder_off_by_more_than_its_tolerance_falls_back_and_the_features_file_says_so(
        tmp_path, shared_slides, tiny, monkeypatch, caplog, capsys):
    """Off by 3 with a tolerance of 2: the slide goes to the CPU path (one line naming it),
    its rows are the CPU path's and its file records where its tiles were decoded; with a
    tolerance of 6 the decoder's own pixels are used and nothing falls back."""
    import logging

    from pathtwt.features import gpu_decoders

    decoders = {"tolerance2": _off_by_three(2), "tolerance6": _off_by_three(6)}
    for name, decoder in decoders.items():
        monkeypatch.setitem(gpu_decoders.GPU_DECODERS, name,
                            gpu_decoders.Entry(lambda: True, lambda device, d=decoder: d, False))
    slide = shared_slides / CMU
    coords = write_cmu_coords(tmp_path / "c.h5", slide, XY)
    extract_slide(slide, coords, tmp_path / "cpu.h5", tiny, batch_size=3, workers=1, progress=False, decode="cpu")
    capsys.readouterr()
    with caplog.at_level(logging.WARNING, logger="pathtwt.features.device_tiles"):
        extract_slide(slide, coords, tmp_path / "strict.h5", tiny, batch_size=3, workers=1, progress=False,
                      gpu_decoder="tolerance2")
    fell_back = capsys.readouterr().err
    extract_slide(slide, coords, tmp_path / "loose.h5", tiny, batch_size=3, workers=1, progress=False,
                  gpu_decoder="tolerance6")
    kept = capsys.readouterr().err
    cpu, strict, loose = (h5io.read_features(tmp_path / f"{n}.h5") for n in ("cpu", "strict", "loose"))
    lines = [r.getMessage() for r in caplog.records if "differ" in r.getMessage()]
    assert len(lines) == 1 and lines[0].startswith(f"{slide}: ") and "by 3 grey levels (more than 2)" in lines[0]
    assert np.abs(cpu[0] - strict[0]).max() <= 1e-5
    attrs = strict[2]
    assert attrs["decode"].startswith("CPU") and "GPU (tolerance2" not in attrs["decode"]
    assert attrs["natives_decoded_device"] == 0 and attrs["natives_decoded_host"] >= len(XY)
    assert "differ from its reference by 3 grey levels (more than 2)" in attrs["decode_fallback"]
    assert "1 slide(s) were decoded on the CPU" in fell_back and "decode_fallback" in fell_back
    attrs = loose[2]
    assert attrs["decode"] == "GPU (tolerance6, embedding process)" and attrs["decode_fallback"] == ""
    assert attrs["natives_decoded_host"] == 0 and attrs["natives_decoded_device"] >= len(XY)
    assert np.abs(cpu[0] - loose[0]).max() > 1e-3  # the decoder's own pixels made these rows
    assert "decoded on the CPU" not in kept
