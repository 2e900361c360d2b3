"""Centred fidelity tells a useful student from a useless one, and nothing that chooses
reads the report split.

- the metrics on their reference points: the teacher scores 1, the constant teacher fit
  mean scores R^2 ~0, CKA 0 and centred cosine 0 (while its uncentred cosine is high);
  CKA is invariant to rotation and scale;
- on real tiles and the real ViT-S, a student fitted to the teacher beats a random-init one;
- poisoning the report tiles leaves the subset search's and NOSE's choices unchanged,
  while poisoning the select tiles changes their scores (so the check can fail).
"""

from __future__ import annotations

import copy

import numpy as np
import pytest

from pathtwt.compress.calibration import CalibrationSet
from pathtwt.compress.fidelity import (constant_fidelity, linear_cka, measure, random_init_model,
                                       references, teacher_centre)
from pathtwt.compress.pipeline import CompressOptions
from pathtwt.models.registry import create_backbone
from tiny_teacher import tiny_teacher


def _tiles(n: int, seed: int) -> np.ndarray:
    """Smooth random colour fields (so the tiny ViT's embeddings vary like real ones)."""
    rng = np.random.default_rng(seed)
    base = rng.integers(40, 220, size=(n, 1, 1, 3))
    noise = rng.normal(0, 25, size=(n, 56, 56, 3))
    return np.clip(base + noise, 0, 255).astype(np.uint8)


@pytest.fixture(scope="module")
def teacher():
    return tiny_teacher(5)


def _calib(report: np.ndarray | None = None, select: np.ndarray | None = None) -> CalibrationSet:
    return CalibrationSet(fit=_tiles(48, 1), select=_tiles(8, 2) if select is None else select,
                          report=_tiles(24, 3) if report is None else report, patch_size=56, seed=0)


def test_teacher_scores_one_and_the_constant_fit_mean_zero(teacher):
    calib = _calib()
    refs = references(teacher, calib)
    t, c, r = refs["teacher"], refs["constant"], refs["random_init"]
    assert t["r2"] == pytest.approx(1.0, abs=1e-9) and t["cka"] == pytest.approx(1.0, abs=1e-9)
    assert t["centred_cosine"] == pytest.approx(1.0, abs=1e-6) and t["block_r2"] == pytest.approx([1.0] * 12, abs=1e-9)
    # the constant: mean from the fit tiles, scored on disjoint report tiles
    assert abs(c["r2"]) < 0.02 and c["cka"] == 0.0 and c["centred_cosine"] == 0.0
    assert all(abs(v) < 0.02 for v in c["block_r2"])
    assert r["r2"] < 0 and r["n_tiles"] == 24
    # even the best constant, the report tiles' own mean (which no student could know),
    # gains almost nothing over the fit mean: no constant scores well
    fit_mean = teacher_centre(teacher.model, calib.fit, transform=teacher.transform, num_prefix_tokens=1)
    own = teacher_centre(teacher.model, calib.report, transform=teacher.transform, num_prefix_tokens=1)
    best = constant_fidelity(teacher.model, calib.report, centre=fit_mean, constant=own, transform=teacher.transform,
                             num_prefix_tokens=1)
    assert 0.0 < best["r2"] < 0.1 and best["cka"] == 0.0


def test_r2_falls_with_the_error_and_cka_ignores_rotation_and_scale():
    rng = np.random.default_rng(0)
    x = rng.normal(size=(50, 12))
    q, _ = np.linalg.qr(rng.normal(size=(12, 12)))
    assert linear_cka(3.0 * x @ q, x) == pytest.approx(1.0)
    assert linear_cka(rng.normal(size=(50, 12)), x) < 0.5
    assert linear_cka(np.ones((50, 12)), x) == 0.0


