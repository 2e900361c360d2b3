"""`pathtwt check-config` reads every labelled slide before any job runs
(:func:`pathtwt.wsi.slide_check.check_slide`: opened, tiled, one tile read at the level
extraction reads), in parallel processes and through a cache keyed by each slide's
fingerprint, so a cohort checked before costs a hash of 2 MiB per slide. A slide that
would fail its tile or extraction job is refused here, by name and with its reader's
reason (or, where the cohort records failures, said and left to be recorded); the tiles
found say whether a calibration can draw the tiles it asks for.
"""

from __future__ import annotations

import os
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path
from typing import Any, Mapping

from pathtwt.errors import ConfigError
from pathtwt.wsi.slide_check import TilingSettings, cached_check

CACHE_ENV = "PATHTWT_CACHE_DIR"  # the folder of pathtwt's caches (default: $XDG_CACHE_HOME/pathtwt)
# failing slides named in one error line before it is cut short
LISTED = 3


def cache_root() -> Path:
    """The folder of pathtwt's caches: $PATHTWT_CACHE_DIR, else pathtwt under $XDG_CACHE_HOME (~/.cache)."""
    return Path(os.environ.get(CACHE_ENV) or Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "pathtwt")


def default_cache() -> Path:
    """Where slide checks are kept: slide-checks in :func:`cache_root`."""
    return cache_root() / "slide-checks"


def tiling_settings(config: Mapping[str, Any], cohort: str) -> TilingSettings:
    cfg = config["cohorts"][cohort]
    tiling = cfg["tiling"]
    return TilingSettings(
        target_mpp=float(tiling["target_mpp"]), tile_size=int(tiling["tile_size"]), tissue=tiling["tissue"],
        min_tissue=tiling.get("min_tissue"), mpp_fallback=cfg.get("mpp_fallback"),
        channels=tuple(int(c) for c in cfg["channels"]) if cfg.get("channels") else None,
        modality=cfg.get("modality"), allow_upsample=bool(tiling.get("allow_upsample")),
    )


def _check(item: tuple[str, TilingSettings, Path | None]) -> dict[str, Any]:
    path, settings, cache = item
    return cached_check(path, settings, cache)


def read_slides(config: Mapping[str, Any], paths: Mapping[str, Mapping[str, Path]], *, jobs: int | None = None,
                cache: Path | None = None) -> dict[str, dict[str, dict[str, Any]]]:
    """cohort -> slide id -> what :func:`~pathtwt.wsi.slide_check.check_slide` found, for every
    slide of ``paths`` (cohort -> slide id -> file), ``jobs`` slides at a time (default: the CPUs)."""
    items = [(cohort, slide_id, (str(path), tiling_settings(config, cohort), cache))
             for cohort, slides in paths.items() for slide_id, path in slides.items()]
    jobs = max(1, min(jobs or os.cpu_count() or 1, len(items)))
    if jobs == 1:
        found = [_check(item) for _, _, item in items]
    else:
        with ProcessPoolExecutor(max_workers=jobs) as pool:
            found = list(pool.map(_check, [item for _, _, item in items], chunksize=max(1, len(items) // (8 * jobs))))
    out: dict[str, dict[str, dict[str, Any]]] = {cohort: {} for cohort in paths}
    for (cohort, slide_id, _), result in zip(items, found):
        out[cohort][slide_id] = result
    return out


def refuse_unreadable(config: Mapping[str, Any], tables: Mapping[str, Any], found: Mapping[str, Mapping[str, Any]],
                      *, source: str) -> list[str]:
    """Raise one ConfigError line naming the unreadable slides of a cohort whose tiling stops
    on a failure; return a warning per cohort that records them (`tiling.on_failure: record`)."""
    warnings = []
    for cohort, results in found.items():
        table = tables[cohort]
        bad = [f"{table.where(table.slide_ids.index(s))} ({s!r}): {r['error']}"
               for s, r in results.items() if r.get("error")]
        if not bad:
            continue
        shown = "; ".join(bad[:LISTED]) + (f" ... ({len(bad)} in all)" if len(bad) > LISTED else "")
        if config["cohorts"][cohort]["tiling"].get("on_failure") == "record":
            warnings.append(f"{len(bad)} slide(s) of cohorts.{cohort} cannot be read and will be recorded as failed "
                            f"(tiling.on_failure: record): {shown}")
            continue
        raise ConfigError(f"{table.path}: {len(bad)} labelled slide(s) of cohorts.{cohort} ({source}) cannot be read: "
                          f"{shown}; copy them again from the source, or remove them and their rows, or set "
                          f"cohorts.{cohort}.tiling.on_failure: record to leave them out")
    return warnings


def calibration_warnings(config: Mapping[str, Any], calibration: Mapping[str, list[tuple[str, str]]],
                         found: Mapping[str, Mapping[str, Any]]) -> list[str]:
    """A warning per backbone whose calibration asks more tiles (calibration.n_tiles) than
    its calibration slides (``calibration``: backbone -> (cohort, slide id)) hold; calibrate
    then draws all of them."""
    asked = int(config["calibration"]["n_tiles"])
    warnings = []
    for backbone, slides in calibration.items():
        counted = [found[c][s]["tiles"] for c, s in slides if s in found.get(c, {}) and not found[c][s].get("error")]
        if len(counted) < len(slides):
            continue  # not every slide was read: no total to compare
        if sum(counted) < asked:
            cohorts = ", ".join(sorted({c for c, _ in slides}))
            warnings.append(f"calibration.n_tiles {asked} is more than the {sum(counted)} tiles the {len(slides)} "
                            f"calibration slide(s) of backbone {backbone} hold (cohort {cohorts}); calibration will "
                            "draw all of them: lower n_tiles, or lend compression more slides")
    return warnings
