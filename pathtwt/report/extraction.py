"""How each backbone variant was run: the precision its tile features were extracted in
and its extraction throughput, read from the root attributes of its features files
(``results/features/{backbone}/{variant}/{cohort}/{slide}.h5``), and the precision it was
distilled in (``model.json``).

Throughput is a measurement only with its conditions: each cohort's extraction (one job
per variant and cohort in the workflow's default) gives one tiles/s, and a variant's
figure is the median of those jobs, on the device and CPU threads the files record. A
variant timed in one job only, or variants timed on different devices or threads, are
said to be not comparable: one job's time depends on whatever else ran on the machine,
and must not rank variants."""

from __future__ import annotations

import json
import statistics
from dataclasses import dataclass
from pathlib import Path
from typing import Iterable

# a variant's tiles/s is a median over at least this many extraction jobs, or not comparable
MIN_JOBS = 2


@dataclass(frozen=True)
class Extraction:
    precision: str  # "fp32", "bf16-autocast", ...; several joined with "/"; "-" when unknown
    jobs: tuple[float, ...] = ()  # tiles/s of each timed extraction job (one per cohort), sorted
    n_files: int = 0
    threads: tuple[int, ...] = ()  # the CPU threads the files were extracted with (torch_threads), sorted
    devices: tuple[str, ...] = ()  # the GPU's name, or the torch device ("cpu"), sorted

    @property
    def tiles_per_second(self) -> float | None:
        """The median over the jobs (None when nothing was timed)."""
        return statistics.median(self.jobs) if self.jobs else None

    @property
    def conditions(self) -> tuple[tuple[str, ...], tuple[int, ...]]:
        return self.devices, self.threads


def extraction_info(results: Path, backbone: str, variant: str) -> Extraction:
    """Precision(s), and tiles/s of each cohort's extraction, of every features file of the variant."""
    from pathtwt.features.throughput import extraction_throughput

    precisions: list[str] = []
    jobs, threads, devices, n_files = [], set(), set(), 0
    for cohort in sorted(p for p in (results / "features" / backbone / variant).glob("[!.]*") if p.is_dir()):
        job = extraction_throughput([cohort])
        precisions += [p for p in job["precisions"] if p not in precisions]
        n_files += job["slides"] + job["untimed"]
        if job["tiles_per_s"] is not None:
            jobs.append(job["tiles_per_s"])
            threads.update(job["threads"])
            devices.update(job["devices"])
    return Extraction(precision="/".join(precisions) or "-", jobs=tuple(sorted(jobs)), n_files=n_files,
                      threads=tuple(sorted(threads)), devices=tuple(sorted(devices)))


def throughput_comparable(infos: Iterable[Extraction]) -> tuple[bool, str]:
    """Whether the timed variants' tiles/s compare, and if not, why (one clause)."""
    timed = [i for i in infos if i.jobs]
    if any(len(i.jobs) < MIN_JOBS for i in timed):
        return False, "a variant was timed in a single extraction job"
    if any(not i.devices or not i.threads for i in timed):
        return False, "the features files do not record the device or the CPU threads"
    if len({i.conditions for i in timed}) > 1:
        return False, "the variants were extracted on different devices or CPU threads"
    return True, ""


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
