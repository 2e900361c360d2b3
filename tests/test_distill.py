"""Distillation loop (exact resumption) and the tiny end-to-end run
discover -> compress (TWT and truncation) -> load with timm alone -> extract."""

from __future__ import annotations

import json
import os
import signal

import h5py
import numpy as np
import pytest
import torch

from pathtwt.models.registry import create_backbone
from pathtwt.cli import main
from pathtwt.compress.distill import DeepSupervision, DistillOptions, distill
from pathtwt.compress.training_tiles import EpochOrder
from pathtwt.compress.schedule import default_alphas
from pathtwt.compress.student import add_branch_scales, clone_layers, stitch_student

STEPS = 4


@pytest.fixture(scope="module")
def teacher():
    bb = create_backbone("vit-s14-tiny", pretrained=False, init_seed=5)
    with torch.no_grad():
        for blk in bb.model.blocks:
            blk.ls1.gamma.fill_(0.5)
            blk.ls2.gamma.fill_(0.5)
    return bb


@pytest.fixture(scope="module")
def tiles():
    return np.random.default_rng(0).integers(0, 256, size=(10, 56, 56, 3), dtype=np.uint8)


class _Crash(DeepSupervision):
    """At a given step (once): raise, like a job killed without a chance to save, or send
    this process SIGTERM, like SLURM before a kill."""

    def __init__(self, *args, crash_at: int, sigterm: bool = False, **kwargs):
        super().__init__(*args, **kwargs)
        self.crash_at, self.sigterm = crash_at, sigterm

    def loss(self, student, x, targets, step):
        if step == self.crash_at:
            self.crash_at = -1
            if not self.sigterm:
                raise RuntimeError("killed")
            os.kill(os.getpid(), signal.SIGTERM)
        return super().loss(student, x, targets, step)


def _student(teacher):
    student = stitch_student(teacher.model, clone_layers(teacher.model, [0, 5, 11]), spec=teacher.spec)
    return add_branch_scales(student)


def _distill(teacher, tiles, *, objective=None, **kw):
    student = _student(teacher)
    # the plain loss: _Crash wraps the objective, and loss normalisation would replace it
    # with a rescaled DeepSupervision (test_variance_loss_norm_* test that one)
    opts = DistillOptions(**{"steps": STEPS, "batch_size": 4, "seed": 3, "progress": False, "checkpoint_every": 2,
                             "loss_norm": "none", **kw})
    objective = objective or DeepSupervision([1, 6, 12], default_alphas(4, STEPS))
    result = distill(student, teacher.model, tiles, transform=teacher.transform, objective=objective, options=opts)
    return student, result


@pytest.fixture(scope="module")
def reference(teacher, tiles):
    """Uninterrupted runs, by augmentation setting, computed once per module."""
    runs: dict[bool, tuple] = {}

    def get(augment: bool):
        if augment not in runs:
            runs[augment] = _distill(teacher, tiles, augment=augment)
        return runs[augment]

    return get


@pytest.mark.parametrize("augment", [True, False], ids=["augmented", "cached-targets"])
def test_resume_after_interruption_equals_uninterrupted(teacher, tiles, tmp_path, augment, reference):
    ref, ref_result = reference(augment)
    assert ref_result.completed and ref_result.steps_done == STEPS
    # the ramp starts every term at weight 0, then they switch on
    assert ref_result.history[0]["loss"] == 0.0 < ref_result.history[-1]["loss"] < float("inf")

    ckpt = tmp_path / "ckpt.pt"
    # stopped on purpose after step 3 (saved on exit), then resumed
    _, first = _distill(teacher, tiles, augment=augment, checkpoint=ckpt, stop_after=1)
    assert not first.completed and first.steps_done == 1 and ckpt.exists()
    resumed, second = _distill(teacher, tiles, augment=augment, checkpoint=ckpt)
    assert second.resumed_from == 1 and second.completed
    for (k, a), (_, b) in zip(ref.state_dict().items(), resumed.state_dict().items()):
        assert torch.equal(a, b), k
    assert [h["loss"] for h in second.history] == [h["loss"] for h in ref_result.history]


