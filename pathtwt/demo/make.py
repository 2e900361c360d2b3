"""Write the demo cohorts to a folder: slides, label tables, true tissue masks, label maps
and a manifest (``demo.json``) written last, which marks the folder as complete."""

from __future__ import annotations

import csv
import io
import json
import os
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

import numpy as np

from pathtwt.errors import ConfigError
from pathtwt.io.atomic import atomic_output, write_json_atomic, write_text_atomic
from pathtwt.demo.cohorts import SCALES, PlannedSlide, planned_slides
from pathtwt.demo.synthetic import TUMOUR_LABEL, SlideRecipe, SyntheticSlide
from pathtwt.demo.tiff_writer import write_pyramidal_tiff

MANIFEST = "demo.json"
FORMAT = "pathtwt-demo/1"
LABEL_MAP_VALUES = {"0": "background", "1": "tissue", "2": "tumour tissue"}


def make_demo_cohorts(out: str | os.PathLike, *, scale: str = "demo", seed: int = 0, force: bool = False, workers: int = 1) -> dict:
    """Generate every cohort of ``scale`` under ``out``; return the manifest. A folder whose
    manifest matches (scale, seed) is left as it is."""
    plans = planned_slides(scale, seed=seed)
    out = Path(out)
    manifest_path = out / MANIFEST
    existing = _read_manifest(manifest_path)
    if existing is not None and not force:
        if existing.get("scale") == scale and existing.get("seed") == seed:
            return existing
        raise ConfigError(
            f"{manifest_path} holds demo cohorts made with --scale {existing.get('scale')} --seed {existing.get('seed')}; "
            f"choose another --out folder or pass --force to regenerate"
        )
    if existing is not None:
        manifest_path.unlink()  # the folder is incomplete until the new manifest lands

    spec = SCALES[scale]
    jobs: list[tuple[str, PlannedSlide, Path]] = []  # (cohort, slide, cohort folder)
    for cohort in spec.cohorts:
        folder = out / cohort.name
        planned = plans[cohort.name]
        _remove_stale(folder, {p.slide_id for p in planned})
        write_text_atomic(folder / "labels.csv", _labels_csv(planned))
        write_json_atomic(
            folder / "masks" / "masks.json",
            {
                "downsample": spec.mask_downsample,
                "mpp": spec.mpp * spec.mask_downsample,
                "values": {"0": "background", "255": "tissue"},
                "label_maps": {"folder": "../labelmaps", "values": LABEL_MAP_VALUES},
                "note": "pixel (i, j) is the truth at level-0 point ((j + 0.5) * downsample, (i + 0.5) * downsample)",
                "slides": {p.slide_id: f"{p.slide_id}.png" for p in planned},
            },
        )
        jobs += [(cohort.name, p, folder) for p in planned]

    args = [(p.recipe, p.slide_id, f, spec.mask_downsample) for _, p, f in jobs]
    if workers > 1:
        with ProcessPoolExecutor(max_workers=workers) as pool:
            stats = list(pool.map(_write_job, args))
    else:
        stats = [_write_job(a) for a in args]

    manifest = {"format": FORMAT, "scale": scale, "seed": seed, "mpp": spec.mpp, "cohorts": {}}
    for cohort in spec.cohorts:
        rows = [
            {"slide_id": p.slide_id, "label": p.label, "split": p.split, **s, "recipe": p.recipe.to_dict()}
            for (name, p, _), s in zip(jobs, stats)
            if name == cohort.name
        ]
        manifest["cohorts"][cohort.name] = {
            "task": cohort.task,
            "classes": cohort.classes,
            "tissue": cohort.tissue,
            "stain": cohort.stain.to_dict(),
            "splits": sorted({r["split"] for r in rows}),
            "slides": rows,
        }
    write_json_atomic(manifest_path, manifest)
    return manifest


def _remove_stale(folder: Path, slide_ids: set[str]) -> None:
    """Delete slides, masks and label maps of an earlier run (another scale or seed) that
    this plan does not contain, so a cohort folder never lists slides without labels."""
    for sub, suffix in (("slides", ".tiff"), ("masks", ".png"), ("labelmaps", ".png")):
        if (folder / sub).is_dir():
            for path in (folder / sub).iterdir():
                if path.suffix == suffix and path.stem not in slide_ids:
                    path.unlink()


def _read_manifest(path: Path) -> dict | None:
    if not path.exists():
        return None
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, json.JSONDecodeError) as exc:
        raise ConfigError(f"{path}: unreadable demo manifest ({exc}); delete it or pass --force") from exc
    if data.get("format") != FORMAT:
        raise ConfigError(f"{path}: not a pathtwt demo manifest; choose another --out folder or pass --force")
    return data


def _labels_csv(planned: list[PlannedSlide]) -> str:
    buf = io.StringIO()
    writer = csv.writer(buf, lineterminator="\n")
    writer.writerow(["slide_id", "label", "split"])
    writer.writerows([p.slide_id, p.label, p.split] for p in planned)
    return buf.getvalue()


def _write_job(job: tuple[SlideRecipe, str, Path, int]) -> dict:
    recipe, slide_id, folder, mask_downsample = job  # one picklable argument for pool.map
    return write_slide(recipe, folder, slide_id, mask_downsample=mask_downsample)


def write_slide(recipe: SlideRecipe, folder: Path, slide_id: str, *, mask_downsample: int) -> dict:
    """Write slides/{id}.tiff, masks/{id}.png and labelmaps/{id}.png; return facts about
    the slide measured on its label map."""
    slide = SyntheticSlide(recipe)
    dims = write_pyramidal_tiff(folder / "slides" / f"{slide_id}.tiff", slide.width, slide.height, slide.render, mpp=slide.mpp)
    labels = slide.label_map(mask_downsample)
    write_png(folder / "masks" / f"{slide_id}.png", np.where(labels > 0, 255, 0).astype(np.uint8))
    write_png(folder / "labelmaps" / f"{slide_id}.png", labels)
    tissue = int((labels > 0).sum())
    return {
        "levels": [list(d) for d in dims],
        "tissue_share": round(tissue / labels.size, 4),
        "tumour_share": round(float((labels == TUMOUR_LABEL).sum()) / tissue, 4) if tissue else 0.0,
        "tiles_224px_0.5mpp": count_tissue_tiles(labels, tile_level0=224 * 0.5 / recipe.mpp, downsample=mask_downsample),
    }


def count_tissue_tiles(labels: np.ndarray, *, tile_level0: float, downsample: int, min_tissue: float = 0.6) -> int:
    """Tiles of a grid anchored at (0, 0) with at least ``min_tissue`` tissue: what the
    fraction filter should keep, give or take the tiler's grid origin."""
    step = int(round(tile_level0 / downsample))
    tissue = labels > 0
    n = 0
    for y in range(0, tissue.shape[0] - step + 1, step):
        for x in range(0, tissue.shape[1] - step + 1, step):
            n += bool(tissue[y : y + step, x : x + step].mean() >= min_tissue)
    return n


def write_png(path: Path, image: np.ndarray) -> None:
    from PIL import Image

    with atomic_output(path) as tmp:
        Image.fromarray(image).save(tmp, format="PNG")
