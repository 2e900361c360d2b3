"""How each backbone variant was run: the precision its tile features were extracted in
and its extraction throughput, read from the root attributes of its features files
(``results/features/{backbone}/{variant}/{cohort}/{slide}.h5``), and the precision it was
distilled in (``model.json``)."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path


@dataclass
class Extraction:
    precision: str  # "fp32", "bf16-autocast", ...; several joined with "/"; "-" when unknown
    tiles_per_second: float | None  # mean over slides weighted by their tiles; None when not recorded
    n_files: int
    threads: tuple[int, ...] = ()  # the CPU threads the files were extracted with (torch_threads), sorted


def extraction_info(results: Path, backbone: str, variant: str) -> Extraction:
    """Precision(s) and weighted mean tiles/s over every features file of the variant."""
    import h5py

    precisions: list[str] = []
    threads: set[int] = set()
    weighted, tiles, n_files = 0.0, 0, 0
    for path in sorted((results / "features" / backbone / variant).glob("*/[!.]*.h5")):
        try:
            with h5py.File(path, "r") as h5:
                attrs = h5.attrs
                n_files += 1
                p = attrs.get("precision")
                if p is not None:
                    p = p.decode() if isinstance(p, bytes) else str(p)
                    if p not in precisions:
                        precisions.append(p)
                if attrs.get("torch_threads") is not None:
                    threads.add(int(attrs["torch_threads"]))
                n = int(attrs.get("n_tiles", h5["features"].shape[0] if "features" in h5 else 0))
                # extraction records its wall seconds (reading + forward) per slide
                rate = attrs.get("tiles_per_second")
                seconds = attrs.get("extract_seconds")
                if rate is None and seconds is not None and float(seconds) > 0:
                    rate = n / float(seconds)
                if rate is not None and n > 0 and float(rate) > 0:
                    weighted += float(rate) * n
                    tiles += n
        except OSError:
            continue  # an unreadable file is the extract job's problem, not the report's
    return Extraction(precision="/".join(precisions) or "-", tiles_per_second=weighted / tiles if tiles else None,
                      n_files=n_files, threads=tuple(sorted(threads)))


def distill_precision(results: Path, backbone: str, variant: str) -> str:
    """The distillation's precision from model.json ("-" for a variant that was not distilled)."""
    path = results / "models" / backbone / variant / "model.json"
    if not path.is_file():
        return "-"
    try:
        meta = json.loads(path.read_text())
    except (OSError, json.JSONDecodeError):
        return "-"
    distillation = meta.get("distillation") or {}
    if "precision" in distillation:  # what the loop trained in, after its bf16 check
        return str(distillation["precision"] or "-")
    # model.json files written before the loop recorded it: the precision asked for
    options = (meta.get("provenance") or {}).get("options") or {}
    value = (options.get("distill") or {}).get("precision") or options.get("precision") or meta.get("precision")
    return str(value) if value else "-"