def test_resume_after_a_kill_continues_from_the_last_checkpoint(teacher, tiles, tmp_path, reference):
    ref, _ = reference(False)
    ckpt = tmp_path / "ckpt.pt"
    objective = _Crash([1, 6, 12], default_alphas(4, STEPS), crash_at=3)
    with pytest.raises(RuntimeError, match="killed"):
        _distill(teacher, tiles, augment=False, checkpoint=ckpt, objective=objective)
    resumed, result = _distill(teacher, tiles, augment=False, checkpoint=ckpt, objective=objective)
    assert result.resumed_from == 2  # the last periodic checkpoint before the crash
    for a, b in zip(ref.state_dict().values(), resumed.state_dict().values()):
        assert torch.equal(a, b)


def test_sigterm_stops_at_the_end_of_the_step_and_resumes_exactly(teacher, tiles, tmp_path, reference):
    ref, _ = reference(False)
    ckpt = tmp_path / "ckpt.pt"
    objective = _Crash([1, 6, 12], default_alphas(4, STEPS), crash_at=2, sigterm=True)
    with pytest.raises(KeyboardInterrupt, match="after step 3"):
        _distill(teacher, tiles, augment=False, checkpoint=ckpt, objective=objective, checkpoint_every=0)
    resumed, result = _distill(teacher, tiles, augment=False, checkpoint=ckpt, objective=objective)
    assert result.resumed_from == 3
    for a, b in zip(ref.state_dict().values(), resumed.state_dict().values()):
        assert torch.equal(a, b)


def test_batches_are_a_pure_function_of_seed_and_position():
    a = EpochOrder(10, seed=1).tiles(0, 25).tolist()
    assert a == EpochOrder(10, seed=1).tiles(0, 25).tolist()
    assert a != EpochOrder(10, seed=2).tiles(0, 25).tolist()
    assert sorted(a[:10]) == sorted(a[10:20]) == list(range(10))  # each epoch draws every tile once
    assert a[:10] != a[10:20]  # reshuffled every epoch
    assert EpochOrder(10, seed=1).tiles(13, 5).tolist() == a[13:18]  # resumable mid-epoch


def _teacher_weights(teacher, path):
    from safetensors.torch import save_file

    save_file({k: v.contiguous() for k, v in teacher.model.state_dict().items()}, str(path))
    return path


def _coords_file(slides, path):
    from pathtwt.io.h5 import write_coords

    xy = np.array([[600 + 112 * i, 900 + 112 * j] for i in range(3) for j in range(2)])
    attrs = dict(patch_size=56, patch_size_level0=112, target_mpp=1.0, level0_mpp=0.499, read_level=0,
                 level0_width=2220, level0_height=2967, target_magnification=10.0, status="ok",
                 slide_path=str(slides / "CMU-1-Small-Region.svs"))
    write_coords(path, xy, np.ones(len(xy)), attrs)
    return path


