"""One table of defaults per stage, read by the workflow schema, the subcommands' flags and
the option dataclasses: here all of them are compared, so a default changed in one place
only fails. Also: the shipped configs use keys, not extra_args, and check-config refuses an
unknown flag in extra_args in one line naming the key."""

from __future__ import annotations

import argparse
import dataclasses
from pathlib import Path

import pytest

from pathtwt.compress.defaults import COMPRESS_DEFAULTS
from pathtwt.config.check import MIL_OVERRIDES, SCHEMA_COMPRESS_KEYS, load_schema, load_yaml, validate_schema
from pathtwt.errors import ConfigError

REPO = Path(__file__).resolve().parents[1]
SCHEMA = load_schema()["properties"]


def _defaults(command: str) -> dict:
    """dest -> default of every option of ``pathtwt COMMAND``."""
    import importlib

    from pathtwt.cli import COMMANDS

    parser = argparse.ArgumentParser(add_help=False)
    importlib.import_module(f"pathtwt.cli.{COMMANDS[command]}").add_arguments(parser)
    return {a.dest: a.default for a in parser._actions if a.option_strings}


def _schema_defaults(section: str) -> dict:
    return {k: v["default"] for k, v in SCHEMA[section]["properties"].items()}


def test_compress_defaults_are_one_table():
    table = dataclasses.asdict(COMPRESS_DEFAULTS)
    cli = _defaults("compress")
    assert {k: cli[k] for k in table} == table
    schema = _schema_defaults("compress")
    assert {k: schema[k] for k in SCHEMA_COMPRESS_KEYS} == {k: table[k] for k in SCHEMA_COMPRESS_KEYS}

    from pathtwt.compress.distill import DistillOptions
    from pathtwt.compress.pipeline import CompressOptions

    distill = {f.name: f.default for f in dataclasses.fields(DistillOptions)}
    # DistillOptions.precision is the resolved autocast (fp32 | bf16), not the request
    shared = {k for k in table if k in distill} - {"precision"}
    assert shared >= {"steps", "epochs", "batch_size", "accumulate", "lr", "warmup_steps", "augment", "loss_norm", "seed"}
    assert {k: distill[k] for k in shared} == {k: table[k] for k in shared}
    options = CompressOptions(out=Path("x"))
    # holdout is the calibration draw's (load_calibration), rank_timeout the process group's
    # (pathtwt.compress.ranks.init_from_env): neither is an option of the method
    own = [k for k in table if k not in ("precision", "holdout", "rank_timeout")]
    # each from the object that holds it: the method's settings, or its distillation's
    held = {k: getattr(options, k) if k in CompressOptions.__dataclass_fields__ else getattr(options.distill, k)
            for k in own}
    assert held == {k: table[k] for k in own}
    # nothing reads the distillation's settings through the method's object
    assert not hasattr(options, "steps") and not hasattr(options, "batch_size")


def test_the_disagreements_are_resolved():
    # batch_size 32 (the workflow said 64), one epoch (it said 2000 steps), loss_norm
    # variance (DistillOptions said none): see pathtwt/compress/defaults.py
    from pathtwt.compress.distill import DistillOptions

    schema = _schema_defaults("compress")
    assert schema["batch_size"] == _defaults("compress")["batch_size"] == DistillOptions().batch_size == 32
    assert schema["steps"] is None and schema["epochs"] is None and DistillOptions().resolved_steps(640) == 20
    assert DistillOptions().loss_norm == _defaults("compress")["loss_norm"] == schema["loss_norm"] == "variance"


def test_forward_pass_defaults_are_the_subcommands():
    discover, extract = _defaults("discover"), _defaults("extract")
    assert _schema_defaults("discovery")["batch_size"] == discover["batch_size"]
    assert _schema_defaults("discovery")["tokens"] == discover["tokens"] == COMPRESS_DEFAULTS.tokens
    assert _schema_defaults("extract")["batch_size"] == extract["batch_size"]


def test_mil_keys_override_the_protocol_preset():
    from pathtwt.mil.protocols import MILConfig

    cli = _defaults("train-mil")
    schema = _schema_defaults("mil")
    fields = {f.name for f in dataclasses.fields(MILConfig)}
    for key, flag in MIL_OVERRIDES.items():
        dest = flag.lstrip("-").replace("-", "_")
        # null in the config and no flag on the command line: the protocol's preset
        assert schema[key] is None and cli[dest] is None and dest in fields, key


@pytest.mark.parametrize("section", ["compress", "discovery", "extract", "mil", "calibration", "report", "analysis"])
def test_every_key_has_a_type_description_and_default(section):
    for key, node in SCHEMA[section]["properties"].items():
        assert "type" in node and node.get("description", "").strip() and "default" in node, f"{section}.{key}"


@pytest.mark.parametrize("config", sorted(p.name for p in (REPO / "config").glob("*.yaml")))
def test_shipped_configs_use_keys_not_extra_args(config):
    data = load_yaml(REPO / "config" / config) or {}
    for section in ("compress", "mil"):
        assert not (data.get(section) or {}).get("extra_args"), f"{config}: {section}.extra_args"


