"""One precision resolver (pathtwt.models.precision) for extract, probe, discover and
distill: its decisions on GPUs with and without native bf16 (a mocked torch.cuda), on this
CPU (unchanged), TF32 chosen explicitly, and distill choosing its teacher-target source
once."""

from __future__ import annotations

import ast
from pathlib import Path

import numpy as np
import pytest
import torch

from pathtwt.errors import ConfigError
from pathtwt.models import precision as P
from pathtwt.models.precision import Precision, choose_fp32_matmul, native_bf16, resolve_precision

PACKAGE = Path(__file__).resolve().parents[1] / "pathtwt"


@pytest.fixture
def gpu(monkeypatch):
    """A visible CUDA GPU of the compute capability the test sets; torch's own bf16 test
    answers yes, as it does by default for GPUs that only emulate bf16."""
    state = {"capability": (8, 0)}
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: state["capability"])
    monkeypatch.setattr(torch.cuda, "is_bf16_supported", lambda including_emulation=True: True)
    monkeypatch.setattr(torch.version, "hip", None)
    return state


@pytest.mark.parametrize("capability, native", [((7, 0), False), ((7, 5), False), ((8, 0), True), ((9, 0), True)],
                         ids=["V100", "T4", "A100", "H100"])
def test_native_bf16_excludes_emulation(gpu, capability, native):
    gpu["capability"] = capability
    assert native_bf16("cuda") is native and native_bf16("cuda:1") is native
    inference = resolve_precision("auto", "cuda")
    assert inference == (Precision("fp32", autocast=True) if native else Precision("fp32"))
    assert resolve_precision("auto", "cuda", training=True).compute == ("bf16" if native else "fp32")


def test_rocm_gpus_count_as_native(gpu, monkeypatch):
    gpu["capability"] = (9, 0)
    monkeypatch.setattr(torch.version, "hip", "6.2")
    assert native_bf16("cuda")


def test_explicit_requests_and_the_backbones_default(gpu):
    gpu["capability"] = (7, 0)  # no native bf16: auto falls to the backbone's default
    assert resolve_precision("auto", "cuda", default="fp16") == Precision("fp16")
    assert resolve_precision("bf16", "cuda") == Precision("bf16")
    assert resolve_precision("fp16", "cuda:1") == Precision("fp16")
    assert resolve_precision("fp32", "cuda", training=True) == Precision("fp32")
    gpu["capability"] = (8, 6)
    assert resolve_precision("fp32", "cuda") == Precision("fp32")  # asked for: no autocast
    assert resolve_precision("bf16", "cuda", training=True) == Precision("fp32", autocast=True)


@pytest.mark.parametrize("request_, kw, words", [
    ("fp16", {}, "--precision fp16 needs --device cuda"),
    ("fp16", {"training": True}, "--precision fp16: use auto, fp32, bf16"),
    ("half", {}, "--precision half: use auto, fp32, bf16, fp16"),
])
def test_bad_requests_are_one_line(request_, kw, words):
    with pytest.raises(ConfigError) as info:
        resolve_precision(request_, "cpu", **kw)
    assert words in str(info.value) and "\n" not in str(info.value)


def test_this_cpu_keeps_its_decisions(monkeypatch):
    """On CPU the rule is the one every command applied before: native bf16 (AVX512-BF16
    or AMX) means bf16 autocast over fp32 weights for inference and bf16 for training,
    else the backbone's default and fp32."""
    flags = P._cpu_flags()
    native = "avx512_bf16" in flags or "amx_bf16" in flags
    assert native_bf16("cpu") is native
    assert resolve_precision("auto", "cpu") == (Precision("fp32", autocast=True) if native else Precision("fp32"))
    assert resolve_precision("auto", "cpu", training=True).compute == ("bf16" if native else "fp32")
    for have, expected in (({"avx512_bf16"}, True), ({"amx_bf16", "avx2"}, True), ({"avx2", "avx512f"}, False)):
        monkeypatch.setattr(P, "_cpu_flags", lambda have=have: have)
        assert native_bf16("cpu") is expected
        assert resolve_precision("auto", "cpu").autocast is expected
    assert choose_fp32_matmul("cpu") == "ieee"


