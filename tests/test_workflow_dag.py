"""The Snakemake DAG: lint-clean, the paper's full study plans on dummy data, adding a
cohort adds exactly its jobs, calibration reads training slides only, and bad label
tables stop the workflow before any job."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest
import yaml


REPO = Path(__file__).resolve().parents[1]
SNAKEMAKE = Path(sys.executable).parent / "snakemake"

# Dummy slides per cohort of config/paper.yaml: (slide ids per split)
PAPER_DATA = {
    "panda": ("PANDA/train_images", "labels/panda_song_split.csv", "isup_grade",
              {"train": ["p1", "p2", "p3", "p4"], "val": ["p5"], "test": ["p6"]}, ".tiff"),
    "tcga-prad": ("TCGA-PRAD/slides", "labels/tcga_prad_isup.csv", "isup_grade", {"test": ["t1", "t2"]}, ".svs"),
    "camelyon17": ("CAMELYON17/images", "labels/camelyon17_slides.csv", "label",
                   {"train": ["c1", "c2", "c3"], "val": ["c4"], "test": ["c5"]}, ".tif"),
    "camelyon16": ("CAMELYON16/images", "labels/camelyon16_slides.csv", "label", {"test": ["n1", "n2", "n3"]}, ".tif"),
}


def make_dummy_data(root: Path, extra: dict | None = None) -> None:
    for folder, labels, label_col, splits, ext in list(PAPER_DATA.values()) + list((extra or {}).values()):
        (root / folder).mkdir(parents=True, exist_ok=True)
        rows = []
        for split, ids in splits.items():
            for i, slide in enumerate(ids):
                # distinct bytes: identical files would be one slide to the store (one tiles key)
                (root / folder / f"{slide}{ext}").write_bytes(f"{folder}/{slide}".encode())
                rows.append(f"{slide},{i % 2},{split}\n")
        (root / labels).parent.mkdir(parents=True, exist_ok=True)
        (root / labels).write_text(f"slide_id,{label_col},split\n" + "".join(rows))


def snakemake(workdir: Path, *args: str, check: bool = True, timeout: float = 120) -> subprocess.CompletedProcess:
    cmd = [str(SNAKEMAKE), "-s", str(REPO / "Snakefile"), "--directory", str(workdir), *args]
    res = subprocess.run(cmd, capture_output=True, text=True, cwd=REPO, timeout=timeout)
    if check and res.returncode != 0:
        raise AssertionError(f"{' '.join(cmd)} failed:\n{res.stdout[-3000:]}\n{res.stderr[-3000:]}")
    return res


def tiles_slides(output: str) -> dict[str, str]:
    """Tiles key -> slide file name, from the tile jobs of a dry run (`-p`)."""
    return {m.group(2): Path(m.group(1)).stem for m in re.finditer(
        r"rule tile:\n\s+input: (\S+)\n\s+output: \S+/tiles/([0-9a-f]+)\.coords\.h5", output)}


def keyed_stems(paths: str, slides: dict[str, str]) -> set[str]:
    """The slide names of a job's comma-separated tiles entries (``tiles_slides``)."""
    return {slides[Path(p).name.split(".")[0]] for p in paths.split(", ") if p.endswith(".coords.h5")}


def job_counts(output: str) -> dict[str, int]:
    """The first 'Job stats' table of a dry run: rule -> number of jobs."""
    lines = output.splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith("Job stats"))
    counts = {}
    for line in lines[start + 3:]:
        m = re.match(r"^(\S+)\s+(\d+)$", line.strip())
        if not m:
            break
        counts[m.group(1)] = int(m.group(2))
    return counts


@pytest.fixture()
def paper(tmp_path):
    data, work = tmp_path / "data", tmp_path / "work"
    make_dummy_data(data)
    # The demo config sits where the Snakefile's default `configfile:` looks: a study
    # config given with --configfile must replace it, not merge the demo cohorts in.
    (work / "config").mkdir(parents=True)
    (work / "config" / "config.yaml").write_text((REPO / "config" / "config.yaml").read_text())
    return data, work


def _dry_run(work: Path, configfile: Path, data: Path, *extra: str) -> subprocess.CompletedProcess:
    return snakemake(work, "-n", "-p", "--configfile", str(configfile), "--config", f"data_root={data}", *extra)


