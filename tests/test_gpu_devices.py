"""Device resolution on GPU machines, with a mocked multi-GPU torch.cuda: jobs started side
by side get different GPUs (a claim per GPU index), a GPU that torch cannot use stops
`--device auto` with one line, and impossible requests are one-line errors."""

from __future__ import annotations

import multiprocessing
import os
import subprocess
import sys
import threading
from pathlib import Path

import pytest
import torch

from pathtwt import devices
from pathtwt.errors import ConfigError

REPO = Path(__file__).resolve().parents[1]
# every variable that says a launcher chose (or a node was given) GPUs
GPU_VARIABLES = ("CUDA_VISIBLE_DEVICES", "HIP_VISIBLE_DEVICES", "ROCR_VISIBLE_DEVICES", "SLURM_JOB_GPUS", "SLURM_JOB_ID",
                 "SLURM_GPUS_ON_NODE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", devices.CLAIM_VARIABLE)


@pytest.fixture
def gpus(monkeypatch, tmp_path):
    """A machine with N GPUs as torch.cuda sees it; claims in a folder of this test."""

    def make(n: int, available: bool = True):
        for var in GPU_VARIABLES:
            monkeypatch.delenv(var, raising=False)
        monkeypatch.setenv(devices.LOCK_DIR_VARIABLE, str(tmp_path / "claims"))
        monkeypatch.setattr(torch.cuda, "is_available", lambda: available)
        monkeypatch.setattr(torch.cuda, "device_count", lambda: n if available else 0)
        monkeypatch.setattr(torch.cuda, "get_device_name", lambda index=None: f"Mock GPU {index}")
        current = [0]
        monkeypatch.setattr(torch.cuda, "current_device", lambda: current[0])
        monkeypatch.setattr(torch.cuda, "set_device", lambda index: current.__setitem__(0, int(index)))
        monkeypatch.setattr(torch.version, "hip", None)
        # a GPU the build has kernels for (tests of the opposite set their own)
        monkeypatch.setattr(torch.cuda, "get_device_capability", lambda index=None: (9, 0))
        monkeypatch.setattr(torch.cuda, "get_arch_list", lambda: ["sm_80", "sm_90"])
        monkeypatch.setattr(devices, "NVIDIA_DEVICE_GLOB", str(tmp_path / "no-such-device*"))
        monkeypatch.setattr(devices, "AMD_RENDER_VENDOR_GLOB", str(tmp_path / "no-such-render*"))
        monkeypatch.setattr(devices, "nvidia_driver_version", lambda: "550.54.15")
        monkeypatch.setattr(devices, "_PROCESS_CLAIM", [])
        monkeypatch.setattr(devices, "_DECIDED", {})
        return tmp_path / "claims"

    return make


