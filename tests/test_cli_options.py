"""The command-line convention (pathtwt/cli/options.py), checked on the real parser: it
walks every registered subcommand, nested ones included, so a new subcommand is covered
as soon as it is in pathtwt.cli.COMMANDS."""

from __future__ import annotations

import argparse
import os
from pathlib import Path

import pytest

from pathtwt.cli import COMMANDS, build_parser, main
from pathtwt.cli.options import HelpFormatter, iter_parsers

REPO = Path(__file__).resolve().parents[1]


def _commands():
    parser = build_parser()
    return [(path, p) for path, p in iter_parsers(parser) if path != "pathtwt"]


def _options(parser: argparse.ArgumentParser):
    for action in parser._actions:
        if isinstance(action, (argparse._HelpAction, argparse._VersionAction, argparse._SubParsersAction)):
            continue
        if action.help == argparse.SUPPRESS:
            continue
        yield action


def test_every_registered_subcommand_is_walked():
    walked = {path.split()[1] for path, _ in _commands()}
    assert walked == set(COMMANDS)
    # nested actions are walked too (e.g. pathtwt analyze norms)
    assert any(len(path.split()) == 3 for path, _ in _commands())


@pytest.mark.parametrize("path,parser", _commands(), ids=[path for path, _ in _commands()])
def test_every_option_has_help_and_shows_its_default(path, parser):
    assert parser.formatter_class is HelpFormatter, f"{path}: not built with the shared HelpFormatter"
    formatter = parser._get_formatter()
    # one of a required group of alternatives (--depth | --eps | --plan) has no default
    chosen = {id(a) for g in parser._mutually_exclusive_groups if g.required for a in g._group_actions}
    problems = []
    for action in _options(parser):
        name = "/".join(action.option_strings) or action.dest
        shown = formatter._expand_help(action) if action.help else ""
        needs_default = action.option_strings and not action.required and id(action) not in chosen
        if not shown.strip():
            problems.append(f"{name}: no help")
        elif needs_default and "default" not in shown.lower():
            problems.append(f"{name}: default not shown ({shown!r})")
        if "`" in shown:
            problems.append(f"{name}: RST backticks in help")
    assert not problems, f"{path}: " + "; ".join(problems)
    assert "`" not in parser.format_help()


@pytest.mark.parametrize("path,parser", _commands(), ids=[path for path, _ in _commands()])
def test_device_and_progress_follow_the_convention(path, parser):
    actions = {s: a for a in parser._actions for s in a.option_strings}
    if "--device" in actions:
        device = actions["--device"]
        for good in ("cpu", "cuda", "cuda:1", "auto"):
            assert device.type(good) == good
        with pytest.raises(argparse.ArgumentTypeError, match="cpu, cuda or cuda:N"):
            device.type("gpu0")
    assert "--quiet" not in actions or actions["--quiet"].dest == actions["--no-progress"].dest
    assert "--progress" not in actions


def test_top_level_help_has_no_rst_and_names_the_conventions():
    text = build_parser().format_help()
    assert "`" not in text
    assert "HF_HUB_OFFLINE" in text and "--no-progress" in text
    for name in COMMANDS:
        assert name in text


def test_help_shows_defaults_through_the_console_entry(capsys):
    with pytest.raises(SystemExit) as exc:
        main(["extract", "--help"])
    assert exc.value.code == 0
    out = " ".join(capsys.readouterr().out.split())
    assert "--batch-size N|auto tiles per forward pass (default auto: 32 on a CPU; on a GPU sized from its memory" in out
    assert "--device DEVICE auto (a CUDA or ROCm GPU when one is visible, else cpu), cpu, cuda or cuda:N (default: auto)" in out


def test_quiet_is_a_deprecated_alias_of_no_progress(capsys):
    parser = build_parser(only="extract")
    args = parser.parse_args(["extract", "--backbone", "vit-s14-tiny", "--quiet"])
    assert args.no_progress is True
    assert "--quiet is deprecated; use --no-progress" in capsys.readouterr().err
    assert build_parser(only="extract").parse_args(["extract", "--backbone", "x"]).no_progress is False


def test_bad_device_is_one_line(capsys):
    with pytest.raises(SystemExit) as exc:
        main(["train-mil", "--features", "f", "--labels", "l", "--protocol", "grading", "--out", "o", "--device", "gpu"])
    assert exc.value.code == 2
    assert "argument --device: --device gpu: expected auto" in capsys.readouterr().err


def test_hf_hub_offline_is_honoured(monkeypatch):
    from pathtwt.models.weights import hub_offline

    for var in ("HF_HUB_OFFLINE", "PATHTWT_OFFLINE"):
        monkeypatch.delenv(var, raising=False)
    assert not hub_offline()
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    assert hub_offline()
    monkeypatch.setenv("HF_HUB_OFFLINE", "0")
    assert not hub_offline()
    monkeypatch.delenv("HF_HUB_OFFLINE")
    monkeypatch.setenv("PATHTWT_OFFLINE", "1")  # the older name, kept as an alias
    assert hub_offline()


def test_miopen_cache_goes_to_node_local_storage(monkeypatch, tmp_path):
    import torch

    from pathtwt.devices import use_node_local_miopen_cache

    monkeypatch.setenv("TMPDIR", str(tmp_path))
    monkeypatch.delenv("MIOPEN_USER_DB_PATH", raising=False)
    monkeypatch.setenv("MIOPEN_CUSTOM_CACHE_DIR", "/mine")  # a user's own choice stays
    chosen = use_node_local_miopen_cache()
    assert chosen == {"MIOPEN_USER_DB_PATH": str(tmp_path / f"miopen-{os.getuid()}")}
    assert os.environ["MIOPEN_CUSTOM_CACHE_DIR"] == "/mine" and (tmp_path / f"miopen-{os.getuid()}").is_dir()
    # resolve_device sets them on a ROCm build before the first kernel
    from pathtwt.devices import resolve_device

    monkeypatch.delenv("MIOPEN_USER_DB_PATH")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    monkeypatch.setattr(torch.version, "hip", "6.2", raising=False)
    assert resolve_device("cuda") == "cuda"
    assert os.environ["MIOPEN_USER_DB_PATH"].startswith(str(tmp_path))


def test_available_cores_follow_slurm(monkeypatch):
    from pathtwt.devices import available_cores

    monkeypatch.setenv("SLURM_CPUS_PER_TASK", "7")
    assert available_cores() == 7
    monkeypatch.delenv("SLURM_CPUS_PER_TASK")
    assert available_cores() == len(os.sched_getaffinity(0))


def test_help_states_the_real_defaults(capsys):
    """train-mil's protocol overrides show the presets' values, tile's filter its defaults."""
    from pathtwt.mil.protocols import PROTOCOLS
    from pathtwt.wsi.tiling import DEFAULT_MIN_TISSUE

    parsers = dict(_commands())
    mil = {a.dest: a.help for a in parsers["pathtwt train-mil"]._actions}
    g, m = PROTOCOLS["grading"], PROTOCOLS["metastasis"]
    assert f"grading {g.epochs}, metastasis {m.epochs}" in mil["epochs"]
    assert f"default {g.accumulation}" in mil["accumulation"]
    assert not any("the preset's" in (h or "") for h in mil.values())
    tile = {a.dest: a for a in parsers["pathtwt tile"]._actions}
    assert tile["tissue"].default == "fraction" and "(default: fraction)" in tile["tissue"].help
    assert f"{DEFAULT_MIN_TISSUE['otsu']} with --tissue otsu" in tile["min_tissue"].help
