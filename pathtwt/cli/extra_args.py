"""The check of a workflow config's ``extra_args`` (the escape hatch for flags without a
config key): every flag must be one that the subcommand the section runs has, so a typo
stops check-config (and the Snakefile) instead of the job."""

from __future__ import annotations

import argparse
import shlex
from typing import Any, Mapping

# config section -> the subcommand its extra_args are appended to
EXTRA_ARGS_COMMANDS = {"compress": "compress", "mil": "train-mil"}


def command_flags(command: str) -> set[str]:
    """Every option string of ``pathtwt COMMAND`` (built without importing torch)."""
    import importlib

    from pathtwt.cli import COMMANDS

    parser = argparse.ArgumentParser(add_help=False)
    importlib.import_module(f"pathtwt.cli.{COMMANDS[command]}").add_arguments(parser)
    return {s for action in parser._actions for s in action.option_strings}


def check_extra_args(config: Mapping[str, Any], *, source: str) -> None:
    """Raise ConfigError, in one line naming the key, for a flag of ``compress.extra_args``
    or ``mil.extra_args`` that the subcommand does not have."""
    from pathtwt.errors import ConfigError

    for section, command in EXTRA_ARGS_COMMANDS.items():
        text = str((config.get(section) or {}).get("extra_args") or "")
        try:
            words = shlex.split(text)
        except ValueError as exc:
            raise ConfigError(f"{source}: key {section}.extra_args: {text!r} is not a shell word list ({exc})") from None
        flags = [w.split("=", 1)[0] for w in words if w.startswith("-") and not _is_number(w)]
        if not flags:
            continue
        known = command_flags(command)
        unknown = [f for f in flags if f not in known]
        if unknown:
            raise ConfigError(
                f"{source}: key {section}.extra_args: {', '.join(unknown)} is not a flag of pathtwt {command}; "
                f"fix it (see pathtwt {command} --help) or use the {section} key of that name"
            )


def _is_number(word: str) -> bool:
    try:
        float(word)
    except ValueError:
        return False
    return True