def test_two_threads_claim_different_gpus(gpus):
    folder = gpus(2)
    got, barrier = [], threading.Barrier(2)

    def claim():
        barrier.wait()
        got.extend(devices.claim_gpus(1, 2, wait_s=0))

    threads = [threading.Thread(target=claim) for _ in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert sorted(c.index for c in got) == [0, 1]
    # a third job waits for a free GPU; bounded here, it says so in one line
    with pytest.raises(ConfigError, match=r"no 1 free GPU\(s\) of 2"):
        devices.claim_gpus(1, 2, wait_s=0)
    # a claim ends with its holder: the GPU is free again
    got[0].release()
    again = devices.claim_gpus(1, 2, wait_s=0)
    assert [c.index for c in again] == [got[0].index]
    assert sorted(p.name for p in folder.iterdir()) == ["gpu0.lock", "gpu1.lock"]


def _resolve_in_child(queue, start, release):
    start.wait()
    queue.put(devices.resolve_device("auto"))
    release.wait()  # hold the claim while the other process resolves


def test_two_processes_resolve_cuda_to_different_gpus(gpus):
    gpus(4)
    ctx = multiprocessing.get_context("fork")  # the children keep this test's mocked torch.cuda
    queue, start, release = ctx.Queue(), ctx.Event(), ctx.Event()
    children = [ctx.Process(target=_resolve_in_child, args=(queue, start, release)) for _ in range(2)]
    for child in children:
        child.start()
    start.set()
    try:
        chosen = sorted(queue.get(timeout=60) for _ in children)
    finally:
        release.set()
        for child in children:
            child.join(timeout=60)
    assert chosen == ["cuda:0", "cuda:1"]
    assert all(child.exitcode == 0 for child in children)


def test_claim_is_the_processes_own_and_kept(gpus):
    gpus(2)
    other = devices.claim_gpus(1, 2, wait_s=0)  # another job took cuda:0
    first = devices.resolve_device("cuda")
    # create_backbone resolves the device again: the same GPU, no second claim
    assert devices.resolve_device("cuda") == first == "cuda:1"
    assert torch.cuda.current_device() == 1  # and it is the current device
    other[0].release()
    assert devices.resolve_device(first) == first
    info = devices.device_provenance(first)
    assert info["device"] == "cuda:1" and info["gpu_name"] == "Mock GPU 1"
    assert info["torch_version"] == torch.__version__ and "cuda_version" in info


def test_claims_name_the_gpus_the_machine_knows(gpus, monkeypatch, tmp_path):
    """Processes shown different subsets (CUDA_VISIBLE_DEVICES) claim a GPU by its machine
    id, so the same GPU is one lock whatever its index in a process."""
    folder = gpus(2)
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "5,7")
    first = devices.claim_gpus(1, 2, wait_s=0)
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "7,5")
    second = devices.claim_gpus(1, 2, wait_s=0)
    # both are their process's cuda:0, and they are two different GPUs
    assert [c.index for c in first + second] == [0, 0]
    assert sorted(p.name for p in folder.iterdir()) == ["gpu5.lock", "gpu7.lock"]
    with pytest.raises(ConfigError, match="no 1 free GPU"):
        devices.claim_gpus(1, 2, wait_s=0)
    # SLURM numbers each allocation's GPUs from 0: claims are per job there
    monkeypatch.delenv(devices.LOCK_DIR_VARIABLE)
    monkeypatch.setenv("SLURM_JOB_ID", "4242")
    assert devices.gpu_lock_dir().endswith("pathtwt-gpu-claims-slurm4242")


@pytest.mark.parametrize("variable,value", [("LOCAL_RANK", "0"), (devices.CLAIM_VARIABLE, "0")])
def test_no_claim_where_a_launcher_chose(gpus, monkeypatch, variable, value):
    folder = gpus(2)
    monkeypatch.setenv(variable, value)
    assert devices.resolve_device("auto") == "cuda"
    assert not folder.exists()


def test_one_gpu_needs_no_claim(gpus):
    folder = gpus(1)
    assert devices.resolve_device("cuda") == "cuda"
    assert not folder.exists()


def test_index_beyond_the_machine_is_one_line(gpus):
    gpus(2)
    with pytest.raises(ConfigError) as err:
        devices.resolve_device("cuda:3")
    assert "--device cuda:3" in str(err.value) and "only 2 CUDA device(s)" in str(err.value)
    assert "\n" not in str(err.value)


def test_more_gpus_than_the_machine_has_is_one_line(gpus, monkeypatch):
    gpus(2)
    with pytest.raises(ConfigError, match=r"^4 GPU\(s\) asked for, but this machine has 2 visible") as err:
        devices.claim_gpus(4, 2)
    assert "\n" not in str(err.value)
    # torchrun starting more ranks on this node than it has GPUs
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "4")
    monkeypatch.setenv("LOCAL_RANK", "0")
    with pytest.raises(ConfigError, match=r"^4 ranks on this node \(one per GPU\) but 2 GPU"):
        devices.resolve_device("cuda")


