"""Entry keys: a sha256 of an entry's kind, the format of what it holds and its inputs, as
canonical JSON (sorted keys, no spaces, every number as a float so that ``1`` and ``1.0``
in two configs give one key).

A kind's format is bumped when the code that makes it changes what it makes (a tiling fix,
a new attribute every reader needs): older entries then no longer match any key and are
made again, never reused by mistake.
"""

from __future__ import annotations

import hashlib
import json
from typing import Any, Mapping

# kind -> the format its entries hold; a new format gives every entry of the kind a new key
FORMATS = {
    "tiles": "pathtwt-tiles/1",
    "calibration": "pathtwt-calibration/1",
    "discovery": "pathtwt-discovery/1",
    "model": "pathtwt-model/1",
    "teacher": "pathtwt-teacher/1",
    "extractor": "pathtwt-features/1",
    "features-set": "pathtwt-features-set/1",
}
# hex digits of a key: 96 bits, no collision among billions of entries
KEY_CHARS = 24
KEY_PATTERN = rf"[0-9a-f]{{{KEY_CHARS}}}"


def _normalised(value: Any) -> Any:
    if isinstance(value, bool) or value is None or isinstance(value, str):
        return value
    if isinstance(value, (int, float)):
        return float(value)
    if isinstance(value, Mapping):
        return {str(k): _normalised(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_normalised(v) for v in value]
    raise TypeError(f"a key input must be JSON data, not {type(value).__name__}")


def canonical(value: Any) -> str:
    """``value`` as the one JSON text every equal value gives."""
    return json.dumps(_normalised(value), sort_keys=True, separators=(",", ":"), ensure_ascii=True)


def entry_key(kind: str, inputs: Mapping[str, Any]) -> str:
    """The key of an entry of ``kind`` made from ``inputs``."""
    if kind not in FORMATS:
        raise ValueError(f"unknown store kind {kind!r}")
    blob = canonical({"kind": kind, "format": FORMATS[kind], "inputs": inputs})
    return hashlib.sha256(blob.encode("ascii")).hexdigest()[:KEY_CHARS]