@pytest.mark.parametrize("env, native", [
    ({}, True),
    ({"ONEDNN_MAX_CPU_ISA": "AVX2"}, False),
    ({"ONEDNN_MAX_CPU_ISA": "avx512_core"}, False),
    ({"ONEDNN_MAX_CPU_ISA": "AVX512_CORE_BF16"}, True),
    ({"ATEN_CPU_CAPABILITY": "avx2"}, False),
    ({"ATEN_CPU_CAPABILITY": "avx512"}, True),
])
def test_a_cpu_held_below_its_bf16_instructions_runs_fp32(monkeypatch, env, native):
    """A process whose oneDNN or ATen kernels are held to AVX2 (as a run that reproduces an
    AVX2-only machine does) would emulate bf16: ``auto`` then means fp32 there too."""
    for key in ("ONEDNN_MAX_CPU_ISA", "ATEN_CPU_CAPABILITY"):
        monkeypatch.delenv(key, raising=False)
    for key, value in env.items():
        monkeypatch.setenv(key, value)
    monkeypatch.setattr(P, "_cpu_flags", lambda: {"avx2", "avx512f", "avx512_bf16"})
    assert native_bf16("cpu") is native
    assert resolve_precision("auto", "cpu", training=True).compute == ("bf16" if native else "fp32")


def test_create_backbone_records_the_resolved_precision(monkeypatch):
    from pathtwt.models.registry import create_backbone

    monkeypatch.setattr(P, "_cpu_flags", lambda: {"avx512_bf16"})
    auto = create_backbone("vit-s14-tiny", pretrained=False, device="cpu", precision="auto")
    assert auto.precision == "fp32" and auto.bf16_autocast and auto.fp32_matmul == "ieee"
    assert next(auto.model.parameters()).dtype == torch.float32
    cast = create_backbone("vit-s14-tiny", pretrained=False, device="cpu", precision="bf16")
    assert cast.precision == "bf16" and not cast.bf16_autocast and next(cast.model.parameters()).dtype == torch.bfloat16
    monkeypatch.setattr(P, "_cpu_flags", lambda: set())
    assert not create_backbone("vit-s14-tiny", pretrained=False, device="cpu", precision="auto").bf16_autocast


@pytest.fixture
def tf32_flags():
    """torch's TF32 switches as (matmul, convolution), restored after the test through the
    API pathtwt sets them with (which keeps torch's two records of them agreeing)."""
    matmul, cudnn = torch.backends.cuda.matmul, torch.backends.cudnn
    saved = (matmul.allow_tf32, cudnn.allow_tf32)
    if hasattr(matmul, "fp32_precision"):
        yield lambda: (matmul.fp32_precision, cudnn.conv.fp32_precision)
    else:
        yield lambda: ("tf32" if matmul.allow_tf32 else "ieee", "tf32" if cudnn.allow_tf32 else "ieee")
    matmul.allow_tf32, cudnn.allow_tf32 = saved


def test_tf32_is_chosen_explicitly_on_gpus_that_have_it(gpu, tf32_flags):
    before = tf32_flags()
    gpu["capability"] = (7, 0)
    assert choose_fp32_matmul("cuda") == "ieee" and tf32_flags() == before
    gpu["capability"] = (8, 0)
    assert choose_fp32_matmul("cuda:1") == "tf32" and tf32_flags() == ("tf32", "tf32")