def test_run_with_gpus_refuses_more_than_the_machine_has(gpus, capsys):
    gpus(2)
    assert devices.run_with_gpus(["--gpus", "3", "--", "true"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("error: 3 GPU(s) asked for, but this machine has 2") and "\n" not in err


def test_run_with_gpus_claims_and_names_them(gpus, tmp_path):
    folder = gpus(3)
    held = devices.claim_gpus(1, 3, wait_s=0)  # another job holds cuda:0
    script = tmp_path / "child.py"
    script.write_text(
        "import fcntl, os, sys\n"
        f"folder = {str(folder)!r}\n"
        "held = []\n"
        "for i in range(3):\n"
        "    with open(os.path.join(folder, f'gpu{i}.lock'), 'a') as fh:\n"
        "        try:\n"
        "            fcntl.flock(fh, fcntl.LOCK_EX | fcntl.LOCK_NB)\n"
        "        except OSError:\n"
        "            held.append(i)\n"
        "print(os.environ['CUDA_VISIBLE_DEVICES'], held)\n"
    )
    # the claims run in a fork: exec replaces the process, as the compress rule's torchrun does
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # pragma: no cover - the child
        os.dup2(write, 1)
        try:
            devices.run_with_gpus(["--gpus", "2", "--", sys.executable, str(script)])
        finally:
            os._exit(3)
    os.close(write)
    with os.fdopen(read) as fh:
        printed = fh.read().strip()
    _, status = os.waitpid(pid, 0)
    held[0].release()
    assert os.waitstatus_to_exitcode(status) == 0
    # the command saw the two free GPUs, and their locks were still held while it ran
    assert printed == "1,2 [0, 1, 2]"


@pytest.mark.parametrize("variable,value,evidence", [
    ("CUDA_VISIBLE_DEVICES", "0", "CUDA_VISIBLE_DEVICES=0"),
    ("SLURM_JOB_GPUS", "2,3", "SLURM_JOB_GPUS=2,3"),
    ("SLURM_GPUS_ON_NODE", "1", "SLURM_GPUS_ON_NODE=1"),
])
def test_auto_stops_on_a_gpu_torch_cannot_use(gpus, monkeypatch, variable, value, evidence):
    gpus(0, available=False)
    monkeypatch.setenv(variable, value)
    monkeypatch.setattr(torch.version, "cuda", "12.4")
    with pytest.raises(ConfigError) as err:
        devices.resolve_device("auto")
    text = str(err.value)
    assert "\n" not in text
    assert text.startswith(f"--device auto: this node has a GPU ({evidence})")
    assert "CUDA 12.4 build needs an NVIDIA driver >= 525.60.13" in text and "--device cpu" in text


def test_the_driver_error_says_which_build_fits(gpus, monkeypatch):
    """A CUDA 13 torch on a 550 driver (many clusters): the line names the CUDA 12 env."""
    gpus(0, available=False)
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "0")
    monkeypatch.setattr(torch.version, "cuda", "13.0")
    with pytest.raises(ConfigError) as err:
        devices.resolve_device("auto")
    assert ("CUDA 13.0 build needs an NVIDIA driver >= 580.65.06; driver 550.54.15 runs CUDA 12 builds "
            "(conda_env: pathtwt-cu12)") in str(err.value)
    assert devices.build_for_driver("590.1") == "driver 590.1 runs CUDA 13 builds (conda_env: pathtwt)"
    assert "update the driver" in devices.build_for_driver("470.82.01")


@pytest.mark.parametrize("variable", ["ROCR_VISIBLE_DEVICES", "HIP_VISIBLE_DEVICES"])
def test_an_amd_node_in_the_cuda_env_is_told_to_use_rocm(gpus, monkeypatch, variable):
    gpus(0, available=False)
    monkeypatch.setenv(variable, "0")
    monkeypatch.setattr(torch.version, "cuda", "13.0")
    with pytest.raises(ConfigError) as err:
        devices.resolve_device("auto")
    text = str(err.value)
    assert f"({variable}=0)" in text and "AMD" in text and "pathtwt-rocm" in text
    assert "NVIDIA driver" not in text and "\n" not in text


def _arch(monkeypatch, capability, archs):
    monkeypatch.setattr(torch.version, "cuda", "13.0")
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda index=None: capability)
    monkeypatch.setattr(torch.cuda, "get_arch_list", lambda: archs)


def test_a_gpu_the_build_has_no_kernels_for_stops_in_one_line(gpus, monkeypatch):
    """A V100 (sm_70) under a CUDA 13 build: torch says available, the first kernel fails."""
    gpus(1)
    _arch(monkeypatch, (7, 0), ["sm_75", "sm_80", "sm_86", "sm_90", "sm_100", "sm_120"])
    with pytest.raises(ConfigError) as err:
        devices.use_device("cuda")
    text = str(err.value)
    assert text.startswith("--device cuda: Mock GPU 0 is sm_70 but torch ") and "(CUDA 13.0 build)" in text
    assert "sm_75, sm_80" in text and "pathtwt-cu12" in text and "\n" not in text


@pytest.mark.parametrize("capability,archs", [
    ((9, 0), ["sm_80", "sm_90"]),  # its own cubin
    ((8, 6), ["sm_80", "sm_90"]),  # a cubin of the same major, lower minor
    ((12, 1), ["sm_90", "compute_90"]),  # PTX of a lower version, compiled at load
])
def test_a_gpu_the_build_runs_on_passes(gpus, monkeypatch, capability, archs):
    gpus(1)
    _arch(monkeypatch, capability, archs)
    assert devices.use_device("cuda") == "cuda"


