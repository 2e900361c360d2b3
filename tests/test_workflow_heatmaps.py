"""The workflow's QuPath regions and report heatmaps, planned on the paper's dummy data:
`report: {heatmaps: N}` adds one `pathtwt heatmap` job per variant, attention head, task
and each of the first N test slides of every reported cohort, all inputs of the report;
a cohort's `roi` folder reaches the tile job of each slide that has a GeoJSON there, and
a misnamed GeoJSON stops the workflow before any job."""

from __future__ import annotations

import json

import yaml

from test_workflow_dag import REPO, _dry_run, job_counts, make_dummy_data, snakemake


def _config(tmp_path, data, **report):
    cfg = yaml.safe_load((REPO / "config" / "paper.yaml").read_text())
    cfg["backbones"] = {"h0-mini": {"variants": ["uncompressed", "twt-4"]}}
    cfg["mil"]["seeds"] = [1, 2]
    cfg["report"].update(report)
    cfg["cohorts"]["panda"]["roi"] = "rois/panda"
    path = tmp_path / "cfg.yaml"
    path.write_text(yaml.safe_dump(cfg))
    return path


def _square(x0, y0, x1, y1):
    return {"type": "Feature", "properties": {"objectType": "annotation"},
            "geometry": {"type": "Polygon", "coordinates": [[[x0, y0], [x1, y0], [x1, y1], [x0, y1], [x0, y0]]]}}


def test_report_heatmaps_and_cohort_rois_are_planned(tmp_path):
    data, work = tmp_path / "data", tmp_path / "work"
    make_dummy_data(data)
    (work / "config").mkdir(parents=True)
    (work / "config" / "config.yaml").write_text((REPO / "config" / "config.yaml").read_text())
    (data / "rois" / "panda").mkdir(parents=True)
    (data / "rois" / "panda" / "p2.geojson").write_text(json.dumps({"type": "FeatureCollection", "features": [_square(0, 0, 9, 9)]}))

    result = _dry_run(work, _config(tmp_path, data, heatmaps=1, heatmap_mpp=8.0), data)
    plan = result.stdout + result.stderr
    counts = job_counts(result.stdout)
    # 2 variants x 2 heads x (isup: panda test p6 + tcga-prad t1; metastasis: camelyon17 c5 + camelyon16 n1)
    assert counts["heatmap"] == 2 * 2 * 4
    commands = [line for line in plan.splitlines() if "pathtwt heatmap " in line]
    assert len(commands) == 16 and all("/seed1 " in c and "--mpp 8.0" in c for c in commands)
    assert {c.split("--slide-id=")[1].split()[0] for c in commands} == {"p6", "t1", "c5", "n1"}
    tiles = [line for line in plan.splitlines() if "pathtwt tile " in line]
    with_roi = [line for line in tiles if "--roi " in line]
    assert len(with_roi) == 1 and "p2.geojson" in with_roi[0] and "PANDA/train_images/p2" in with_roi[0]

    # without heatmaps: no such job
    assert "heatmap" not in job_counts(_dry_run(work, _config(tmp_path, data), data).stdout)

    # a GeoJSON named after no slide of the cohort stops the plan, by name
    (data / "rois" / "panda" / "p22.geojson").write_text("{}")
    bad = snakemake(work, "-n", "--configfile", str(_config(tmp_path, data)), "--config", f"data_root={data}", check=False)
    assert bad.returncode != 0 and "p22.geojson" in bad.stdout + bad.stderr