def test_tiny_end_to_end_discover_compress_extract(teacher, shared_tiles, shared_slides, tmp_path, capsys):
    import timm
    from safetensors.torch import load_file

    weights = _teacher_weights(teacher, tmp_path / "teacher.safetensors")
    common = ["--backbone", "vit-s14-tiny", "--weights", str(weights), "--calibration", str(shared_tiles),
              "--n-tiles", "24", "--batch-size", "8", "--device", "cpu"]
    assert main(["discover", *common, "--depth", "4", "--out", str(tmp_path / "plan")]) == 0
    plan = json.loads((tmp_path / "plan" / "plan.json").read_text())
    assert len(plan["blocks"]) == 4

    twt = tmp_path / "models" / "twt-4"
    assert main(["compress", *common, "--method", "twt", "--plan", str(tmp_path / "plan" / "plan.json"),
                 "--steps", "4", "--audition-steps", "2", "--no-progress", "--out", str(twt)]) == 0
    meta = json.loads((twt / "model.json").read_text())
    assert meta["name"] == "vit-s14-tiny/twt-4" and meta["timm_kwargs"]["depth"] == 4 and meta["method"] == "twt"
    assert meta["plan"]["blocks"] == plan["blocks"] and len(meta["audition"]) == 4
    assert meta["teacher_weights_sha256"] and meta["layer_patches"] == {}
    assert not (twt / "checkpoint.pt").exists()
    fid = meta["fidelity"]
    assert fid["on"] == "report" and set(fid["final"]) == {"r2", "centred_cosine", "cka", "cosine", "block_r2",
                                                            "block_layers", "n_tiles"}
    assert fid["final"]["r2"] > fid["references"]["random_init"]["r2"] and len(fid["final"]["block_r2"]) == 4
    # each block's R² is labelled with the teacher layer it was matched to: the end of its plan block
    assert fid["final"]["block_layers"] == [e for _, e in plan["blocks"]]
    assert fid["references"]["teacher"]["block_layers"] == list(range(1, 13))
    assert fid["references"]["teacher"]["r2"] == pytest.approx(1.0)
    assert sum(fid["splits"][k] for k in ("fit", "select", "report")) == 24 and fid["splits"]["seed"] == 0
    # ViT-S-tiny is a natural-image backbone: schedule and branch scalars default on
    assert meta["schedule"]["enabled"] and meta["branch_scalars"]

    # timm alone, strict
    plain = timm.create_model(meta["timm_name"], pretrained=False, **meta["timm_kwargs"])
    plain.load_state_dict(load_file(str(twt / "model.safetensors")), strict=True)
    assert len(plain.blocks) == 4
    variant = create_backbone(str(twt))
    x = torch.stack([variant.transform(t) for t in np.zeros((2, 56, 56, 3), np.uint8) + 180])
    with torch.no_grad():
        assert torch.equal(plain.eval().forward_features(x), variant.model.forward_features(x))
    teacher_params = sum(p.numel() for p in teacher.model.parameters())
    assert meta["params"] < 0.5 * teacher_params

    trunc = tmp_path / "models" / "truncation-4"
    assert main(["compress", *common, "--method", "truncation", "--depth", "4", "--steps", "4",
                 "--no-progress", "--out", str(trunc)]) == 0
    tmeta = json.loads((trunc / "model.json").read_text())
    assert tmeta["kept_layers"] == [1, 2, 3, 4] and tmeta["params"] == meta["params"]

    coords = _coords_file(shared_slides, tmp_path / "coords" / "CMU-1-Small-Region.h5")
    feats = tmp_path / "features" / "CMU-1-Small-Region.h5"
    assert main(["extract", str(shared_slides / "CMU-1-Small-Region.svs"), "--coords", str(coords), "--out", str(feats),
                 "--backbone", str(twt), "--device", "cpu", "--workers", "0", "--no-progress"]) == 0
    with h5py.File(feats, "r") as h5:
        assert h5["features"].shape == (6, 128) and np.isfinite(h5["features"][...]).all()


def test_compress_rejects_unknown_method(shared_tiles, capsys):
    code = main(["compress", "--method", "distilbert", "--backbone", "vit-s14-tiny", "--random-init",
                 "--calibration", str(shared_tiles), "--depth", "4", "--out", "unused"])
    assert code == 1
    assert "known methods:" in capsys.readouterr().err


class _Rescaled(torch.nn.Module):
    """A block whose input is divided by ``pre`` and whose output is multiplied by
    ``post``: rescales one layer's activations while leaving every other layer unchanged."""

    def __init__(self, block, *, pre=1.0, post=1.0):
        super().__init__()
        self.block, self.pre, self.post = block, pre, post

    def forward(self, x):
        return self.block(x / self.pre) * self.post


def _rescale_layer(model, index, factor):
    import copy

    model = copy.deepcopy(model)
    blocks = list(model.blocks)
    blocks[index] = _Rescaled(blocks[index], post=factor)
    if index + 1 < len(blocks):
        blocks[index + 1] = _Rescaled(blocks[index + 1], pre=factor)
    model.blocks = torch.nn.Sequential(*blocks)
    return model


def _terms(objective, teacher_model, student, tiles, transform, loss_norm):
    from pathtwt.compress.distill import normalised_objective
    from pathtwt.compress.intermediates import tiles_to_batch
    from pathtwt.compress.training_tiles import ArrayTiles

    opts = DistillOptions(loss_norm=loss_norm, batch_size=4)  # 10 tiles measured in chunks of 4
    objective = normalised_objective(objective, teacher_model, ArrayTiles(tiles), transform, opts)
    x = tiles_to_batch(transform, tiles, "cpu")
    with torch.no_grad():
        loss, terms = objective.loss(student, x, objective.targets(teacher_model, x), step=0)
    return loss, {k: float(v) for k, v in terms.items()}  # logged terms are tensors, read once a step