def test_lint_is_clean(tmp_path):
    res = snakemake(tmp_path, "--lint", "--configfile", str(REPO / "config" / "config.yaml"), check=False)
    assert res.returncode == 0, res.stdout + res.stderr
    assert "Congratulations, your workflow is in a good condition" in res.stdout + res.stderr


def test_paper_study_plans_in_full(paper):
    data, work = paper
    res = _dry_run(work, REPO / "config" / "paper.yaml", data)
    counts = job_counts(res.stdout)
    cfg = yaml.safe_load((REPO / "config" / "paper.yaml").read_text())
    n_variants = sum(len(b["variants"]) for b in cfg["backbones"].values())  # incl. uncompressed
    n_compressed = n_variants - len(cfg["backbones"])
    n_slides = sum(len(ids) for _, _, _, splits, _ in PAPER_DATA.values() for ids in splits.values())
    seeds, heads, tasks = len(cfg["mil"]["seeds"]), len(cfg["mil"]["heads"]), len(cfg["tasks"])
    assert counts["tile"] == n_slides
    assert counts["labels"] == len(PAPER_DATA)
    # both backbones calibrate on the same slides with the same draw: one calibration entry
    assert counts["calibrate"] == 1 and counts["discover"] == len(cfg["backbones"])
    assert counts["compress"] == n_compressed
    assert counts["extract"] == n_variants * len(PAPER_DATA)
    assert counts["train_mil"] == n_variants * tasks * heads  # every seed of a head in one job
    assert f"--seed {' '.join(map(str, cfg['mil']['seeds']))}" in res.stdout + res.stderr
    assert counts["summarize_mil"] == n_variants * tasks * heads
    # the paper config turns the analyses on: norms per teacher, one eps sweep, and the
    # intrinsic-dimension and stability trajectories of every TWT student
    n_twt = sum(v.startswith("twt") for b in cfg["backbones"].values() for v in b["variants"])
    assert counts["analyze_norms"] == len(cfg["backbones"]) and counts["analyze_eps"] == 1
    assert counts["analyze_intrinsic_dim"] == counts["analyze_stability"] == n_twt
    assert counts["report"] == 1
    # one failures table per extracted (backbone variant, cohort), from its slides' entries
    assert counts["view_features"] == counts["extract"]
    assert "results/paper/failures/h0-mini/twt-4/panda.tsv" in res.stdout
    assert re.search(r"--failures logs/paper/extract/[0-9a-f]+/[0-9a-f]+\.failures\.tsv", res.stdout)
    # every output in the study's own folder, named after its config file, or in the store
    assert "demo_slides" not in counts and "/tiles/grading/" not in res.stdout
    assert "results/paper/report/index.html" in res.stdout and "logs/paper/report.log" in res.stdout
    assert not re.search(r"(?<![\w/-])results(?!/(paper|store)\b)", res.stdout)
    # every compression method of the paper is planned
    for method in ("twt", "raptor", "wdpruning", "nose"):
        assert f"--method {method}" in res.stdout
    # calibration tiles come from the PANDA training split only (the paper's Appendix B:
    # not CAMELYON17/16 or TCGA-PRAD)
    blocks = res.stdout.split("rule calibration_list:")[1:]
    assert len(blocks) == 1
    train = set(PAPER_DATA["panda"][3]["train"])
    assert keyed_stems(re.search(r"input: (.*)", blocks[0]).group(1), tiles_slides(res.stdout)) == train
    _assert_paper_compress_jobs(res.stdout, cfg)


# the paper's distillation budgets in epochs over the PANDA training tiles
PAPER_EPOCHS = {"twt-5": 1.5, "twt-4": 2, "raptor-5": 3, "raptor-4": 3, "nose": 2,
                "wdpruning-5": 2, "wdpruning-4": 2}


