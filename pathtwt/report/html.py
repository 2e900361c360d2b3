"""The HTML page of the report, the file a person opens first: the tables of every task,
the tile-probe and fidelity tables, which teacher was used and how cost was counted, then the figures that exist (similarity
heatmaps with the discovered blocks, tissue thumbnails, MIL attention heatmaps, analysis
figures). Figures are copied next to the page, so the report folder stands alone."""

from __future__ import annotations

import html
import json
import re
import shutil
from pathlib import Path
from typing import Any

from pathtwt.io.atomic import atomic_output
from pathtwt.io.layout import UNCOMPRESSED
from pathtwt.report.attention import attention_figures
from pathtwt.report.selection import EVERYTHING, Selection

THUMBNAILS_PER_COHORT = 3


# The notes and captions are written once, in Markdown, for the Markdown tables and this
# page alike; the page renders the inline parts they use (code spans, bold, links).
_INLINE = re.compile(r"`([^`]+)`|\*\*([^*]+)\*\*|\[([^\]]+)\]\(([^)\s]+)\)")


def inline_markdown(text: str) -> str:
    """HTML of one line of Markdown: ``code``, **bold** and [links](url); everything else
    escaped as text."""
    out, end = [], 0
    for m in _INLINE.finditer(text):
        out.append(html.escape(text[end:m.start()]))
        code, bold, label, href = m.groups()
        if code is not None:
            out.append(f"<code>{html.escape(code)}</code>")
        elif bold is not None:
            out.append(f"<strong>{html.escape(bold)}</strong>")
        else:
            out.append(f'<a href="{html.escape(href)}">{html.escape(label)}</a>')
        end = m.end()
    out.append(html.escape(text[end:]))
    return "".join(out)


def plain_text(text: str) -> str:
    """The words of one line of Markdown, without its marks (an image's alt text)."""
    return _INLINE.sub(lambda m: m.group(1) or m.group(2) or m.group(3), text)


def _notes(notes: list[str]) -> list[str]:
    return [f"<p class='note'>{inline_markdown(n)}</p>" for n in notes]


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


def similarity_figures(results: Path, out: Path, selection: Selection = EVERYTHING) -> list[tuple[str, str]]:
    figs = []
    for png in _visible_pngs(results / "discovery", "*/similarity.png"):
        backbone = png.parent.name
        if not selection.keeps(backbone=backbone):
            continue
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


def analysis_figures(results: Path, out: Path, selection: Selection = EVERYTHING) -> list[tuple[str, str]]:
    figs = []
    for png in _visible_pngs(results / "analysis", "**/*.png"):
        rel = png.relative_to(results / "analysis")
        # analysis/{backbone}/{name}/x.png, analysis/{backbone}/{variant}/{name}/x.png, or the
        # eps sweep over every backbone (analysis/eps/x.png)
        if rel.parts[0] != "eps" and not selection.keeps(
                backbone=rel.parts[0], variant=rel.parts[1] if len(rel.parts) > 3 else None):
            continue
        name = "analysis_" + "_".join(rel.parts)
        figs.append((_copy_figure(png, out, name), sidecar_caption(png, str(rel))))
    return figs


HEATMAP_OUTPUTS = (("heatmap", ".heatmap.png"), ("top/bottom tiles", ".top_tiles.png"), ("QuPath GeoJSON", ".geojson"))