def test_auto_stops_on_nvidia_device_files(gpus, monkeypatch, tmp_path):
    gpus(0, available=False)
    (tmp_path / "nvidia0").touch()
    monkeypatch.setattr(devices, "NVIDIA_DEVICE_GLOB", str(tmp_path / "nvidia[0-9]*"))
    monkeypatch.setattr(torch.version, "cuda", None)
    with pytest.raises(ConfigError, match=r"nvidia0 exists\) but torch .* \(CPU-only build\) cannot use it"):
        devices.resolve_device("auto")
    with pytest.raises(ConfigError, match=r"^--device cuda: this node has a GPU"):
        devices.resolve_device("cuda")


@pytest.mark.parametrize("value", ["", "-1", "NoDevFiles"])
def test_auto_is_cpu_where_no_gpu_was_given(gpus, monkeypatch, value):
    gpus(0, available=False)
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", value)
    assert devices.resolve_device("auto") == "cpu"


def test_cpu_provenance():
    info = devices.device_provenance("cpu")
    assert info["device"] == "cpu" and info["gpu_name"] == "" and info["torch_version"] == torch.__version__


def test_devices_module_runs_as_a_script():
    res = subprocess.run([sys.executable, "-m", "pathtwt.devices", "--help"], capture_output=True, text=True,
                         cwd=REPO, env={**os.environ, "PYTHONPATH": str(REPO)}, timeout=120)
    assert res.returncode == 0 and "--gpus" in res.stdout


def test_an_unusable_claim_folder_is_one_line(gpus, monkeypatch, tmp_path):
    gpus(2)
    blocked = tmp_path / "not-a-folder"
    blocked.write_text("")
    monkeypatch.setenv(devices.LOCK_DIR_VARIABLE, str(blocked / "claims"))
    with pytest.raises(ConfigError, match=r"cannot make the GPU claims folder"):
        devices.claim_gpus(1, 2, wait_s=0)
    folder = tmp_path / "ro"
    folder.mkdir()
    (folder / "gpu0.lock").mkdir()  # a lock path that cannot be opened as a file
    monkeypatch.setenv(devices.LOCK_DIR_VARIABLE, str(folder))
    with pytest.raises(ConfigError, match=r"gpu0.lock: cannot open the GPU claim .*PATHTWT_GPU_LOCK_DIR"):
        devices.claim_gpus(1, 2, wait_s=0)


