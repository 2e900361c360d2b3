"""DistributedDataParallel looks for unused parameters (a graph walk, an extra reduction
and a device-to-host copy every step) only where the run leaves some. Every method runs on
the tiny teacher with each distillation it starts recorded; for each, one real step at its
first and at its last step number tells which trainable parameters got no gradient, and
that must be what the loop tells DDP (:func:`pathtwt.compress.distill.finds_unused_parameters`):
every parameter trained where it says none is left, some left where it says so."""

from __future__ import annotations

import copy

import pytest
import torch

from pathtwt.compress import distill as distill_module
from pathtwt.compress.intermediates import tiles_to_batch
from pathtwt.compress.pipeline import CompressOptions
from pathtwt.compress.registry import METHODS, get_method
from tiny_teacher import tiny_calibration, tiny_teacher

# what each method is run with here: its smallest real run
SETTINGS = {
    "twt": {"depth": 2}, "truncation": {"depth": 3}, "wdpruning": {"depth": 3, "extra": {"probe_hidden": 8}},
    "raptor": {"depth": 2}, "nose": {}, "linear": {"depth": 2},
    # the search's candidates are distilled (one step each) as the chosen subset is
    "subset": {"depth": 3, "extra": {"search_budget": 13, "search_steps": 1}},
}


@pytest.fixture(scope="module")
def teacher():
    return tiny_teacher(3)


@pytest.fixture(scope="module")
def calib():
    return tiny_calibration()


def _untrained(student, teacher, objective, tiles, step: int) -> list[str]:
    """Trainable parameters of ``student`` that one step of ``objective`` leaves without a gradient."""
    student, objective = copy.deepcopy((student, objective))  # the objective may hold the student's blocks
    x = tiles_to_batch(teacher.transform, tiles[:4], "cpu")
    with torch.no_grad():
        targets = objective.targets(teacher.model, x)
    loss, _ = objective.loss(student.train(), x, targets, step)
    loss.backward()
    return [n for n, p in student.named_parameters() if p.requires_grad and p.grad is None]


def test_every_method_is_covered():
    assert set(SETTINGS) == set(METHODS)


@pytest.mark.parametrize("case", sorted(SETTINGS))
def test_ddp_looks_for_unused_parameters_exactly_where_a_method_leaves_some(case, teacher, calib, tmp_path, monkeypatch):
    real = distill_module.distill
    seen = []

    def recording(student, teacher_model, tiles, *, objective, options, **kw):
        kind = str(kw.get("description")).split(" (")[0]  # the subset search's candidates are one kind
        if kind not in {k for k, _, _ in seen}:
            steps = options.resolved_steps(len(tiles))
            unused = sorted({n for step in (0, steps - 1) for n in _untrained(student, teacher, objective, tiles, step)})
            seen.append((kind, distill_module.finds_unused_parameters(objective), unused))
        return real(student, teacher_model, tiles, objective=objective, options=options, **kw)

    monkeypatch.setattr(distill_module, "distill", recording)
    options = CompressOptions.from_flat(out=tmp_path, steps=3, batch_size=4, progress=False, augment=False,
                                        audition_steps=0, **SETTINGS[case])
    get_method(case)(teacher, calib, options)
    if METHODS[case].closed_form:
        assert seen == []
        return
    assert seen
    for description, flag, unused in seen:
        assert flag == bool(unused), (description, flag, unused)
    if case == "raptor":  # stage 1 trains the blocks alone, stage 2 everything
        assert [flag for _, flag, _ in seen] == [True, False]
        assert {"patch_embed.proj.weight", "norm.weight", "cls_token"} <= set(seen[0][2])
    if case == "subset":  # the candidates and the chosen subset
        assert [kind for kind, _, _ in seen] == ["subset", "subset-3"]
    if case == "nose":  # once diluted, the attention-free layers' attention is skipped
        assert any(n.endswith("attn.qkv.weight") for n in seen[0][2])
