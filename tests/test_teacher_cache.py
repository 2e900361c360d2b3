"""The teacher cache beside a calibration file (pathtwt.compress.teacher_cache): a second
job on the same teacher and tiles reads the fit means and reference rows instead of
recomputing them and gets the same values; other tiles, another teacher or another batch
size miss; a damaged entry is recomputed; the cache can be switched off."""

from __future__ import annotations

import numpy as np
import pytest
import torch

import pathtwt.compress.fidelity as fidelity
from pathtwt.compress.calibration import load_calibration, write_calibration
from pathtwt.compress.teacher_cache import SUFFIX
from pathtwt.models.registry import create_backbone


class _Drawn:
    """What write_calibration stores: 40 smooth tiles split 24 fit / 8 select / 8 report."""

    def __init__(self, seed: int = 0) -> None:
        rng = np.random.default_rng(seed)
        base = rng.integers(40, 220, size=(40, 1, 1, 3))
        self.tiles = np.clip(base + rng.normal(0, 25, size=(40, 56, 56, 3)), 0, 255).astype(np.uint8)
        self.split = np.array([0] * 24 + [1] * 8 + [2] * 8, dtype=np.int64)
        self.source_index = np.zeros(40, dtype=np.int32)
        self.origins = np.zeros((40, 2), dtype=np.int64)
        self.sources = ["synthetic"]
        self.patch_size = 56


def _teacher(seed: int = 5):
    bb = create_backbone("vit-s14-tiny", pretrained=False, init_seed=seed)
    with torch.no_grad():  # random init leaves LayerScale at 1e-5: give every branch weight
        for blk in bb.model.blocks:
            blk.ls1.gamma.fill_(0.5)
            blk.ls2.gamma.fill_(0.5)
    return bb


@pytest.fixture()
def calibration_file(tmp_path):
    path = tmp_path / "calibration" / "b.h5"
    path.parent.mkdir()
    write_calibration(path, _Drawn(), {"seed": 0})
    return path


@pytest.fixture()
def counted(monkeypatch):
    """How often the teacher's fit means and reference rows were really computed."""
    calls = {"centre": 0, "random_init": 0}
    centre, random_init = fidelity.teacher_centre, fidelity.random_init_model

    def count_centre(*args, **kwargs):
        calls["centre"] += 1
        return centre(*args, **kwargs)

    def count_random(*args, **kwargs):
        calls["random_init"] += 1
        return random_init(*args, **kwargs)

    monkeypatch.setattr(fidelity, "teacher_centre", count_centre)
    monkeypatch.setattr(fidelity, "random_init_model", count_random)
    return calls


def _job(teacher, path, n_tiles=None):
    """What one compress job computes from its teacher and calibration set."""
    calib = load_calibration([path], n_tiles=n_tiles, seed=0)
    centre = fidelity.fit_centre(teacher, calib)
    refs = fidelity.references(teacher, calib)
    return centre, refs


def test_a_second_job_reads_what_the_first_computed(calibration_file, counted):
    teacher = _teacher()
    centre1, refs1 = _job(teacher, calibration_file)
    assert counted == {"centre": 1, "random_init": 1}
    cache = calibration_file.with_name("b" + SUFFIX)
    assert sorted(p.name.rsplit("-", 1)[0] for p in cache.iterdir()) == ["centre", "fit-outputs", "references",
                                                                         "report-outputs"]
    centre2, refs2 = _job(_teacher(), calibration_file)  # a new process: same teacher, same file
    assert counted == {"centre": 1, "random_init": 1}  # nothing recomputed
    assert torch.equal(centre1.layers, centre2.layers) and torch.equal(centre1.embedding, centre2.embedding)
    assert centre2.n_tiles == centre1.n_tiles == 24
    assert refs2 == refs1 and refs2["teacher"]["r2"] == pytest.approx(1.0)


