"""``pathtwt bench``'s outputs besides its JSON: the Markdown table (the machine's facts from
the doctor above it, one row per measurement) and the plot of tiles/s per variant."""

from __future__ import annotations

from pathlib import Path
from typing import Any

COLUMNS = [("kind", "kind"), ("backbone", "backbone"), ("variant", "variant"), ("mosaic", "mosaic"),
           ("batch", "batch"), ("precision", "precision"), ("tiles_per_s", "tiles/s"), ("gmacs", "GMACs"),
           ("mac_ratio", "MAC ratio"), ("speedup", "speed-up"), ("reaches_goal", "0.8 of MAC ratio"),
           ("bound", "bound by"), ("peak_mem_gib", "peak GiB")]


def cell(value: Any) -> str:
    if value is None:
        return "-"
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, float):
        return f"{value:.3f}" if abs(value) < 10 else f"{value:.1f}"
    return str(value)


def machine_lines(facts: dict[str, Any]) -> list[str]:
    """The doctor's checks, one line each, and the run's own facts."""
    lines = [f"    {c['status']:<4}  {c['name']:<14} {c['detail']}" for c in facts.get("machine", [])]
    run = {k: facts[k] for k in ("device", "precision", "slide", "seconds", "mosaics") if k in facts}
    return lines + [""] + [f"- {k}: {v}" for k, v in run.items()]


def markdown(rows: list[dict[str, Any]], facts: dict[str, Any]) -> str:
    """The table of ``rows`` under the machine's facts; then one line per row, its note
    (what bounds it, a student's speed-up against its MAC ratio)."""
    out = ["# pathtwt bench", "", "Machine (pathtwt doctor):", "", *machine_lines(facts), "",
           "| " + " | ".join(title for _, title in COLUMNS) + " |",
           "|" + "|".join("---" for _ in COLUMNS) + "|"]
    out += ["| " + " | ".join(cell(r.get(key)) for key, _ in COLUMNS) + " |" for r in rows]
    notes = [f"- {r['kind']} {r['variant']}{' ' + r['mosaic'] if r.get('mosaic') else ''}: {r['note']}"
             for r in rows if r.get("note")]
    if notes:
        out += ["", *notes]
    return "\n".join(out) + "\n"


def plot(rows: list[dict[str, Any]], path: str | Path) -> Path:
    """A bar chart of tiles/s per variant: model alone (its largest batch's rate) and end
    to end per mosaic; written atomically."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from pathtwt.io.atomic import atomic_output

    series: dict[str, dict[str, float]] = {}
    for r in rows:
        if r["kind"] not in ("model", "end-to-end") or r.get("tiles_per_s") is None:
            continue
        label = "model alone" if r["kind"] == "model" else f"end to end {r['mosaic']}"
        series.setdefault(label, {})[f"{r['backbone']} {r['variant']}"] = r["tiles_per_s"]
    variants = list(dict.fromkeys(v for s in series.values() for v in s))
    fig, ax = plt.subplots(figsize=(max(4.0, 1.6 * len(variants) + 2), 3.6))
    width = 0.8 / max(len(series), 1)
    for i, (label, values) in enumerate(series.items()):
        ax.bar([j + i * width for j in range(len(variants))], [values.get(v, 0.0) for v in variants], width,
               label=label)
    ax.set_xticks([j + width * (len(series) - 1) / 2 for j in range(len(variants))], variants, fontsize=8)
    ax.set_ylabel("tiles/s")
    ax.legend(fontsize=8)
    fig.tight_layout()
    with atomic_output(path) as tmp:
        fig.savefig(tmp, format=Path(path).suffix.lstrip(".") or "png", dpi=110)
    plt.close(fig)
    return Path(path)
