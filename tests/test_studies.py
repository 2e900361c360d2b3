"""Two studies run one after the other in one checkout, each with nothing but `snakemake
--cores N --configfile X.yaml`, keep their own results: each report shows its own tasks
only, and the first study's files survive the second."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import yaml

REPO = Path(__file__).resolve().parents[1]
SNAKEMAKE = Path(sys.executable).parent / "snakemake"
PATHTWT = Path(sys.executable).parent / "pathtwt"
LABELS = (0, 1, 0, 1, 0, 1)
SPLITS = ("train", "train", "val", "val", "test", "test")


def _slides(root: Path) -> None:
    """Six small synthetic metastasis slides (two per split, one of each class) and their table."""
    rows = ["slide_id,label,split"]
    for i, (label, split) in enumerate(zip(LABELS, SPLITS)):
        subprocess.run([str(PATHTWT), "demo", "make-slide", "--out", str(root / "slides" / f"s{i}.tiff"),
                        "--width", "1536", "--height", "1024", "--mpp", "0.5", "--task", "metastasis",
                        "--label", str(label), "--seed", str(i)], check=True, capture_output=True, timeout=60)
        rows.append(f"s{i},{label},{split}")
    (root / "labels.csv").write_text("\n".join(rows) + "\n")


def _config(data: Path, cohort: str, task: str, **extra) -> dict:
    """A tiny study: one cohort, one task, the tiny ViT with random weights, meanpool heads."""
    return {
        **extra,
        "cohorts": {cohort: {"slides": str(data / "slides"), "labels": str(data / "labels.csv"),
                             "tiling": {"tile_size": 224, "tissue": "otsu"}}},
        "tasks": {task: {"cohort": cohort, "classes": 2, "metric": "accuracy", "protocol": "metastasis"}},
        "backbones": {"vit-s14-imgfocus": {"weights": str(data / "absent.safetensors"), "fallback": "vit-s14-tiny"}},
        "variants": {"uncompressed": {"method": "none"}},
        "extract": {"device": "cpu", "batch_size": 16, "threads": 1},
        "mil": {"heads": ["meanpool"], "seeds": [0], "device": "cpu", "threads": 1},
    }


def _snakemake(work: Path, config: Path, *args: str) -> subprocess.CompletedProcess:
    cmd = [str(SNAKEMAKE), "-s", str(REPO / "Snakefile"), "--directory", str(work), "--cores", "2",
           "--configfile", str(config), *args]
    res = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    return res


def _files(folder: Path) -> dict[str, int]:
    """Every file under ``folder`` with its modification time (ns)."""
    return {str(p.relative_to(folder)): p.stat().st_mtime_ns for p in sorted(folder.rglob("*")) if p.is_file()}


def test_two_studies_in_one_checkout_keep_their_own_results(tmp_path):
    data, work = tmp_path / "data", tmp_path / "checkout"
    _slides(data)
    work.mkdir()
    # the first study is named after its config file, the second names itself
    first, second = work / "alpha.yaml", work / "two.yaml"
    first.write_text(yaml.safe_dump(_config(data, "cohort-a", "task-a")))
    second.write_text(yaml.safe_dump(_config(data, "cohort-b", "task-b", study="beta")))

    _snakemake(work, first)
    alpha = work / "results" / "alpha"
    page = (alpha / "report" / "index.html").read_text()
    assert "Task: task-a" in page and "task-b" not in page
    before = _files(alpha)
    assert "report/task-a.csv" in before and any(k.startswith("tiles/cohort-a/") for k in before)

    _snakemake(work, second)
    beta = work / "results" / "beta"
    page = (beta / "report" / "index.html").read_text()
    assert "Task: task-b" in page and "task-a" not in page
    assert "cohort-a" not in "".join(_files(beta))
    # the first study's files are as they were, and its report still shows its task only
    assert _files(alpha) == before
    assert "task-b" not in (alpha / "report" / "index.html").read_text()
    assert sorted(p.name for p in (work / "results").iterdir()) == ["alpha", "beta"]
    assert sorted(p.name for p in (work / "logs").iterdir()) == ["alpha", "beta"]
    # and the first study is still complete: nothing of it to redo
    assert "Nothing to be done" in (lambda r: r.stdout + r.stderr)(_snakemake(work, first, "-n"))