def _assert_paper_compress_jobs(stdout: str, cfg: dict) -> None:
    """Every compress job streams the PANDA training coords listing (the same list the
    calibration draws from, so no other cohort) with the paper's epoch budget."""
    jobs = [b for b in stdout.split("\nrule ")[1:] if b.startswith("compress:")]
    assert len(jobs) == sum(len(b["variants"]) - 1 for b in cfg["backbones"].values())
    seen = set()
    listings = set()
    for job in jobs:
        assert re.search(r"results/store/models/[0-9a-f]+/model.json", job)
        variant = re.search(r'"variant": "([^"]+)"', job).group(1)  # the names in the entry's record
        command = job[job.index("ranks="):]
        listings.add(re.search(r"--train-coords (results/paper/calibration/[0-9a-f]+\.coords\.txt)", command).group(1))
        assert "--steps" not in command
        epochs = float(re.search(r"--epochs (\S+)", command).group(1))
        if variant in PAPER_EPOCHS:
            assert epochs == PAPER_EPOCHS[variant], (variant, epochs)
            seen.add(variant)
        if variant.startswith("raptor"):
            assert "--option stage1_fraction=0.333333" in command  # 1 epoch of stage 1, then 2
        assert "--precision auto" in command and "nproc-per-node $ranks" in command
    assert seen == set(PAPER_EPOCHS) and len(listings) == 1  # both backbones' calibration is one


def test_adding_a_cohort_adds_exactly_its_jobs(paper, tmp_path):
    data, work = paper
    base_cfg = tmp_path / "small.yaml"
    cfg = yaml.safe_load((REPO / "config" / "paper.yaml").read_text())
    cfg["backbones"] = {"h0-mini": {"variants": ["uncompressed", "twt-4"]}}
    cfg["mil"]["seeds"] = [0, 1]
    base_cfg.write_text(yaml.safe_dump(cfg))
    before = job_counts(_dry_run(work, base_cfg, data).stdout)

    # A new external cohort for metastasis: one YAML entry plus its label table.
    new = {"radboud-ln": ("RADBOUD/slides", "labels/radboud.csv", "label", {"test": ["r1", "r2", "r3", "r4", "r5"]}, ".svs")}
    make_dummy_data(data, new)
    cfg["cohorts"]["radboud-ln"] = {"slides": "RADBOUD/slides", "labels": "labels/radboud.csv", "splits": ["test"],
                                    "tiling": {"tissue": "otsu", "tile_size": 224, "allow_upsample": True},
                                    "modality": "fluorescence", "channels": [2, 0, 1]}
    cfg["tasks"]["metastasis"]["external"].append("radboud-ln")
    grown_cfg = tmp_path / "grown.yaml"
    grown_cfg.write_text(yaml.safe_dump(cfg))
    result = _dry_run(work, grown_cfg, data)
    after = job_counts(result.stdout)
    plan = result.stdout + result.stderr
    # the cohort's modality, channels and upsampling reach its tile jobs, and only those
    tile_commands = [line for line in plan.splitlines() if "pathtwt tile " in line]
    fluorescent = [line for line in tile_commands if "--modality fluorescence --channels 2,0,1 --allow-upsample" in line]
    assert len(fluorescent) == 5 and all("RADBOUD" in line for line in fluorescent)

    n_variants = 2
    # extraction of the new cohort, its features and tiles in the study's folder (and failures table)
    expected = {"tile": 5, "labels": 1, "extract": n_variants, "extract_manifest": n_variants,
                "view_features": n_variants, "view_tiles": 1, "total": 5 + 1 + 3 * n_variants + 1}
    diff = {rule: after.get(rule, 0) - before.get(rule, 0) for rule in set(before) | set(after)}
    assert {k: v for k, v in diff.items() if v} == expected


def test_bad_label_table_stops_before_any_job(paper):
    data, work = paper
    labels = data / "labels" / "camelyon16_slides.csv"
    labels.write_text(labels.read_text() + "n2,1,test\n")
    res = snakemake(work, "-n", "--configfile", str(REPO / "config" / "paper.yaml"), "--config", f"data_root={data}",
                    check=False)
    assert res.returncode != 0
    out = res.stdout + res.stderr  # Snakemake prints parse errors on stdout
    assert "camelyon16_slides.csv: duplicate slide_id" in out and "line 3 ('n2'), line 5 ('n2')" in out
    assert "Job stats" not in res.stdout


def _paper_with_mil(path: Path, **mil) -> Path:
    """config/paper.yaml with some mil keys changed, written to ``path``."""
    cfg = yaml.safe_load((REPO / "config" / "paper.yaml").read_text())
    cfg["mil"].update(mil)
    path.write_text(yaml.safe_dump(cfg))
    return path


def test_a_config_error_names_the_configfile_given(paper, tmp_path):
    data, work = paper
    bad = _paper_with_mil(tmp_path / "study.yaml", seeds="zero")
    res = snakemake(work, "-n", "--configfile", str(bad), "--config", f"data_root={data}", check=False)
    out = res.stdout + res.stderr
    assert res.returncode != 0 and f"{bad} (with --config overrides): key mil.seeds" in out
    assert "config/config.yaml" not in out


