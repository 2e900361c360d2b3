"""The HTML page of the report, the file a person opens first: the tables of every task,
the tile-probe and fidelity tables, which teacher was used and how cost was counted, then the figures that exist (similarity
heatmaps with the discovered blocks, tissue thumbnails, MIL attention heatmaps, analysis
figures). Figures are copied next to the page, so the report folder stands alone."""

from __future__ import annotations

import html
import json
import shutil
from pathlib import Path
from typing import Any

import numpy as np

from pathtwt.io.atomic import atomic_output

THUMBNAILS_PER_COHORT = 3


def _copy_figure(src: Path, out: Path, name: str) -> str:
    dest = out / "figures" / name
    with atomic_output(dest) as tmp:
        shutil.copyfile(src, tmp)
    return f"figures/{name}"


def sidecar_caption(png: Path, default: str) -> str:
    """Caption from the figure's sidecar JSON (``name.json``), if it has one."""
    side = png.with_suffix(".json")
    if side.is_file():
        try:
            caption = json.loads(side.read_text()).get("caption")
        except (OSError, json.JSONDecodeError):
            caption = None
        if caption:
            return str(caption)
    return default


def _visible_pngs(folder: Path, pattern: str) -> list[Path]:
    return [p for p in sorted(folder.glob(pattern)) if not p.name.startswith(".")]


def similarity_figures(results: Path, out: Path) -> list[tuple[str, str]]:
    figs = []
    for png in _visible_pngs(results / "discovery", "*/similarity.png"):
        backbone = png.parent.name
        caption = sidecar_caption(png, f"{backbone}: layer-similarity matrix with the discovered blocks.")
        figs.append((_copy_figure(png, out, f"similarity_{backbone}.png"), caption))
    return figs


def thumbnail_figures(results: Path, out: Path) -> list[tuple[str, str]]:
    figs = []
    for cohort_dir in sorted(p for p in (results / "thumbnails").glob("*") if p.is_dir()):
        for png in _visible_pngs(cohort_dir, "*.png")[:THUMBNAILS_PER_COHORT]:
            caption = f"{cohort_dir.name} / {png.stem}: tissue outline and kept tiles."
            figs.append((_copy_figure(png, out, f"thumb_{cohort_dir.name}_{png.name}"), caption))
    return figs


def analysis_figures(results: Path, out: Path) -> list[tuple[str, str]]:
    figs = []
    for png in _visible_pngs(results / "analysis", "**/*.png"):
        rel = png.relative_to(results / "analysis")
        name = "analysis_" + "_".join(rel.parts)
        figs.append((_copy_figure(png, out, name), sidecar_caption(png, str(rel))))
    return figs


def attention_grid(coords: np.ndarray, scores: np.ndarray) -> np.ndarray:
    """Per-tile scores on the tile grid (NaN where no tile): the tile pitch is the
    smallest gap between distinct coordinates."""
    coords = np.asarray(coords, dtype=np.int64).reshape(-1, 2)
    pitch = 1
    for axis in (0, 1):
        gaps = np.diff(np.unique(coords[:, axis]))
        gaps = gaps[gaps > 0]
        if gaps.size:
            pitch = max(pitch, int(gaps.min()))
    cells = (coords - coords.min(axis=0)) // pitch
    grid = np.full((int(cells[:, 1].max()) + 1, int(cells[:, 0].max()) + 1), np.nan, dtype=np.float32)
    grid[cells[:, 1], cells[:, 0]] = scores
    return grid


def attention_figures(results: Path, out: Path, task: str, rows: list, n_slides: int) -> list[tuple[str, str]]:
    """Heatmaps of the per-tile attention of one run of the task (the uncompressed
    backbone's first head, lowest seed) on the internal test slides with most tiles."""
    if n_slides <= 0 or not rows:
        return []
    import h5py
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    row = next((r for r in rows if r.variant == "uncompressed"), rows[0])
    run_dir = results / "mil" / row.backbone / row.variant / task / row.head / f"seed{row.seeds[0]}"
    path = run_dir / "attention" / "test.h5"
    if not path.is_file():
        candidates = _visible_pngs(run_dir / "attention", "*.h5")
        if not candidates:
            return []
        path = candidates[0]
    figs = []
    with h5py.File(path, "r") as h5:
        slides = sorted(h5, key=lambda s: -len(h5[s]["attention"]))[:n_slides]
        for slide in slides:
            group = h5[slide]
            scores, coords = group["attention"][()], group["coords"][()]
            if len(scores) == 0:
                continue
            grid = attention_grid(coords, scores / max(float(scores.max()), 1e-12))
            fig, ax = plt.subplots(figsize=(4, 4 * grid.shape[0] / max(grid.shape[1], 1) + 0.6))
            im = ax.imshow(grid, cmap="inferno", vmin=0, vmax=1, interpolation="nearest")
            ax.set_axis_off()
            label, pred = group.attrs.get("label"), group.attrs.get("prediction")
            ax.set_title(f"{slide}: label {label}, predicted {pred}", fontsize=8)
            fig.colorbar(im, ax=ax, fraction=0.046, label="attention / max")
            name = f"attention_{task}_{slide}.png"
            with atomic_output(out / "figures" / name) as tmp:
                fig.savefig(tmp, dpi=100, bbox_inches="tight", format="png")
            plt.close(fig)
            figs.append((
                f"figures/{name}",
                f"{task}, {path.stem} slide {slide}: attention of {row.head} on {row.backbone}/{row.variant} "
                f"(seed {row.seeds[0]}), one square per tile.",
            ))
    return figs