@pytest.mark.parametrize("mode", ["tf32", "ieee"])
def test_the_tf32_switch_leaves_every_reader_of_it_working(gpu, tf32_flags, monkeypatch, mode):
    """torch >= 2.9 raises "mix of the legacy and new APIs" from the legacy getters once
    ``fp32_precision`` alone was set; torch.compile's inductor and dynamo call them
    (torch.get_float32_matmul_precision, torch._C._get_cublas_allow_tf32). Every getter,
    old and new, reads the mode pathtwt chose."""
    import pathtwt.models.precision as precision

    monkeypatch.setattr(precision, "_pinned_fp32_matmul", None)
    gpu["capability"] = (9, 0)
    if mode == "ieee":
        precision.pin_fp32_matmul("ieee")
    assert choose_fp32_matmul("cuda:0") == mode
    tf32 = mode == "tf32"
    assert torch.get_float32_matmul_precision() == ("high" if tf32 else "highest")
    assert torch.backends.cuda.matmul.allow_tf32 is tf32 and torch._C._get_cublas_allow_tf32() is tf32
    assert torch.backends.cudnn.allow_tf32 is tf32
    assert tf32_flags()[0] == mode and precision.fp32_matmul_in_effect("cuda:0")["matmul"] == mode
    assert precision.fp32_matmul_in_effect("cpu") == {"matmul": "ieee", "conv": "ieee"}


def test_a_pinned_fp32_mode_outlasts_the_backbones_built_after_it(gpu, tf32_flags, monkeypatch):
    """device_check pins ieee so its fp32 rows are fp32: a later create_backbone (which
    chooses TF32 on capability 8.0) must neither flip it back nor mix torch's two APIs."""
    import pathtwt.models.precision as precision

    monkeypatch.setattr(precision, "_pinned_fp32_matmul", None)
    gpu["capability"] = (9, 0)
    precision.pin_fp32_matmul("ieee")
    assert choose_fp32_matmul("cuda:0") == "ieee" and "tf32" not in tf32_flags()
    assert precision.fp32_matmul_in_effect("cuda:0") == {"matmul": "ieee", "conv": "ieee"}
    with pytest.raises(ValueError):
        precision.pin_fp32_matmul("fast")


def test_the_distillation_record_says_tf32_only_where_it_ran():
    from pathtwt.compress.calibration import CalibrationSet  # noqa: F401 - the record's companion
    from pathtwt.compress.distill import DistillResult
    from pathtwt.compress.pipeline import distillation_record

    class Calib:
        def training_record(self):
            return {"source": "in-memory", "tiles": 4}

    run = DistillResult(steps_done=1, total_steps=1, completed=True, resumed_from=0, fp32_matmul="tf32")
    assert distillation_record(run, Calib())["fp32_matmul"] == "tf32"
    run.fp32_matmul = "ieee"
    assert "fp32_matmul" not in distillation_record(run, Calib())  # CPU model.json as before


# ---- one resolver, one guard module -------------------------------------------------------

def _calls_and_defs(path: Path) -> tuple[set[str], set[str]]:
    tree = ast.parse(path.read_text())
    defs = {n.name for n in ast.walk(tree) if isinstance(n, (ast.FunctionDef, ast.ClassDef))}
    calls = set()
    for n in ast.walk(tree):
        if isinstance(n, ast.Call):
            f = n.func
            calls.add(f.attr if isinstance(f, ast.Attribute) else getattr(f, "id", ""))
    return calls, defs


def test_one_precision_resolver_and_one_bf16_guard_module():
    """Only pathtwt.models.precision asks the hardware about bf16 or decides what "auto"
    means; every command goes through it; the bf16 guards live in one module."""
    users = set()
    for path in PACKAGE.rglob("*.py"):
        rel = path.relative_to(PACKAGE).as_posix()
        calls, defs = _calls_and_defs(path)
        text = path.read_text()
        if rel != "models/precision.py":
            assert "is_bf16_supported" not in calls and "native_bf16" not in calls, rel
            assert not {"native_bf16", "resolve_training_precision", "resolve_precision"} & defs, rel
            assert 'precision == "auto"' not in text, rel  # what auto means is decided in one place
        if rel != "models/bf16_guard.py":  # inference's guard and the CPU attention switch
            assert not {"check_bf16_on", "explicit_attention", "AutoPrecision"} & defs, rel
        if rel != "compress/bf16_step.py":  # distillation's guard
            assert not {"check_bf16_first_step", "first_step_precision"} & defs, rel
        if "resolve_precision(" in text and rel != "models/precision.py":
            users.add(rel)
    assert {"models/registry.py", "cli/compress.py"} <= users
    assert "compress/distill.py" not in users  # a run's precision is resolved once, where it starts
    for gone in ("models/cpu_attention.py", "compress/bf16_check.py", "compress/autocast.py"):
        assert not (PACKAGE / gone).exists()
    # where a run's bf16 autocast is read off its backbone: extraction's (extract and predict
    # build it in features/backbone.py) and the probe's
    for where in ("features/backbone.py", "cli/probe.py"):
        assert "backbone.bf16_autocast" in (PACKAGE / where).read_text(), where


