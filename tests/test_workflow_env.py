"""The --use-conda environments and the execution profiles, as files (conda channels are
not reachable here, so the environments are checked for structure, not built): exact
pins inside the ranges the package declares, no Snakemake in the jobs' environment, the
package installed editable from the repository, every shell rule using the configured
environment, and profiles that carry the settings a real cluster needs."""

from __future__ import annotations

import re
import tomllib
from pathlib import Path

import pytest
import yaml
from packaging.requirements import Requirement
from packaging.version import Version

REPO = Path(__file__).resolve().parents[1]
ENVS = REPO / "workflow" / "envs"
PROFILES = REPO / "workflow" / "profiles"


def _name(requirement: str) -> str:
    return re.split(r"[<>=!~\[; ]", requirement.strip(), maxsplit=1)[0].lower().replace("_", "-")


def _pip(env: dict) -> list[str]:
    return next(d["pip"] for d in env["dependencies"] if isinstance(d, dict))


@pytest.mark.parametrize("name", ["pathtwt", "pathtwt-rocm", "pathtwt-cu12"])
def test_conda_env_pins_every_runtime_dependency(name):
    path = ENVS / f"{name}.yaml"
    env = yaml.safe_load(path.read_text())
    assert env["name"] == name and "conda-forge" in env["channels"]
    conda = [d for d in env["dependencies"] if isinstance(d, str)]
    assert all("=" in d for d in conda), f"{path}: unpinned conda packages {conda}"
    pip = _pip(env)
    options = [p for p in pip if p.startswith("-")]
    pins = {_name(p): p for p in pip if not p.startswith("-")}
    assert all("==" in p for p in pins.values()), f"{path}: every pip package is pinned exactly"
    runtime = [Requirement(r) for r in tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["dependencies"]]
    for req in runtime:
        pin = pins.get(req.name.lower().replace("_", "-"))
        assert pin is not None, f"{path} lacks {req.name}"
        version = Version(pin.split("==", 1)[1])
        assert req.specifier.contains(version, prereleases=True), f"{path}: {pin} outside pyproject's {req}"
    # Snakemake runs the jobs from outside; it is no dependency of the jobs themselves
    assert not [p for p in pins if p.startswith("snakemake")]
    # the package itself, editable (a source change reaches the next job), from the repository
    editable = [o for o in options if o.startswith("-e ")]
    assert len(editable) == 1 and (path.parent / editable[0][3:] / "pyproject.toml").is_file()


# the GPU decoder's packages in the CUDA environments: nvImageCodec of the extra and its nvJPEG
GPU_DECODER = {"gpu": {"nvidia-nvimgcodec-cu13", "nvidia-nvjpeg"},
               "gpu-cu12": {"nvidia-nvimgcodec-cu12", "nvidia-nvjpeg-cu12"}}


@pytest.mark.parametrize("name,extra", [("pathtwt", "gpu"), ("pathtwt-cu12", "gpu-cu12")])
def test_cuda_envs_carry_the_gpu_decoder_of_their_extra(name, extra):
    """A GPU job under --use-conda decodes JPEG tiles with nvImageCodec on the GPU's JPEG
    engines (not torchvision's deprecated decoder): the env pins the extra's package, with
    the nvJPEG backend requested, at a version inside the extra's range."""
    pins = {_name(p): p for p in _pip(yaml.safe_load((ENVS / f"{name}.yaml").read_text())) if not p.startswith("-")}
    (wanted,) = (r for r in (Requirement(r) for r in tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
                             ["optional-dependencies"][extra]) if r.name.startswith("nvidia-nvimgcodec"))
    pin = pins[wanted.name]
    assert "[nvjpeg]" in pin and wanted.specifier.contains(Version(pin.split("==", 1)[1]))
    assert GPU_DECODER[extra] <= pins.keys()


@pytest.mark.parametrize("variant,index", [("pathtwt-rocm", "/whl/rocm"), ("pathtwt-cu12", "/whl/cu12")])
def test_envs_differ_only_in_torch(variant, index):
    label = index.rsplit("/", 1)[1]
    cuda, rocm = (yaml.safe_load((ENVS / f"{n}.yaml").read_text()) for n in ("pathtwt", variant))
    cuda_pins = {_name(p): p for p in _pip(cuda) if not p.startswith("-")}
    rocm_pins = {_name(p): p for p in _pip(rocm) if not p.startswith("-")}
    # the GPU JPEG decoder is built per CUDA major (pyproject's gpu and gpu-cu12 extras);
    # ROCm has none (its GPUs decode on the CPU path)
    decoders = {"pathtwt": GPU_DECODER["gpu"], "pathtwt-cu12": GPU_DECODER["gpu-cu12"], "pathtwt-rocm": set()}
    for name, pins in (("pathtwt", cuda_pins), (variant, rocm_pins)):
        assert {k for k in pins if k.startswith("nvidia-")} == decoders[name], name
    cuda_pins, rocm_pins = ({k: v for k, v in pins.items() if not k.startswith("nvidia-")}
                            for pins in (cuda_pins, rocm_pins))
    assert cuda_pins.keys() == rocm_pins.keys()
    differ = {k for k in cuda_pins if cuda_pins[k] != rocm_pins[k]}
    assert differ == {"torch", "torchvision"}
    assert all(rocm_pins[k].startswith(cuda_pins[k] + "+" + label) for k in differ)
    urls = [o for o in _pip(rocm) if o.startswith("--extra-index-url")]
    assert len(urls) == 1 and index in urls[0]
    assert urls[0].rsplit("/", 1)[1] == rocm_pins["torch"].rsplit("+", 1)[1]  # one release throughout
    # the pins are the ones the tests run with
    constraints = {_name(line): line.strip() for line in (REPO / "constraints.txt").read_text().splitlines()
                   if line.strip() and not line.startswith("#")}
    for k, pin in cuda_pins.items():
        if k in constraints:
            assert pin.lower() == constraints[k].lower(), f"{pin} differs from constraints.txt {constraints[k]}"


