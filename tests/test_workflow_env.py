"""The --use-conda environment and the execution profiles, as files: the environment
names every runtime dependency of the package, every shell rule uses it, and the
profiles carry the settings a real cluster needs."""

from __future__ import annotations

import re
import tomllib
from pathlib import Path

import yaml

REPO = Path(__file__).resolve().parents[1]
ENV = REPO / "workflow" / "envs" / "pathtwt.yaml"
PROFILES = REPO / "workflow" / "profiles"


def _name(requirement: str) -> str:
    return re.split(r"[<>=!~\[; ]", requirement.strip(), maxsplit=1)[0].lower().replace("_", "-")


def test_conda_env_names_every_runtime_dependency():
    env = yaml.safe_load(ENV.read_text())
    assert "conda-forge" in env["channels"]
    deps = env["dependencies"]
    assert any(str(d).startswith("python") for d in deps if isinstance(d, str)) and "pip" in deps
    pip = next(d["pip"] for d in deps if isinstance(d, dict))
    runtime = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["dependencies"]
    in_env = {_name(p): p for p in pip}
    missing = [r for r in runtime if _name(r) not in in_env]
    assert not missing, f"{ENV} lacks {missing}"
    # the same ranges as the package declares, so conda and pip installs agree
    assert {_name(r): r.replace(" ", "") for r in runtime} == {
        k: v.replace(" ", "") for k, v in in_env.items() if k in {_name(r) for r in runtime}
    }
    # the package itself, by a path relative to the env file (pip resolves it from there)
    local = [p for p in pip if p.startswith(".")]
    assert len(local) == 1 and (ENV.parent / local[0] / "pyproject.toml").is_file()


def test_every_shell_rule_uses_the_env():
    for smk in sorted((REPO / "workflow" / "rules").glob("*.smk")):
        text = smk.read_text()
        for rule in re.split(r"\n\s*(?:rule|checkpoint) ", text)[1:]:
            name = rule.split(":", 1)[0]
            if "\n        shell:" in rule or "\n            shell:" in rule:
                assert 'conda:\n' in rule and '"../envs/pathtwt.yaml"' in rule, f"{smk.name}: rule {name}"
            if "shell:" in rule or "run:" in rule:
                assert "log:" in rule, f"{smk.name}: rule {name} has no log"


def test_slurm_profile_uses_squeue_and_maps_gpus():
    prof = yaml.safe_load((PROFILES / "slurm" / "config.yaml").read_text())
    assert prof["executor"] == "slurm"
    assert prof["slurm-status-command"] == "squeue"
    assert prof["set-resources"]["extract"]["slurm_partition"] == prof["set-resources"]["compress"]["slurm_partition"]
    assert "extract=20" in prof["group-components"] and "gpu=local" in prof["set-resource-scopes"]


def test_lumi_profile():
    prof = yaml.safe_load((PROFILES / "lumi" / "config.yaml").read_text())
    assert prof["executor"] == "slurm"
    assert prof["default-resources"]["slurm_account"].startswith("project_")
    assert {prof["set-resources"][r]["slurm_partition"] for r in ("discover", "compress", "extract", "train_mil")} == {"small-g"}
    assert all(prof["set-resources"][r]["gpu"] == 1 for r in ("compress", "extract"))
    doc = (PROFILES / "README.md").read_text()
    assert "ROCm" in doc and "HDF5_USE_FILE_LOCKING" in doc and "standard-g" in doc
    assert "HDF5_USE_FILE_LOCKING" in (REPO / "workflow" / "rules" / "common.smk").read_text()