def test_a_worse_student_scores_lower(teacher):
    """R^2 orders students by how far they are: the teacher with its last layer removed is
    closer than a random-init network, which is below the constant's 0."""
    calib = _calib()
    cut = copy.deepcopy(teacher.model)
    cut.blocks = cut.blocks[:-1]
    near = measure(cut, teacher, calib, boundaries=list(range(1, 12)))
    far = measure(random_init_model(teacher.spec, seed=1), teacher, calib)
    assert 1.0 > near["r2"] > 0 > far["r2"]
    assert near["block_r2"][:11] == pytest.approx([1.0] * 11, abs=1e-9)  # layers 1..11 are the teacher's own


def test_fitted_student_beats_random_init_on_real_tiles(shared_tiles, vit_s_weights):
    """Real ViT-S, real H&E crops: the teacher with layers 7-12 replaced by one closed-form
    linear map fitted to the teacher beats a random-init ViT-S by a wide margin."""
    from pathtwt.compress.calibration import load_calibration
    from pathtwt.compress.methods.linear import build_linear_student, fit_linear_maps

    teacher = create_backbone("vit-s14-imgfocus", weights=vit_s_weights)
    calib = load_calibration([shared_tiles / "he-images"], n_tiles=32, seed=0, holdout=0.5, resize_to=224)
    blocks = [(i, i) for i in range(1, 7)] + [(7, 12)]
    (w_b,) = fit_linear_maps(teacher.model, teacher.transform, calib.fit, [(7, 12)], ridge=1e-3, batch_size=8)
    student, _ = build_linear_student(teacher, blocks, [None] * 6 + [w_b])
    fitted = measure(student, teacher, calib, batch_size=8)
    floor = measure(random_init_model(teacher.spec), teacher, calib, batch_size=8)
    assert fitted["r2"] > floor["r2"] + 0.3 and fitted["cka"] > floor["cka"]
    assert fitted["r2"] > 0  # better than the constant fit mean


# ---------------------------------------------------------------------------- the report split is never read to choose


def _options(tmp_path, depth: int, **extra) -> CompressOptions:
    return CompressOptions.from_flat(out=tmp_path, depth=depth, steps=2, batch_size=4, augment=False, progress=False, extra=extra)


def test_subset_search_and_nose_never_read_the_report_split(teacher, tmp_path):
    import dataclasses

    from pathtwt.compress.methods.nose import greedy_attention_removal
    from pathtwt.compress.methods.subset import distillation_scorer, run_search, search_settings

    short = copy.deepcopy(teacher.model)  # 6 layers keep the searches small
    short.blocks = short.blocks[:6]
    teacher = dataclasses.replace(teacher, model=short)
    clean = _calib()
    poisoned = _calib(report=np.random.default_rng(9).integers(0, 256, size=(24, 56, 56, 3), dtype=np.uint8))
    cut = copy.deepcopy(short)
    cut.blocks = cut.blocks[:4]
    assert measure(cut, teacher, poisoned)["r2"] != pytest.approx(measure(cut, teacher, clean)["r2"])  # reports see it

    def search(calib, name):
        opts = _options(tmp_path / name, 3, search_budget=9, search_steps=1, random_control=True)
        return run_search(teacher, calib, opts, search_settings(teacher, calib, opts, 2))

    a, b = search(clean, "clean"), search(poisoned, "poisoned")
    assert a["local"] == b["local"] and a["random"] == b["random"]
    assert a["settings"]["score"] == "embedding R^2 on the select split"

    opts = _options(tmp_path / "nose", 3)
    nose_clean = greedy_attention_removal(teacher, clean, opts, 3)  # (layers, split, trace)
    assert nose_clean == greedy_attention_removal(teacher, poisoned, opts, 3) and nose_clean[1] == "select"

    # the same checks can fail: poisoning the SELECT tiles changes the scores
    noisy_select = _calib(select=np.random.default_rng(9).integers(0, 256, size=(8, 56, 56, 3), dtype=np.uint8))
    assert greedy_attention_removal(teacher, noisy_select, opts, 3)[2] != nose_clean[2]
    best = tuple(i - 1 for i in a["local"]["best_layers"])
    rescored = distillation_scorer(teacher, noisy_select, _options(tmp_path / "x", 3), steps=1)(best)
    assert rescored != pytest.approx(a["local"]["best_score"])