# ---- distill chooses its teacher-target source once -------------------------------------

@pytest.fixture(scope="module")
def tiny():
    from pathtwt.compress.intermediates import iter_layer_outputs
    from pathtwt.models.registry import create_backbone

    teacher = create_backbone("vit-s14-tiny", pretrained=False, init_seed=1, precision="fp32")
    tiles = np.random.default_rng(0).integers(0, 256, size=(4, 56, 56, 3), dtype=np.uint8)
    parts = list(iter_layer_outputs(teacher.model, teacher.transform, tiles, batch_size=4, with_input=True))
    outputs = [torch.cat(col).cpu() for col in zip(*parts)]
    return teacher, tiles, outputs


@pytest.mark.parametrize("case, expected", [
    ("shared", "shared outputs"), ("no outputs", "target cache"), ("augment", "teacher pass per step"),
    ("over the limit", "teacher pass per step"),
])
def test_distill_estimates_the_targets_once_before_the_bf16_check(tiny, monkeypatch, case, expected):
    from pathtwt.compress import distill as D
    from pathtwt.compress import targets as T
    from pathtwt.compress.student import clone_layers, stitch_student

    teacher, tiles, outputs = tiny
    order, sources = [], []
    real_estimate, real_source, real_check = T.estimate_target_bytes, D.target_source, D.first_step_precision

    def estimate(*a, **k):
        order.append("estimate")
        return real_estimate(*a, **k)

    def source(*a, **k):
        sources.append(real_source(*a, **k))
        return sources[-1]

    def check(*a, **k):
        order.append("bf16 check")
        return real_check(*a, **k)

    monkeypatch.setattr(T, "estimate_target_bytes", estimate)
    monkeypatch.setattr(D, "target_source", source)
    monkeypatch.setattr(D, "first_step_precision", check)
    student = stitch_student(teacher.model, clone_layers(teacher.model, [5, 11]), spec=teacher.spec)
    options = D.DistillOptions(steps=1, batch_size=2, precision="bf16", augment=case == "augment", progress=False,
                               cache_limit_bytes=1 if case == "over the limit" else 4 * 2**30)
    run = D.distill(student, teacher.model, tiles, transform=teacher.transform, objective=D.DeepSupervision([6, 12]),
                    options=options, teacher_outputs=None if case == "no outputs" else outputs)
    assert run.completed and sources == [expected]
    assert order == (["bf16 check"] if case == "augment" else ["estimate", "bf16 check"])


def test_distill_takes_the_resolved_precision_only(tiny):
    # "auto" is decided once where a run starts; the loop refuses a request it would have
    # to resolve a second time
    from pathtwt.compress import distill as D
    from pathtwt.compress.student import clone_layers, stitch_student
    from pathtwt.errors import PathtwtError

    teacher, tiles, _ = tiny
    student = stitch_student(teacher.model, clone_layers(teacher.model, [5, 11]), spec=teacher.spec)
    with pytest.raises(PathtwtError, match="resolved precision, one of fp32, bf16"):
        D.distill(student, teacher.model, tiles, transform=teacher.transform, objective=D.DeepSupervision([6, 12]),
                  options=D.DistillOptions(steps=1, batch_size=2, precision="auto", progress=False))