def test_variance_loss_norm_keeps_a_30x_layer_from_drowning_the_others(teacher, tiles):
    student = _student(teacher)  # blocks matched to teacher layers 1, 6, 12
    objective = DeepSupervision([1, 6, 12])
    # teacher layer 6 and the student block matched to it, both 30x larger (layers after
    # them see the same inputs as before), as natural-image ViTs' norms grow with depth
    big_teacher, big_student = _rescale_layer(teacher.model, 5, 30.0), _rescale_layer(student, 1, 30.0)
    _, plain = _terms(objective, teacher.model, student, tiles, teacher.transform, "none")
    _, plain_big = _terms(objective, big_teacher, big_student, tiles, teacher.transform, "none")
    assert plain_big["b2"] == pytest.approx(900 * plain["b2"], rel=1e-3)  # unnormalised: the term is 900x
    assert plain_big["b1"] == pytest.approx(plain["b1"], rel=1e-4)
    loss, norm = _terms(objective, teacher.model, student, tiles, teacher.transform, "variance")
    loss_big, norm_big = _terms(objective, big_teacher, big_student, tiles, teacher.transform, "variance")
    for k in ("b1", "b2", "b3", "final"):
        assert norm_big[k] == pytest.approx(norm[k], rel=1e-3), k
    assert float(loss_big) == pytest.approx(float(loss), rel=1e-3)
    # each normalised term is the plain MSE over the teacher target's per-position variance
    from pathtwt.compress.intermediates import tiles_to_batch

    with torch.no_grad():
        targets = objective.targets(teacher.model, tiles_to_batch(teacher.transform, tiles, "cpu"))
    for k, t in zip(("b1", "b2", "b3", "final"), targets):
        var = float((t.double() - t.double().mean(0, keepdim=True)).pow(2).mean())
        assert norm[k] == pytest.approx(plain[k] / var, rel=1e-4), k


def test_loss_norm_none_is_the_plain_mse_sum(teacher, tiles):
    from pathtwt.compress.intermediates import tiles_to_batch
    from pathtwt.compress.student import block_outputs

    student = _student(teacher)
    objective = DeepSupervision([1, 6, 12])
    loss, terms = _terms(objective, teacher.model, student, tiles, teacher.transform, "none")
    x = tiles_to_batch(teacher.transform, tiles, "cpu")
    with torch.no_grad():
        t_out, s_out = block_outputs(teacher.model, x), block_outputs(student, x)
        by_hand = [torch.nn.functional.mse_loss(s_out[j + 1], t_out[e]) for j, e in enumerate([1, 6, 12])]
        by_hand.append(torch.nn.functional.mse_loss(student.norm(s_out[-1]), teacher.model.norm(t_out[-1])))
    assert float(loss) == pytest.approx(float(sum(by_hand)), rel=1e-6)
    assert [terms[k] for k in ("b1", "b2", "b3", "final")] == pytest.approx([float(v) for v in by_hand], rel=1e-6)


def test_variance_loss_norm_resumes_exactly_and_refuses_unknown_norms(teacher, tiles, tmp_path):
    from pathtwt.errors import PathtwtError

    objective = DeepSupervision([1, 6, 12])
    ref, ref_result = _distill(teacher, tiles, augment=False, objective=objective, loss_norm="variance")
    # normalised terms read as 1 - R^2 of a student copied from teacher layers: O(1), not
    # O(norm^2) (b1 is 0: student block 1 is teacher layer 1)
    first = ref_result.history[0]
    assert first["b1"] == 0.0 and all(0 < first[k] < 10 for k in ("b2", "b3", "final"))
    ckpt = tmp_path / "ckpt.pt"
    _distill(teacher, tiles, augment=False, objective=objective, loss_norm="variance", checkpoint=ckpt, stop_after=1)
    with pytest.raises(PathtwtError, match="checkpoint of a different run"):  # the norm is part of the run
        _distill(teacher, tiles, augment=False, objective=objective, checkpoint=ckpt)
    resumed, _ = _distill(teacher, tiles, augment=False, objective=objective, loss_norm="variance", checkpoint=ckpt)
    for a, b in zip(ref.state_dict().values(), resumed.state_dict().values()):
        assert torch.equal(a, b)
    with pytest.raises(PathtwtError, match="--loss-norm 'l1'"):
        _distill(teacher, tiles, augment=False, objective=objective, loss_norm="l1")
