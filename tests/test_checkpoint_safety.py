"""Checkpoints are read with ``torch.load(weights_only=True)``: a ``resume.pt`` or a
weights file holding a pickle that would run code is refused with one line naming it,
and the code never runs."""

from __future__ import annotations

import os

import pytest
import torch

from pathtwt.errors import PathtwtError
from pathtwt.io.torch_files import load_torch_file


class _RunsCode:
    """Unpickling this calls os.system: what a planted checkpoint would do."""

    def __init__(self, marker):
        self.marker = str(marker)

    def __reduce__(self):
        return os.system, (f"touch {self.marker}",)


def _malicious(path, marker):
    torch.save({"epoch": 1, "model": {"w": torch.zeros(2)}, "payload": _RunsCode(marker)}, path)
    return path


def test_load_torch_file_refuses_a_pickle_that_runs_code(tmp_path):
    marker = tmp_path / "ran"
    path = _malicious(tmp_path / "state.pt", marker)
    with pytest.raises(PathtwtError) as info:
        load_torch_file(path, remedy="delete it")
    message = str(info.value)
    assert str(path) in message and "refused" in message and message.endswith("delete it") and "\n" not in message
    assert not marker.exists()
    plain = tmp_path / "plain.pt"
    torch.save({"epoch": 3, "history": [{"loss": 0.5, "qwk": None}], "w": torch.ones(2)}, plain)
    assert load_torch_file(plain, remedy="x")["epoch"] == 3
    truncated = tmp_path / "cut.pt"
    truncated.write_bytes(plain.read_bytes()[:100])
    with pytest.raises(PathtwtError, match="cut.pt: cannot read it"):
        load_torch_file(truncated, remedy="delete it")


def test_train_mil_refuses_a_planted_resume_file(tmp_path, capsys):
    from pathtwt.cli import main
    from planted_cohorts import write_planted_cohort

    cohort = write_planted_cohort(tmp_path / "c", task="metastasis", splits={"train": 8, "val": 4, "test": 4},
                                  n_classes=2, dim=8, strength=6.0, bag_size=(5, 10))
    out = tmp_path / "run"
    out.mkdir()
    marker = tmp_path / "ran"
    _malicious(out / "resume.pt", marker)
    code = main(["train-mil", "--features", str(cohort.features_dir), "--labels", str(cohort.labels_csv),
                 "--protocol", "metastasis", "--aggregator", "abmil", "--epochs", "1", "--out", str(out), "--no-progress"])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 1 and len(err) == 1, err
    assert "resume.pt: refused" in err[0] and "--no-resume" in err[0]
    assert not marker.exists() and not (out / "metrics.json").exists()


def test_weights_file_with_a_code_pickle_is_refused(tmp_path):
    from pathtwt.errors import WeightsError
    from pathtwt.models.weights import load_state_dict_file

    marker = tmp_path / "ran"
    path = _malicious(tmp_path / "weights.pt", marker)
    with pytest.raises(WeightsError) as info:
        load_state_dict_file(path)
    assert "weights.pt" in str(info.value) and "\n" not in str(info.value) and not marker.exists()


def test_the_cuda_generators_state_is_checkpointed_and_restored(tmp_path, monkeypatch):
    """A run on a GPU keeps its rank's CUDA generator state with the other RNG states and
    gets it back on resume (mocked torch.cuda: the states are plain byte tensors); a CPU
    run, which never initialised CUDA, keeps none and touches no GPU."""
    from torch import nn

    from pathtwt.compress import distill

    student = nn.Linear(2, 2)
    optimizer = torch.optim.AdamW(student.parameters())
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda s: 1.0)
    common = dict(student=student, optimizer=optimizer, scheduler=scheduler, step=3, fingerprint={}, history=[],
                  sampler={"position": 12})
    assert distill._cuda_rng_states() is None  # CPU: CUDA never initialised here
    distill.save_checkpoint(tmp_path / "cpu.pt", **common, cuda_rng=distill._cuda_rng_states())
    assert "cuda" not in distill.load_checkpoint(tmp_path / "cpu.pt")["rng"]

    state = torch.arange(16, dtype=torch.uint8)
    restored = []
    monkeypatch.setattr(torch.cuda, "is_initialized", lambda: True)
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 1)
    monkeypatch.setattr(torch.cuda, "get_rng_state", lambda device: state.clone() if device == 1 else None)
    monkeypatch.setattr(torch.cuda, "set_rng_state", lambda s, device: restored.append((s, device)))
    distill.save_checkpoint(tmp_path / "gpu.pt", **common, cuda_rng=distill._cuda_rng_states())
    saved = distill.load_checkpoint(tmp_path / "gpu.pt")["rng"]  # weights_only: plain tensors
    assert len(saved["cuda"]) == 1 and torch.equal(saved["cuda"][0], state)
    distill._set_rng_state(saved)
    assert len(restored) == 1 and torch.equal(restored[0][0], state) and restored[0][1] == 1
