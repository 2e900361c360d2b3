"""workflow/profiles/local: Snakemake accepts it and plans the demo through it."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import yaml

REPO = Path(__file__).resolve().parents[1]
PROFILE = REPO / "workflow" / "profiles" / "local"
SNAKEMAKE = Path(sys.executable).parent / "snakemake"


def test_local_profile_settings():
    settings = yaml.safe_load((PROFILE / "config.yaml").read_text())
    # the lighter scheduler, and nothing a cluster profile would carry
    assert settings == {"cores": "all", "scheduler": "greedy"}


def test_demo_plans_through_the_local_profile(tmp_path):
    res = subprocess.run([str(SNAKEMAKE), "-s", str(REPO / "Snakefile"), "--directory", str(tmp_path), "-n",
                          "--profile", str(PROFILE), "--configfile", str(REPO / "config" / "config.yaml"),
                          "--quiet", "rules"],
                         capture_output=True, text=True, cwd=REPO, timeout=600)
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    assert "demo_slides" in res.stdout and "train_mil" in res.stdout