def test_amd_render_nodes_count_as_visible_gpus(monkeypatch, tmp_path):
    """An AMD node without *_VISIBLE_DEVICES: its amdgpu render nodes are its GPUs (a
    display adapter of another vendor is not)."""
    for name, vendor in (("renderD128", "0x1002"), ("renderD129", "0x1002"), ("renderD130", "0x10de")):
        (tmp_path / name / "device").mkdir(parents=True)
        (tmp_path / name / "device" / "vendor").write_text(vendor + "\n")
    for var in ("CUDA_VISIBLE_DEVICES", "HIP_VISIBLE_DEVICES", "ROCR_VISIBLE_DEVICES"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setattr(devices, "NVIDIA_DEVICE_GLOB", str(tmp_path / "none*"))
    monkeypatch.setattr(devices, "AMD_RENDER_VENDOR_GLOB", str(tmp_path / "renderD*" / "device" / "vendor"))
    assert devices.local_gpu_jobs(None) == (2, "pathtwt workflow: at most 2 GPU job(s) at a time, one per visible GPU "
                                                "(2 AMD render node(s) of the amdgpu driver); --resources gpu=N to change")
    monkeypatch.setattr(devices, "AMD_RENDER_VENDOR_GLOB", str(tmp_path / "none*"))
    limit, line = devices.local_gpu_jobs(None)
    assert limit is None and "no GPU visible" in line


def _protected_regular_open(real_open):
    """os.open with fs.protected_regular's rule: O_CREAT on an existing file of another
    user in a sticky world-writable folder is EACCES (this machine's setting may be 0)."""
    import errno
    import stat

    def guarded(path, flags, mode=0o777, **kw):
        if flags & os.O_CREAT and os.path.exists(path):
            folder = os.stat(os.path.dirname(path) or ".")
            if folder.st_mode & stat.S_ISVTX and folder.st_mode & 0o002 and os.stat(path).st_uid != os.geteuid():
                raise PermissionError(errno.EACCES, "Permission denied", path)
        return real_open(path, flags, mode, **kw)

    return guarded


def test_a_lock_file_of_another_user_still_claims(gpus, monkeypatch, tmp_path):
    """A shared workstation: gpu0's lock file was made by another user (shared 0666, or
    0644 where their umask won); under protected_regular this user's claim still works and
    still excludes theirs."""
    gpus(2)
    folder = tmp_path / "claims"
    folder.mkdir()
    folder.chmod(0o1777)
    for index, mode in ((0, 0o666), (1, 0o644)):
        lock = folder / f"gpu{index}.lock"
        lock.write_text("")
        lock.chmod(mode)
        try:
            os.chown(lock, 65534, 65534)  # nobody
        except PermissionError:
            pytest.skip("needs root to give a file to another user")
    monkeypatch.setattr(devices.os, "open", _protected_regular_open(os.open))
    claims = devices.claim_gpus(2, 2, lock_dir=str(folder), wait_s=0)
    assert [c.index for c in claims] == [0, 1]
    # held: another claim (as another job would) finds both taken
    with pytest.raises(ConfigError, match="no 1 free GPU"):
        devices.claim_gpus(1, 2, lock_dir=str(folder), wait_s=0)
    for claim in claims:
        claim.release()
    assert [c.index for c in devices.claim_gpus(1, 2, lock_dir=str(folder), wait_s=0)] == [0]


def test_another_user_claims_through_a_lock_file_made_here(gpus, tmp_path):
    """The other way round, as a real second user: a process running as nobody claims
    gpu0 through the file this user made, and a held claim here keeps it off gpu0."""
    import tempfile

    if os.geteuid() != 0:
        pytest.skip("needs root to run a process as another user")
    gpus(2)
    folder = Path(tempfile.mkdtemp(prefix="pathtwt-claims-test-"))
    try:
        folder.chmod(0o1777)
        here = devices.claim_gpus(1, 2, lock_dir=str(folder), wait_s=0)
        assert here[0].index == 0
        code = ("import sys; sys.path.insert(0, sys.argv[1]); from pathtwt import devices; "
                "print([c.index for c in devices.claim_gpus(1, 2, lock_dir=sys.argv[2], wait_s=0)])")
        # the system interpreter: this one may sit in a folder the other user cannot enter
        python = "/usr/bin/python3"
        if not os.access(python, os.X_OK):
            pytest.skip("no /usr/bin/python3 to run as another user")
        res = subprocess.run([python, "-c", code, str(REPO), str(folder)], capture_output=True, text=True,
                             timeout=60, user=65534, group=65534, extra_groups=[], cwd="/")
        if "No module named" in res.stderr or f"Permission denied: '{REPO}" in res.stderr:
            pytest.skip("the other user cannot read this checkout or its dependencies")
        assert res.returncode == 0 and res.stdout.strip() == "[1]", res.stderr[-2000:]
    finally:
        import shutil

        shutil.rmtree(folder, ignore_errors=True)


def test_the_device_is_decided_once_per_process(gpus, monkeypatch):
    """use_device resolves, claims and makes current once; later calls (and create_backbone
    given the decided device) read that result and never resolve again."""
    gpus(2)
    first = devices.use_device("auto")
    assert first == "cuda:0" and torch.cuda.current_device() == 0
    calls = []
    monkeypatch.setattr(devices, "resolve_device", lambda *a, **k: calls.append(a) or "cuda:1")
    assert devices.use_device("auto") == first and calls == []
    from pathtwt.models import registry

    backbone = registry.create_backbone("vit-s14-tiny", pretrained=False, device="cpu", precision="fp32")
    assert backbone.device == "cpu" and calls == []


def test_commands_take_the_device_from_the_one_function():
    """Only pathtwt.devices resolves a device name; commands and models call use_device."""
    package = REPO / "pathtwt"
    resolving = sorted(str(p.relative_to(package)) for p in package.rglob("*.py")
                       if p.name != "devices.py" and "resolve_device(" in p.read_text())
    assert resolving == []
    users = sorted(p.relative_to(package).as_posix() for p in package.rglob("*.py") if "use_device(" in p.read_text())
    assert {"cli/extract.py", "cli/train_mil.py", "cli/predict.py", "cli/probe.py", "cli/options.py",
            "cli/compress.py", "models/registry.py"} <= set(users)