def test_a_wrong_extra_args_flag_stops_the_workflow_in_one_line(paper, tmp_path):
    data, work = paper
    bad = _paper_with_mil(tmp_path / "typo.yaml", extra_args="--lr 1e-4 --hiden-dim 64")
    res = snakemake(work, "-n", "--configfile", str(bad), "--config", f"data_root={data}", check=False)
    assert res.returncode == 1
    assert res.stderr.strip().splitlines()[-1] == (
        f"Error: {bad} (with --config overrides): key mil.extra_args: --hiden-dim is not a flag of pathtwt train-mil; fix it "
        "(see pathtwt train-mil --help) or use the mil key of that name")
    assert _dry_run(work, _paper_with_mil(bad, extra_args="--lr 1e-4 --hidden-dim 64"), data).returncode == 0


def test_a_missing_label_table_is_one_line_without_a_traceback_frame(paper, tmp_path):
    data, work = paper
    cfg = yaml.safe_load((REPO / "config" / "paper.yaml").read_text())
    cohort = next(iter(cfg["cohorts"]))
    cfg["cohorts"][cohort]["labels"] = str(tmp_path / "nowhere.csv")
    bad = tmp_path / "study.yaml"
    bad.write_text(yaml.safe_dump(cfg))
    res = snakemake(work, "-n", "--configfile", str(bad), "--config", f"data_root={data}", check=False)
    lines = [line for line in (res.stdout + res.stderr).splitlines() if line.strip()]
    assert res.returncode != 0 and len(lines) == 1, lines
    assert "nowhere.csv" in lines[0] and f"cohorts.{cohort}.labels" in lines[0] and "File \"" not in lines[0]


def test_slurm_profile_plans_the_demo(tmp_path):
    res = snakemake(tmp_path, "-n", "--profile", str(REPO / "workflow" / "profiles" / "slurm"),
                    "--configfile", str(REPO / "config" / "config.yaml"))
    assert job_counts(res.stdout)["demo_slides"] == 1


def test_every_variant_is_probed_with_the_teacher_and_a_random_init_floor(paper, tmp_path):
    data, work = paper
    tiles = tmp_path / "probe-tiles"
    for cls in ("a", "b"):
        (tiles / cls).mkdir(parents=True)
        (tiles / cls / "t_0.png").write_bytes(b"")
    (tiles / "split.csv").write_text("path,split\na/t_0.png,train\nb/t_0.png,test\n")
    cfg = yaml.safe_load((REPO / "config" / "paper.yaml").read_text())
    cfg["backbones"] = {"h0-mini": {"variants": ["uncompressed", "twt-4", "nose"]}}
    cfg["probes"] = {
        "set1": {"tiles": str(tiles), "split_file": str(tiles / "split.csv"), "max_per_class": 7},
        "set2": {"tiles": str(tiles)},
        "absent": {"tiles": str(tmp_path / "nowhere"), "if_missing": "skip"},
    }
    cfg_path = tmp_path / "probes.yaml"
    cfg_path.write_text(yaml.safe_dump(cfg))
    res = _dry_run(work, cfg_path, data)
    assert job_counts(res.stdout)["probe"] == (3 + 1) * 2  # 3 variants + random-init, 2 present sets
    assert "tiles of probe set absent" in res.stderr and "skipping" in res.stderr
    commands = [line.strip() for line in res.stdout.splitlines() if "pathtwt probe " in line]
    floor = [c for c in commands if "/random-init/set1" in c]
    assert len(floor) == 1 and "--backbone h0-mini --random-init" in floor[0]
    assert f"--split-file {tiles / 'split.csv'} --max-per-class 7" in floor[0]
    assert any(re.search(r"--backbone results/store/models/[0-9a-f]+ ", c) and "/twt-4/set2" in c for c in commands)
    teacher = [c for c in commands if "/uncompressed/set2" in c]
    assert len(teacher) == 1 and "--random-init" not in teacher[0] and "--split-file" not in teacher[0]
    # the report waits for every probe
    assert "results/probes/probes/h0-mini/random-init/set1/probe.json" in res.stdout.split("rule report:")[1]

    # a probe set that must be there stops the workflow before any job, naming the key
    cfg["probes"]["absent"]["if_missing"] = "stop"
    cfg_path.write_text(yaml.safe_dump(cfg))
    res = snakemake(work, "-n", "--configfile", str(cfg_path), "--config", f"data_root={data}", check=False)
    assert res.returncode != 0 and "probes.absent.tiles" in res.stdout + res.stderr
    assert "Job stats" not in res.stdout