def heatmaps_html(results: Path, out: Path, selection: Selection = EVERYTHING) -> str:
    """A table linking the heatmaps `pathtwt heatmap` drew for the report (workflow
    `report: {heatmaps: N}`): results/heatmaps/{backbone}/{variant}/{task}/{head}/{cohort}/,
    copied under figures/heatmaps/ so the report folder stands alone."""
    root = results / "heatmaps"
    def order(png: Path) -> tuple:
        # one slide's heatmaps together, the teacher's first: the comparison a reader makes
        backbone, variant, task, head, cohort = png.relative_to(root).parts[:5]
        return task, cohort, png.name, backbone, variant != UNCOMPRESSED, variant, head

    def shown(png: Path) -> bool:
        backbone, variant, task, head = png.relative_to(root).parts[:4]
        return not png.name.startswith(".") and selection.keeps(task=task, backbone=backbone, variant=variant, head=head)

    pngs = sorted((p for p in root.glob("*/*/*/*/*/*.heatmap.png") if shown(p)), key=order)
    if not pngs:
        return ""
    body = []
    for png in pngs:
        rel = png.relative_to(root)
        backbone, variant, task, head, cohort = rel.parts[:5]
        slide = png.name[: -len(".heatmap.png")]
        links = []
        for label, suffix in HEATMAP_OUTPUTS:
            src = png.with_name(slide + suffix)
            if src.is_file():
                dest = Path("heatmaps", *rel.parts[:5], src.name)
                href = _copy_figure(src, out, str(dest))
                links.append(f'<a href="{html.escape(href)}">{html.escape(label)}</a>')
        body.append([html.escape(x) for x in (task, cohort, slide, f"{backbone} / {variant}", head)] + [" | ".join(links)])
    head_row = "".join(f"<th>{h}</th>" for h in ("task", "cohort", "slide", "variant", "head", "files"))
    rows = "".join("<tr>" + "".join(f"<td>{c}</td>" for c in r) + "</tr>" for r in body)
    return ("<h2>Attention heatmaps</h2><p class='note'>The first slides by id of each reported cohort "
            "(of the task's own cohort, its test split; in a cross-validation, the slides the first fold's heads "
            "tested out of fold; an external cohort, whole), drawn by <code>pathtwt heatmap</code> with each variant's head (lowest seed), the teacher's first: attention over the slide, "
            "the tiles of highest and lowest attention, and the tiles with their attention as QuPath objects.</p>"
            f"<div class='scroll'><table><thead><tr>{head_row}</tr></thead><tbody>{rows}</tbody></table></div>")


def _table_html(header: list[str], body: list[list[str]], css: str = "", references: set[int] = frozenset(),
                flagged: set[tuple[int, int]] = frozenset()) -> str:
    """``references``: indices of rows drawn as reference rows (muted); ``flagged``: (row,
    column) of cells drawn as warnings."""
    head = "".join(f"<th>{html.escape(h)}</th>" for h in header)

    def cell(text: str) -> str:
        # MIL cells: the interval on its own line under "mean ± std", so each part of
        # the split table stays narrow
        return html.escape(text).replace(" [", "<br>[") if css == "mil" else html.escape(text)

    rows = "".join(
        ("<tr class='reference'>" if i in references else "<tr>")
        + "".join(("<td class='flag'>" if (i, j) in flagged else "<td>") + f"{cell(c)}</td>"
                  for j, c in enumerate(cells)) + "</tr>"
        for i, cells in enumerate(body)
    )
    cls = f" class='{css}'" if css else ""
    return f"<table{cls}><thead><tr>{head}</tr></thead><tbody>{rows}</tbody></table>"


ROW_NAME_COLUMNS = 3  # Backbone, Variant, Head: repeated in each part of a split MIL table


def mil_table_parts(header: list[str]) -> list[tuple[str, list[int]]]:
    """The MIL table cut into parts that fit a 1280-px window: one per evaluated cohort
    (its columns start at "Slides <cohort>") and one of the backbone's precision and
    cost, each (title, column indices) with the row-name columns first. A header with
    no cohort columns stays one part."""
    names = list(range(min(ROW_NAME_COLUMNS, len(header))))
    starts = [i for i, h in enumerate(header) if h.startswith("Slides ")]
    if not starts:
        return [("", list(range(len(header))))]
    parts = []
    for k, start in enumerate(starts):
        end = starts[k + 1] if k + 1 < len(starts) else len(header)
        parts.append((header[start][len("Slides "):], names + list(range(start, end))))
    cost = list(range(len(names), starts[0]))
    if cost:
        parts.append(("backbone precision and cost", names + cost))
    return parts


def backbone_table_parts(header: list[str]) -> list[tuple[str, list[int]]]:
    """A backbone-level table (fidelity) with its per-layer R² columns as a second part,
    so neither needs a horizontal scrollbar at 1280 px; (title, column indices)."""
    names = list(range(min(2, len(header))))
    layers = [j for j, h in enumerate(header) if h.startswith("R² L")]
    if not layers:
        return [("", list(range(len(header))))]
    rest = [j for j in range(len(names), len(header)) if j not in layers]
    return [("", names + rest), ("per layer", names + layers)]


def _mil_tables_html(s: dict[str, Any]) -> str:
    references = set(s.get("references", ()))
    flagged = set(s.get("flagged", ()))
    out = []
    for title, columns in mil_table_parts(s["header"]):
        where = {j: n for n, j in enumerate(columns)}
        part_flags = {(i, where[j]) for i, j in flagged if j in where}
        table = _table_html([s["header"][j] for j in columns], [[row[j] for j in columns] for row in s["body"]],
                            css="mil", references=references, flagged=part_flags)
        out.append((f"<h3>{html.escape(title)}</h3>" if title else "") + f"<div class='scroll'>{table}</div>")
    return "\n".join(out)