def test_other_tiles_or_teacher_miss(calibration_file, counted):
    _job(_teacher(), calibration_file)
    _job(_teacher(seed=6), calibration_file)  # other weights
    _job(_teacher(), calibration_file, n_tiles=20)  # another subset of the file's tiles
    assert counted["centre"] == 3 and counted["random_init"] == 3
    assert len(list(calibration_file.with_name("b" + SUFFIX).glob("centre-*.pt"))) == 3


def test_jobs_of_any_batch_size_share_the_teacher_entries(calibration_file, counted):
    """The teacher's values are computed in the shared passes' batch, whatever the job's own
    (discovery runs in 32, the demo's compress jobs in 8): a compress job reads what
    discovery left, and its reported fidelity scores the teacher's side from them."""
    from pathtwt.compress.teacher_cache import held_out_outputs

    teacher = _teacher()
    _job(teacher, calibration_file)
    calib = load_calibration([calibration_file], n_tiles=None, seed=0)
    other = _teacher()
    for batch_size in (3, 8):
        record = fidelity.measure(other.model, other, calib, on="report", boundaries=[1], batch_size=batch_size)
        assert record["r2"] == pytest.approx(1.0) and record["block_r2"][0] == pytest.approx(1.0)
    assert counted == {"centre": 1, "random_init": 1}
    shared = held_out_outputs(other, calib, "report")
    own = fidelity.block_outputs(other.model, fidelity.tiles_to_batch(other.transform, calib.report, "cpu"))
    assert len(shared) == len(own) == 13 and all(torch.allclose(a, b, atol=1e-5) for a, b in zip(shared, own))


def test_a_damaged_entry_is_recomputed(calibration_file, counted, caplog):
    teacher = _teacher()
    centre1, _ = _job(teacher, calibration_file)
    for entry in calibration_file.with_name("b" + SUFFIX).glob("centre-*.pt"):
        entry.write_bytes(b"not a torch file")
    centre2, _ = _job(_teacher(), calibration_file)
    assert counted["centre"] == 2 and "unreadable" in caplog.text
    assert torch.equal(centre1.layers, centre2.layers)


def test_the_cache_can_be_switched_off(calibration_file, counted, monkeypatch):
    monkeypatch.setenv("PATHTWT_TEACHER_CACHE", "off")
    _job(_teacher(), calibration_file)
    _job(_teacher(), calibration_file)
    assert counted["centre"] == 2
    assert not calibration_file.with_name("b" + SUFFIX).exists()


def test_shared_fit_outputs_give_what_each_consumer_computes_itself(calibration_file):
    """The fit means, the similarity matrix and auditioning read the teacher's layer outputs
    of the fit tiles from one pass; each gets what its own pass in the shared pass's batch
    gives, and within float rounding what a pass in another batch gives."""
    from pathtwt.compress.audition import AuditionOptions, audition
    from pathtwt.compress.similarity import similarity_from_outputs, similarity_matrix
    from pathtwt.compress.teacher_cache import FIT_OUTPUTS_BATCH, fit_layer_outputs, held_out_outputs

    teacher = _teacher()
    calib = load_calibration([calibration_file], n_tiles=None, seed=0)
    outputs = fit_layer_outputs(teacher, calib, n_tiles=128)
    assert len(outputs) == 13 and outputs[0].shape[0] == len(calib.fit) == 24
    b = FIT_OUTPUTS_BATCH
    kw = dict(transform=teacher.transform, num_prefix_tokens=1, batch_size=b)
    own = fidelity.teacher_centre(teacher.model, calib.fit, **kw)
    shared = fidelity.teacher_centre(teacher.model, calib.fit, outputs=outputs, **kw)
    assert torch.equal(own.layers, shared.layers) and torch.equal(own.embedding, shared.embedding)
    other = fidelity.teacher_centre(teacher.model, calib.fit, **{**kw, "batch_size": 5})
    assert torch.allclose(other.layers, shared.layers, rtol=1e-5, atol=1e-6)
    S = similarity_matrix(teacher.model, teacher.transform, calib.fit, num_prefix_tokens=1, batch_size=b)
    assert np.array_equal(similarity_from_outputs(outputs[1:], num_prefix_tokens=1, batch_size=b), S)
    blocks, opts = [[1, 4], [5, 8], [9, 12]], AuditionOptions(steps=2, batch_size=b)
    _, report_own = audition(teacher.model, blocks, calib.fit, calib.select, transform=teacher.transform, options=opts)
    _, report_shared = audition(teacher.model, blocks, calib.fit, calib.select, transform=teacher.transform,
                                options=opts, fit_outputs=outputs)
    assert report_shared == report_own
    # the select tiles' outputs, as auditioning ranks on them (held out: same pass, same batch)
    held = held_out_outputs(teacher, calib, "select", n_tiles=opts.max_select_tiles)
    assert held[0].shape[0] == len(calib.select) == 8
    _, report_held = audition(teacher.model, blocks, calib.fit, calib.select, transform=teacher.transform,
                              options=opts, fit_outputs=outputs, select_outputs=held)
    assert report_held == report_own