def test_config_chooses_the_env_and_every_shell_rule_uses_it():
    schema = yaml.safe_load((REPO / "pathtwt" / "config" / "schema.yaml").read_text())
    choices = schema["properties"]["conda_env"]["enum"]
    assert all((ENVS / f"{c}.yaml").is_file() for c in choices)
    assert 'CONDA_ENV = f"../envs/{config[\'conda_env\']}.yaml"' in (REPO / "workflow" / "rules" / "common.smk").read_text()
    for smk in sorted((REPO / "workflow" / "rules").glob("*.smk")):
        text = smk.read_text()
        for rule in re.split(r"\n\s*(?:rule|checkpoint) ", text)[1:]:
            name = rule.split(":", 1)[0]
            # any indentation: top-level rules (probe's hard-coded env went unseen) and nested ones
            if re.search(r"\n\s+shell:", rule):
                assert re.search(r"conda:\n\s+CONDA_ENV\n", rule), f"{smk.name}: rule {name}"
            if "shell:" in rule or "run:" in rule:
                assert "log:" in rule, f"{smk.name}: rule {name} has no log"


def test_container_recipe_for_lumi():
    recipe = (ENVS / "pathtwt-lumi.def").read_text()
    assert recipe.startswith("Bootstrap:") and "%post" in recipe and "%environment" in recipe
    # the same pins as the ROCm environment file
    for pin in _pip(yaml.safe_load((ENVS / "pathtwt-rocm.yaml").read_text())):
        if not pin.startswith("-"):
            assert pin in recipe, f"pathtwt-lumi.def lacks {pin}"
    assert "snakemake" not in recipe.split("%post", 1)[1].split("%environment", 1)[0].lower()
    doc = (ENVS / "README.md").read_text()
    assert "apptainer build" in doc and "cotainr" in doc and "pathtwt-rocm" in doc


def test_slurm_profile_uses_squeue_and_groups_short_jobs():
    prof = yaml.safe_load((PROFILES / "slurm" / "config.yaml").read_text())
    assert prof["executor"] == "slurm"
    assert prof["slurm-status-command"] == "squeue"
    assert prof["set-resources"]["extract"]["slurm_partition"] == prof["set-resources"]["compress"]["slurm_partition"]
    groups = dict(g.split("=") for g in prof["group-components"])
    assert {"tile", "extract"} <= groups.keys()
    # a train_mil job already trains every seed of a head: grouping five would make one
    # submission of 25 runs
    assert "train_mil" not in groups
    assert "gpu=local" in prof["set-resource-scopes"] and "cpu_slots=local" in prof["set-resource-scopes"]


def test_lumi_profile():
    prof = yaml.safe_load((PROFILES / "lumi" / "config.yaml").read_text())
    assert prof["executor"] == "slurm"
    assert prof["default-resources"]["slurm_account"] == "$SBATCH_ACCOUNT"
    gpu_rules = ("discover", "compress", "extract", "train_mil")
    assert {prof["set-resources"][r]["slurm_partition"] for r in gpu_rules} == {"small-g"}
    assert all(prof["set-resources"][r]["gpu"] == 1 for r in gpu_rules)
    assert all(prof["set-threads"][r] == 7 for r in gpu_rules)  # 7 cores per GCD
    doc = (PROFILES / "README.md").read_text()
    for word in ("ROCm", "HDF5_USE_FILE_LOCKING", "standard-g", "MIOPEN_USER_DB_PATH", "SBATCH_ACCOUNT"):
        assert word in doc
    assert "HDF5_USE_FILE_LOCKING" in (REPO / "workflow" / "rules" / "common.smk").read_text()


def test_cotainr_route_puts_the_package_in_the_image(tmp_path):
    """The README's cotainr step: the ROCm env file with the package's wheel in place of
    the editable install, so the image has the `pathtwt` command the rules call."""
    import subprocess

    doc = (ENVS / "README.md").read_text()
    line = next(l for l in doc.splitlines() if l.startswith("sed ") and "pathtwt-rocm.yaml" in l)
    wheel = tmp_path / "pathtwt-0.0.0-py3-none-any.whl"
    command = line.replace("$(ls /tmp/pathtwt-wheel/pathtwt-*.whl)", str(wheel)).replace("/tmp/pathtwt-rocm-image.yaml",
                                                                                          str(tmp_path / "env.yaml"))
    subprocess.run(command, shell=True, check=True, cwd=REPO)
    pip = _pip(yaml.safe_load((tmp_path / "env.yaml").read_text()))
    rocm = _pip(yaml.safe_load((ENVS / "pathtwt-rocm.yaml").read_text()))
    assert str(wheel) in pip and not [p for p in pip if p.startswith("-e ")]
    assert [p for p in pip if p != str(wheel)] == [p for p in rocm if not p.startswith("-e ")]