def _figures_html(title: str, figs: list[tuple[str, str]], wide: bool = False, notes: list[str] = ()) -> str:
    if not figs and not notes:
        return ""
    cls = " class='wide'" if wide else ""
    items = "".join(
        f'<figure{cls}><img src="{html.escape(src)}" alt="{html.escape(plain_text(cap))}">'
        f"<figcaption>{inline_markdown(cap)}</figcaption></figure>"
        for src, cap in figs
    )
    return f"<h2>{html.escape(title)}</h2>" + "".join(_notes(notes)) + f"<div class='figs'>{items}</div>"


STYLE = """
body{font-family:system-ui,sans-serif;margin:2em auto;padding:0 1em;color:#222}
p,ul{max-width:80em}
table{border-collapse:collapse;margin:1em 0;font-size:0.9em}
th,td{border:1px solid #ccc;padding:0.3em 0.6em;text-align:right}
th:nth-child(-n+3),td:nth-child(-n+3){text-align:left}
table.names2 th:nth-child(3),table.names2 td:nth-child(3){text-align:right}
table.names2 td:nth-child(-n+2){white-space:nowrap}
tr.reference td{color:#555;font-style:italic}
td.flag{background:#ffe0a0;color:#8a3b00;font-weight:bold}
table.mil td{white-space:nowrap}
table.mil th{min-width:4em}
.scroll{overflow-x:auto}
thead{background:#f0f0f0}
.figs{display:flex;flex-wrap:wrap;gap:1em}
figure{margin:0;max-width:360px}figure img{max-width:100%}
figure.wide{max-width:100%}
figcaption{font-size:0.8em;color:#555}
.note{font-size:0.9em;color:#444}
"""


def render_html(
    results: Path, out: Path, *, sections: list[dict[str, Any]], teachers: list[str], counting: str,
    attention_slides: int, tables: list[dict[str, Any]] | None = None, selection: Selection = EVERYTHING,
) -> str:
    """The page; ``tables`` are the backbone-level tables (tile probe, fidelity) shown
    after the MIL tables, each with a title, header, cells and notes."""
    parts = [
        "<!doctype html><html><head><meta charset='utf-8'><title>pathtwt results</title>",
        f"<style>{STYLE}</style></head><body><h1>pathtwt results</h1>",
        "<p class='note'>Rows: backbone variant × MIL head, with the uncompressed teacher, the random-init "
        "backbone (where the study ran it) and chance as reference rows (in italics). Cells: mean ± standard "
        "deviation over seeds with a bootstrap 95 % interval over slides; Δ: difference of the means against "
        "the uncompressed backbone with the same head; a highlighted cell is a run that predicted one class for "
        "every slide of the cohort.</p>",
        "<h2>Teachers</h2><ul>" + "".join(f"<li>{inline_markdown(t)}</li>" for t in teachers) + "</ul>",
        *_notes([counting]),
    ]
    attention, attention_notes = [], []
    for s in sections:
        parts.append(f"<h2>Task: {html.escape(s['task'])} (headline metric {html.escape(s['metric'])})</h2>")
        parts.append(_mil_tables_html(s) if s["body"] else "<p>No finished runs yet.</p>")
        parts += _notes(s.get("notes", []))
        figs, notes = attention_figures(results, out, s["task"], s["rows"], attention_slides)
        attention += figs
        attention_notes += notes
    for t in tables or []:
        parts.append(f"<h2>{html.escape(t['title'])}</h2>")
        for title, columns in backbone_table_parts(t["header"]):
            table = _table_html([t["header"][j] for j in columns], [[row[j] for j in columns] for row in t["body"]],
                                css="names2", references=set(t.get("references", ())))
            parts.append((f"<h3>{html.escape(t['title'])}, {title}</h3>" if title else "") + f"<div class='scroll'>{table}</div>")
        parts += _notes(t["notes"])
    parts.append(_figures_html("Layer similarity and discovered blocks", similarity_figures(results, out, selection)))
    parts.append(_figures_html("MIL attention", attention, wide=True, notes=attention_notes))
    parts.append(heatmaps_html(results, out, selection))
    parts.append(_figures_html("Tissue detection", thumbnail_figures(results, out)))
    parts.append(_figures_html("Analyses", analysis_figures(results, out, selection)))
    parts.append("</body></html>\n")
    return "\n".join(p for p in parts if p)