def test_the_target_cache_from_the_shared_outputs_holds_the_fp32_targets(calibration_file):
    """With augmentation off, the distillation's teacher targets of the fit tiles come from
    the shared layer outputs (no forward pass): the values of an fp32 pass."""
    from pathtwt.compress.distill import DeepSupervision, TargetCache
    from pathtwt.compress.teacher_cache import fit_layer_outputs

    teacher = _teacher()
    calib = load_calibration([calibration_file], n_tiles=None, seed=0)
    objective = DeepSupervision([4, 8, 12])
    outputs = fit_layer_outputs(teacher, calib, n_tiles=128)
    shared = TargetCache.from_outputs(teacher.model, outputs, objective=objective, n_tiles=len(calib.fit), device="cpu",
                                      chunk=8)
    own = TargetCache.build(teacher.model, calib.fit, transform=teacher.transform, objective=objective, device="cpu",
                            chunk=8, precision="fp32")
    assert [t.shape for t in shared.tensors] == [t.shape for t in own.tensors] and len(own.tensors) == 4
    assert all(torch.allclose(a, b, rtol=1e-5, atol=1e-5) for a, b in zip(shared.tensors, own.tensors))


def test_a_second_job_reads_the_fit_outputs(calibration_file, monkeypatch):
    import pathtwt.compress.teacher_cache as teacher_cache_module
    from pathtwt.compress.teacher_cache import fit_layer_outputs

    first = fit_layer_outputs(_teacher(), load_calibration([calibration_file], n_tiles=None, seed=0), n_tiles=128)
    monkeypatch.setattr("pathtwt.compress.student.block_outputs", lambda *a, **k: pytest.fail("recomputed"))
    second = fit_layer_outputs(_teacher(), load_calibration([calibration_file], n_tiles=None, seed=0), n_tiles=128)
    assert all(torch.equal(a, b) for a, b in zip(first, second))
    monkeypatch.setattr(teacher_cache_module, "FIT_OUTPUTS_LIMIT", 1000)  # too large to keep: the consumers' own passes
    assert fit_layer_outputs(_teacher(), load_calibration([calibration_file], n_tiles=None, seed=0), n_tiles=128) is None


def test_the_loss_normalisation_reads_the_shared_outputs(calibration_file, monkeypatch):
    from pathtwt.compress.distill import DeepSupervision, DistillOptions, normalised_objective
    from pathtwt.compress.teacher_cache import fit_layer_outputs
    from pathtwt.compress.training_tiles import ArrayTiles

    teacher = _teacher()
    calib = load_calibration([calibration_file], n_tiles=None, seed=0)
    opts = DistillOptions(batch_size=8, loss_norm="variance")
    objective = DeepSupervision([4, 8, 12])
    own = normalised_objective(objective, teacher.model, ArrayTiles(calib.fit), teacher.transform, opts)
    outputs = fit_layer_outputs(teacher, calib, n_tiles=128)
    monkeypatch.setattr("pathtwt.compress.distill.term_variances", lambda *a, **k: pytest.fail("forward pass run"))
    shared = normalised_objective(objective, teacher.model, ArrayTiles(calib.fit), teacher.transform, opts, outputs)
    assert shared.term_scales == own.term_scales and len(own.term_scales) == 4


