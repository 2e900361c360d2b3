"""Errors meant for the user: one line that names the file, slide or config key and what
to do. The command line prints them without a traceback; anything else is a bug."""


class PathtwtError(Exception):
    """A problem with the user's input or environment, explained in one line."""


class SlideError(PathtwtError):
    """A slide cannot be opened, decoded, or lacks the metadata a stage needs."""


class ConfigError(PathtwtError):
    """A configuration file or label table is invalid."""


class WeightsError(PathtwtError):
    """Backbone weights are missing or do not fit the architecture."""


class NumericsError(PathtwtError):
    """NaN or infinite values appeared in features or a loss."""


class OutputError(PathtwtError):
    """An output cannot be written: the disk or a quota is full, or the folder is read-only."""


class StoreError(PathtwtError):
    """A store entry is missing, refused (its record disagrees with its key) or cannot be made."""


def first_line(exc: BaseException) -> str:
    """The first line of ``exc``'s message, or its type's name when the message is empty."""
    text = str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__