def test_the_demo_config_gives_the_commands_its_settings():
    config = validate_schema(load_yaml(REPO / "config" / "config.yaml"), source="config.yaml")
    assert config["compress"]["audition_steps"] == 5 and config["compress"]["augment"] is False
    assert (config["mil"]["accumulation"], config["mil"]["hidden_dim"], config["mil"]["transmil_heads"],
            config["mil"]["landmarks"]) == (1, 128, 4, 16)


def check_extra_args(config, source):
    """The check as `pathtwt check-config` runs it, with the parsers' own flags."""
    from pathtwt.cli.check_config import command_flags
    from pathtwt.config.extra_args import check_extra_args

    check_extra_args(config, source=source, flags_of=command_flags)


def test_check_config_refuses_an_unknown_extra_args_flag():

    config = validate_schema({"compress": {"extra_args": "--workers 0 --audition-step=5"},
                              "mil": {"extra_args": "--lr 2e-4 --dropout 0.1"}}, source="c.yaml")
    with pytest.raises(ConfigError) as err:
        check_extra_args(config, source="c.yaml")
    message = str(err.value)
    assert "\n" not in message and "key compress.extra_args" in message and "--audition-step" in message
    assert "--workers" not in message.split(":", 2)[2]
    config["compress"]["extra_args"] = "--workers 0 --audition-steps 5"
    check_extra_args(config, source="c.yaml")  # known flags, and negative numbers are values
    config["mil"]["extra_args"] = "--lr -1 --hiden-dim 64"
    with pytest.raises(ConfigError, match=r"key mil.extra_args: --hiden-dim is not a flag of pathtwt train-mil"):
        check_extra_args(config, source="c.yaml")


def test_check_config_command_refuses_it(tmp_path, capsys):
    from pathtwt.cli import main

    bad = tmp_path / "bad.yaml"
    bad.write_text('compress:\n  extra_args: "--augmentation off"\n')
    assert main(["check-config", "--no-slides", str(REPO / "config" / "config.yaml"), str(bad)]) != 0
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "compress.extra_args: --augmentation is not a flag" in err
    # the form the workflow runs: only the words, with the config named
    assert main(["check-config", "--source", "study.yaml", "--extra-args", "mil=--lr 1e-4 --hiden-dim 8"]) == 1
    err = capsys.readouterr().err.strip()
    assert err.endswith("study.yaml: key mil.extra_args: --hiden-dim is not a flag of pathtwt train-mil; fix it "
                        "(see pathtwt train-mil --help) or use the mil key of that name")
    assert main(["check-config", "--extra-args", "mil=--lr 1e-4 --hidden-dim 8"]) == 0


def test_the_decode_key_is_the_commands_flag():
    # extract.decode in the config and `pathtwt extract --decode` offer the same choices
    # (pathtwt.features.decoding's) and default
    import argparse

    from pathtwt.cli import extract
    from pathtwt.features.decoding import DECODE_CHOICES

    parser = argparse.ArgumentParser()
    extract.add_arguments(parser)
    flag = next(a for a in parser._actions if a.dest == "decode")
    node = SCHEMA["extract"]["properties"]["decode"]
    assert tuple(flag.choices) == tuple(node["enum"]) == DECODE_CHOICES
    assert flag.default == node["default"] == _defaults("extract")["decode"]


def test_extract_defaults_are_one_table():
    # pathtwt extract's flags, the options object and the schema's extract section read
    # pathtwt.features.options.EXTRACT_DEFAULTS; a GPU's batch is sized from the device
    from pathtwt.features.options import EXTRACT_DEFAULTS, ExtractOptions

    table = dataclasses.asdict(EXTRACT_DEFAULTS)
    assert table == {"batch_size": None, "decode": "auto", "device": "auto", "precision": "auto", "embedding": "cls+mean"}
    cli = _defaults("extract")
    assert {k: cli[k] for k in table} == table
    assert {k: _schema_defaults("extract")[k] for k in table} == table
    options = ExtractOptions()
    assert options.batch_size == table["batch_size"] and options.decode == table["decode"]
    assert options.embedding == table["embedding"]
    assert options.resolved_batch_size("cpu") == 32
    assert ExtractOptions(batch_size=7).resolved_batch_size("cuda:0") == 7


def test_the_precision_and_embedding_keys_are_the_commands_flags():
    # extract.precision and extract.embedding (part of the features' store key) offer what
    # `pathtwt extract --precision/--embedding` takes, with its defaults
    from pathtwt.cli import extract

    parser = argparse.ArgumentParser()
    extract.add_arguments(parser)
    for key in ("precision", "embedding"):
        flag = next(a for a in parser._actions if a.dest == key)
        node = SCHEMA["extract"]["properties"][key]
        assert tuple(flag.choices) == tuple(node["enum"]) and flag.default == node["default"], key