def test_discovery_leaves_the_pass_that_a_compress_job_then_reads(calibration_file, monkeypatch):
    """`pathtwt discover` runs the teacher's one pass over a small fit split through the
    teacher cache, so a compress job of the same teacher and calibration file reads its
    layer outputs from disk instead of running the pass again."""
    from pathtwt.cli import main
    from pathtwt.compress.teacher_cache import fit_layer_outputs

    out = calibration_file.parent.parent / "discovery"
    assert main(["discover", "--backbone", "vit-s14-tiny", "--random-init", "--calibration", str(calibration_file),
                 "--out", str(out), "--depth", "3", "--device", "cpu", "--no-progress"]) == 0
    assert (out / "plan.json").is_file()
    entries = list(calibration_file.with_name("b" + SUFFIX).glob("fit-outputs-*.pt"))
    assert len(entries) == 1
    teacher = create_backbone("vit-s14-tiny", pretrained=False, init_seed=0, precision="fp32")  # as compress builds it
    monkeypatch.setattr("pathtwt.compress.student.block_outputs", lambda *a, **k: pytest.fail("recomputed"))
    outputs = fit_layer_outputs(teacher, load_calibration([calibration_file], n_tiles=None, seed=0), n_tiles=128)
    assert outputs is not None and len(outputs[0]) == 24


def test_discover_leaves_the_reference_rows_for_the_compress_jobs(calibration_file, counted, tmp_path):
    """``pathtwt discover`` (batch 32) measures the reference rows once; a compress job of the
    same teacher and calibration file (batch 8) reads them instead of building the
    random-init network again."""
    from safetensors.torch import save_file

    from pathtwt.cli import main

    weights = tmp_path / "teacher.safetensors"
    save_file(_teacher().model.state_dict(), weights)
    assert main(["discover", "--backbone", "vit-s14-tiny", "--weights", str(weights), "--calibration",
                 str(calibration_file), "--out", str(tmp_path / "discovery"), "--depth", "4", "--batch-size", "32"]) == 0
    assert counted == {"centre": 1, "random_init": 1}
    teacher = create_backbone("vit-s14-tiny", weights=weights, precision="fp32")
    refs = fidelity.references(teacher, load_calibration([calibration_file], n_tiles=None, seed=0))
    assert counted == {"centre": 1, "random_init": 1}  # read, not measured again
    assert refs["teacher"]["r2"] == pytest.approx(1.0) and refs["random_init"]["r2"] < refs["teacher"]["r2"]


def test_tf32_and_full_fp32_teachers_never_share_an_entry(monkeypatch):
    """Targets computed with TF32 on an Ampere-or-later GPU are not those of full fp32 (a
    V100, ROCm, an ieee run, a CPU): the teacher's identity, and so every key, says which."""
    import dataclasses

    from pathtwt.compress.teacher_cache import TeacherCache, teacher_identity
    from pathtwt.models import precision

    teacher = _teacher()
    gpu_teacher = dataclasses.replace(teacher, device="cuda:0")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: (9, 0))
    monkeypatch.setattr(torch.version, "hip", None)
    matmul, cudnn = torch.backends.cuda.matmul, torch.backends.cudnn
    saved = (matmul.allow_tf32, cudnn.allow_tf32)
    try:
        precision._set_fp32_matmul("tf32")
        tf32, on_cpu = teacher_identity(gpu_teacher), teacher_identity(teacher)
        precision._set_fp32_matmul("ieee")
        ieee = teacher_identity(gpu_teacher)
    finally:
        matmul.allow_tf32, cudnn.allow_tf32 = saved
    assert tf32["fp32_matmul"] == {"matmul": "tf32", "conv": "tf32"}
    assert ieee["fp32_matmul"] == on_cpu["fp32_matmul"] == {"matmul": "ieee", "conv": "ieee"}  # a CPU ignores the switch
    keys = {TeacherCache(None, {"teacher": identity}).key("fit-outputs") for identity in (tf32, ieee)}
    assert len(keys) == 2
