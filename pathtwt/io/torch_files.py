"""Loading the project's own ``.pt`` files (MIL checkpoints and resume states) without
ever unpickling code.

``torch.load(weights_only=True)`` accepts tensors, numbers, strings and plain
containers only, so a file dropped into an output folder cannot run anything when a
run resumes. Everything pathtwt saves in these files is of that kind (random-number
states are derived from the seed, not pickled). A refusal is one line naming the file.
"""

from __future__ import annotations

import os
import pickle
from typing import Any

from pathtwt.errors import PathtwtError


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {text[0] if text else ''}".rstrip(": ")


def load_torch_file(path: str | os.PathLike, *, remedy: str) -> Any:
    """The contents of a ``torch.save`` file holding only tensors and plain data.
    Raises :class:`PathtwtError` (one line ending with ``remedy``) when the file holds
    other Python objects or cannot be read."""
    import torch

    try:
        return torch.load(path, map_location="cpu", weights_only=True)
    except pickle.UnpicklingError as exc:
        raise PathtwtError(
            f"{path}: refused: it holds Python objects other than tensors and plain data, which could run code "
            f"when loaded ({_first_line(exc)}); pathtwt never writes such files: {remedy}"
        ) from None
    except Exception as exc:  # noqa: BLE001 - truncated zip, not a torch file, ...: say which file
        raise PathtwtError(f"{path}: cannot read it ({_first_line(exc)}); {remedy}") from None