def test_a_cross_validated_cohort_plans_one_job_per_fold_and_lends_only_its_hold_out_to_compression(tmp_path):
    """draw_split.folds: every (variant, head, fold) is one MIL job; calibration reads the
    compression hold-out only, extraction every other slide; patients stay in one fold."""
    data, work = tmp_path / "data", tmp_path / "work"
    (data / "slides").mkdir(parents=True)
    rows = ["slide_id,label,patient"]
    for i in range(30):
        (data / "slides" / f"s{i:02d}.tif").write_bytes(f"s{i:02d}".encode())  # distinct: one tiles key each
        rows.append(f"s{i:02d},{i // 2 % 2},p{i // 2}")  # 15 patients of 2 slides, one label each
    (data / "labels.csv").write_text("\n".join(rows) + "\n")
    cfg = yaml.safe_load((REPO / "config" / "bach.yaml").read_text())
    cfg["cohorts"]["bach"].update(slides=str(data / "slides"), labels=str(data / "labels.csv"), extensions=[".tif"],
                                  draw_split={"folds": 3, "holdout": 0.2, "seed": 0, "group_column": "patient"})
    cfg["tasks"]["bach"]["classes"] = 2
    weights = tmp_path / "vit_s14.safetensors"  # a dry run plans from the file's name and bytes, never loads it
    weights.write_bytes(b"weights")
    cfg["backbones"]["vit-s14-imgfocus"]["weights"] = str(weights)
    cfg["variants"] = {"uncompressed": {"method": "none"}, "twt-6": {"method": "twt", "depth": 6}}
    path = tmp_path / "cv.yaml"
    path.write_text(yaml.safe_dump(cfg))
    res = snakemake(work, "-n", "-p", "--configfile", str(path))
    counts = job_counts(res.stdout)
    heads = len(cfg["mil"]["heads"])
    assert counts["train_mil_fold"] == 2 * heads * 3 and counts["summarize_mil"] == 2 * heads
    assert "--group-column patient --holdout 0.2" in res.stdout
    from pathtwt.config import check

    table = check.cohort_label_table(check.validate_schema(cfg, source="t"), "bach")
    held = {s for s, f in zip(table.slide_ids, table.folds) if f == -1}
    assert 0 < len(held) < 30
    patient = {s: int(s[1:]) // 2 for s in table.slide_ids}
    fold_of = {}
    for s, f in zip(table.slide_ids, table.folds):
        assert fold_of.setdefault(patient[s], f) == f  # a patient's slides share a fold (or the hold-out)
    slides = tiles_slides(res.stdout)
    block = res.stdout.split("rule calibration_list:")[1]
    assert keyed_stems(re.search(r"input: (.*)", block).group(1), slides) == held
    block = res.stdout.split("rule extract:")[1]
    assert keyed_stems(re.search(r"input: (.*)", block).group(1), slides) == set(table.slide_ids) - held
    runs = set(re.findall(r"results/cv/mil/vit-s14-imgfocus/twt-6/bach/abmil/fold(\d)/seed0/metrics.json", res.stdout))
    assert runs == {"0", "1", "2"}


def test_folds_with_fractions_or_without_a_compression_hold_out_are_refused(tmp_path):
    cfg = yaml.safe_load((REPO / "config" / "bach.yaml").read_text())
    for draw, key in (({"folds": 5, "fractions": [0.6, 0.2, 0.2]}, "give `folds` or `fractions`, not both"),
                      ({"folds": 5}, "draw_split.holdout: backbone vit-s14-imgfocus is compressed on cohort bach"),
                      ({"fractions": [0.6, 0.2, 0.2], "holdout": 0.2}, "draw_split.holdout: only with `folds`")):
        cfg["cohorts"]["bach"]["draw_split"] = draw
        path = tmp_path / "bad.yaml"
        path.write_text(yaml.safe_dump(cfg))
        res = snakemake(tmp_path / "w", "-n", "--configfile", str(path), check=False)
        assert res.returncode != 0 and key in res.stdout + res.stderr, res.stdout[-2000:]
        assert "Job stats" not in res.stdout
