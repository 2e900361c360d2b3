"""Layer outputs via forward_intermediates, the streamed similarity matrix, and
`pathtwt discover` end to end on a tiny backbone with real H&E tiles."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from pathtwt.models.registry import create_backbone
from pathtwt.cli import main
from pathtwt.compress.intermediates import block_input, layer_outputs, tiles_to_batch
from pathtwt.compress.partition import partition_exact_k, partition_min_blocks
from pathtwt.compress.similarity import similarity_matrix


@pytest.fixture(scope="module")
def tiny():
    """vit-s14-tiny with random weights and LayerScale raised to 1, so layers differ visibly."""
    backbone = create_backbone("vit-s14-tiny", pretrained=False)
    with torch.no_grad():
        for blk in backbone.model.blocks:
            for ls in (blk.ls1, blk.ls2):
                if hasattr(ls, "gamma"):
                    ls.gamma.fill_(1.0)
    return backbone


@pytest.fixture(scope="module")
def tiles():
    rng = np.random.default_rng(0)
    return rng.integers(0, 255, (10, 56, 56, 3), dtype=np.uint8)


def test_layer_outputs_match_running_the_blocks(tiny, tiles):
    x = tiles_to_batch(tiny.transform, tiles[:3], torch.device("cpu"))
    with torch.no_grad():
        outs = layer_outputs(tiny.model, x)
        h = block_input(tiny.model, x)
        assert len(outs) == len(tiny.model.blocks)
        for blk, out in zip(tiny.model.blocks, outs):
            h = blk(h)
            assert out.shape == h.shape  # prefix tokens kept, in front
            torch.testing.assert_close(out, h)
        # no final norm on the last output
        torch.testing.assert_close(tiny.model.norm(outs[-1]), tiny.model.forward_features(x))


@pytest.mark.parametrize("tokens", ["all", "cls", "patch-mean"])
def test_streamed_similarity_equals_direct_computation(tiny, tiles, tokens):
    npt = tiny.spec.num_prefix_tokens
    S = similarity_matrix(tiny.model, tiny.transform, tiles, num_prefix_tokens=npt, tokens=tokens, batch_size=3)
    with torch.no_grad():
        outs = layer_outputs(tiny.model, tiles_to_batch(tiny.transform, tiles, torch.device("cpu")))
    pick = {"all": lambda h: h, "cls": lambda h: h[:, :1], "patch-mean": lambda h: h[:, npt:].mean(1, keepdim=True)}
    L = len(outs)
    direct = np.zeros((L, L))
    for a in range(L):
        for b in range(L):
            cos = torch.nn.functional.cosine_similarity(pick[tokens](outs[a]), pick[tokens](outs[b]), dim=-1)
            direct[a, b] = 1.0 - cos.mean(1).mean(0).item()  # per tile: mean over tokens; then over tiles
    np.fill_diagonal(direct, 0.0)
    np.testing.assert_allclose(S, direct, atol=1e-5)
    assert np.allclose(S, S.T) and np.all(np.diag(S) == 0)
    assert S[0, L - 1] > S[0, 1] > 0.0  # far layers differ more than neighbours here


def test_discover_cli_end_to_end(tmp_path, shared_tiles, monkeypatch):
    from pathtwt.compress import discovery

    real, calls = discovery.discover, []  # the discovery compress runs too (tests/test_pipeline.py)
    monkeypatch.setattr(discovery, "discover", lambda *a, **k: calls.append(k) or real(*a, **k))
    out = tmp_path / "disc"
    args = ["discover", "--backbone", "vit-s14-tiny", "--random-init", "--calibration",
            str(shared_tiles / "nct-crc-he"), str(shared_tiles / "he-images"), "--n-tiles", "12",
            "--batch-size", "4", "--device", "cpu", "--out", str(out)]
    assert main(args + ["--depth", "4", "--tokens", "patch-mean"]) == 0
    S = np.load(out / "similarity.npy")
    plan = json.loads((out / "plan.json").read_text())
    assert S.shape == (12, 12) and plan["num_layers"] == 12 and plan["tokens"] == "patch-mean"
    assert plan["n_tiles"] == 10  # 12 drawn, 10 % held out, at least one select and one report tile
    assert plan["backbone"] == "vit-s14-tiny" and plan["depth"] == 4 and plan["eps"] is None
    assert len(calls) == 1 and calls[0]["depth"] == 4 and calls[0]["tokens"] == "patch-mean"
    assert plan["blocks"] == [list(b) for b in partition_exact_k(S, 4).blocks]
    assert plan["blocks"][0][0] == 1 and plan["blocks"][-1][1] == 12 and len(plan["blocks"]) == 4
    counts = [n for _, n in plan["eps_sweep"]]
    assert counts == sorted(counts, reverse=True) and counts[-1] == 1
    csv = (out / "similarity.csv").read_text().splitlines()
    assert csv[0].startswith("layer,1,2") and len(csv) == 13
    assert (out / "eps_sweep.csv").read_text().startswith("eps,n_blocks\n")
    assert (out / "similarity.png").stat().st_size > 1000
    assert "blocks" in json.loads((out / "similarity.json").read_text())["caption"]
    assert not [p for p in out.iterdir() if p.name.startswith(".")]  # no temporary leftovers

    eps = float(np.median(S))
    assert main(args + ["--eps", str(eps)]) == 0
    plan = json.loads((out / "plan.json").read_text())
    assert plan["blocks"] == [list(b) for b in partition_min_blocks(np.load(out / "similarity.npy"), eps).blocks]
    assert plan["max_discrepancy"] <= eps


def test_discover_reports_bad_input_in_one_line(tmp_path, capsys):
    assert main(["discover", "--backbone", "no-such-net", "--random-init", "--calibration", str(tmp_path),
                 "--out", str(tmp_path / "o"), "--depth", "3"]) == 1
    assert "no-such-net" in capsys.readouterr().err
