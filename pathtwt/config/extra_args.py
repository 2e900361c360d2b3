"""A workflow config's ``extra_args`` (the escape hatch for flags without a config key):
which subcommand each section's words are appended to, and the check that every flag is
one that subcommand has, so a typo stops check-config (and the Snakefile) instead of the
job.

The flags themselves belong to the command line, which this package's lower layers do
not import: the check takes them as ``flags_of(command)``. ``pathtwt check-config``
passes the parsers' own; the workflow runs ``pathtwt check-config --extra-args`` when a
config uses extra_args (:func:`extra_args_command`).
"""

from __future__ import annotations

import shlex
import sys
from typing import Any, Callable, Mapping

from pathtwt.errors import ConfigError

# config section -> the subcommand its extra_args are appended to
EXTRA_ARGS_COMMANDS = {"compress": "compress", "mil": "train-mil"}


def given(config: Mapping[str, Any]) -> dict[str, str]:
    """section -> its extra_args text, for the sections that have some."""
    texts = {section: str((config.get(section) or {}).get("extra_args") or "") for section in EXTRA_ARGS_COMMANDS}
    return {section: text for section, text in texts.items() if text.strip()}


def check_extra_args(config: Mapping[str, Any], *, source: str, flags_of: Callable[[str], set[str]]) -> None:
    """Raise ConfigError, in one line naming the key, for a flag of ``compress.extra_args``
    or ``mil.extra_args`` that the subcommand (whose option strings ``flags_of`` gives)
    does not have."""
    for section, text in given(config).items():
        command = EXTRA_ARGS_COMMANDS[section]
        try:
            words = shlex.split(text)
        except ValueError as exc:
            raise ConfigError(f"{source}: key {section}.extra_args: {text!r} is not a shell word list ({exc})") from None
        flags = [w.split("=", 1)[0] for w in words if w.startswith("-") and not _is_number(w)]
        if not flags:
            continue
        known = flags_of(command)
        unknown = [f for f in flags if f not in known]
        if unknown:
            raise ConfigError(
                f"{source}: key {section}.extra_args: {', '.join(unknown)} is not a flag of pathtwt {command}; "
                f"fix it (see pathtwt {command} --help) or use the {section} key of that name"
            )


def extra_args_command(config: Mapping[str, Any], *, source: str) -> list[str]:
    """The command that checks the config's extra_args with the command line's own flags
    (``pathtwt check-config --extra-args``), or [] when the config has none."""
    texts = given(config)
    if not texts:
        return []
    command = [sys.executable, "-m", "pathtwt", "check-config", "--source", source]
    for section, text in texts.items():
        command += ["--extra-args", f"{section}={text}"]
    return command


def _is_number(word: str) -> bool:
    try:
        float(word)
    except ValueError:
        return False
    return True