def _table_html(header: list[str], body: list[list[str]], css: str = "", references: set[int] = frozenset()) -> str:
    """``references``: indices of rows drawn as reference rows (muted)."""
    head = "".join(f"<th>{html.escape(h)}</th>" for h in header)
    rows = "".join(
        ("<tr class='reference'>" if i in references else "<tr>")
        + "".join(f"<td>{html.escape(c)}</td>" for c in cells) + "</tr>"
        for i, cells in enumerate(body)
    )
    cls = f" class='{css}'" if css else ""
    return f"<table{cls}><thead><tr>{head}</tr></thead><tbody>{rows}</tbody></table>"


def _figures_html(title: str, figs: list[tuple[str, str]]) -> str:
    if not figs:
        return ""
    items = "".join(
        f'<figure><img src="{html.escape(src)}" alt="{html.escape(cap)}"><figcaption>{html.escape(cap)}</figcaption></figure>'
        for src, cap in figs
    )
    return f"<h2>{html.escape(title)}</h2><div class='figs'>{items}</div>"


STYLE = """
body{font-family:system-ui,sans-serif;max-width:1200px;margin:2em auto;padding:0 1em;color:#222}
table{border-collapse:collapse;margin:1em 0;font-size:0.9em}
th,td{border:1px solid #ccc;padding:0.3em 0.6em;text-align:right}
th:nth-child(-n+3),td:nth-child(-n+3){text-align:left}
table.names2 th:nth-child(3),table.names2 td:nth-child(3){text-align:right}
table.names2 td:nth-child(-n+2){white-space:nowrap}
tr.reference td{color:#555;font-style:italic}
thead{background:#f0f0f0}
.figs{display:flex;flex-wrap:wrap;gap:1em}
figure{margin:0;max-width:360px}figure img{max-width:100%}
figcaption{font-size:0.8em;color:#555}
.note{font-size:0.9em;color:#444}
"""


def render_html(
    results: Path, out: Path, *, sections: list[dict[str, Any]], teachers: list[str], counting: str,
    attention_slides: int, tables: list[dict[str, Any]] | None = None,
) -> str:
    """The page; ``tables`` are the backbone-level tables (tile probe, fidelity) shown
    after the MIL tables, each with a title, header, cells and notes."""
    parts = [
        "<!doctype html><html><head><meta charset='utf-8'><title>pathtwt results</title>",
        f"<style>{STYLE}</style></head><body><h1>pathtwt results</h1>",
        "<p class='note'>Rows: backbone variant × MIL head. Cells: mean ± standard deviation over "
        "seeds; Δ: difference of the means against the uncompressed backbone with the same head.</p>",
        "<h2>Teachers</h2><ul>" + "".join(f"<li>{html.escape(t)}</li>" for t in teachers) + "</ul>",
        f"<p class='note'>{html.escape(counting)}</p>",
    ]
    attention = []
    for s in sections:
        parts.append(f"<h2>Task: {html.escape(s['task'])} (headline metric {html.escape(s['metric'])})</h2>")
        parts.append(_table_html(s["header"], s["body"]) if s["body"] else "<p>No finished runs yet.</p>")
        attention += attention_figures(results, out, s["task"], s["rows"], attention_slides)
    for t in tables or []:
        parts.append(f"<h2>{html.escape(t['title'])}</h2>")
        parts.append(_table_html(t["header"], t["body"], css="names2", references=set(t.get("references", ()))))
        parts += [f"<p class='note'>{html.escape(n)}</p>" for n in t["notes"]]
    parts.append(_figures_html("Layer similarity and discovered blocks", similarity_figures(results, out)))
    parts.append(_figures_html("MIL attention", attention))
    parts.append(_figures_html("Tissue detection", thumbnail_figures(results, out)))
    parts.append(_figures_html("Analyses", analysis_figures(results, out)))
    parts.append("</body></html>\n")
    return "\n".join(p for p in parts if p)
