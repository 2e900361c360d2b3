"""The maintained benchmarks as a suite: every script directly under benchmarks/ states its
contract (Measures:, Command:, JSON keys:) and is run in its smallest mode by a test, so a
benchmark that no longer runs fails here; the records of past studies stay apart
(benchmarks/studies/, each with its commit), and benchmarks/results/README.md accounts for
every result it keeps.

The smallest modes run as the contract's first command does, in a fresh process with one
compute thread; their numbers mean nothing at that size, so only the JSON's keys and
the signs and relations that hold at any size are checked."""

from __future__ import annotations

import ast
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import SHARED, SHARED_BACH, SHARED_SLIDES

REPO = Path(__file__).resolve().parents[1]
BENCHMARKS = REPO / "benchmarks"
STUDIES = BENCHMARKS / "studies"
LABELS = ("Measures:", "Command:", "JSON keys:")
# Maintained scripts whose contract paragraphs come with their own changes (the GPU smoke
# run's scripts and the distillation check); every other maintained script must have them.
CONTRACT_WITH_ITS_OWN_CHANGE = {"device_check.py", "distill_check.py", "smoke_wheels.py"}


def maintained_scripts() -> list[Path]:
    """The scripts directly under benchmarks/ (a module with a ``__main__`` block): the
    maintained set. Helpers without one (host_waits.py) are imported by scripts and tests."""
    return sorted(p for p in BENCHMARKS.glob("*.py") if "__main__" in p.read_text(encoding="utf-8"))


def docstring(path: Path) -> str:
    return ast.get_docstring(ast.parse(path.read_text(encoding="utf-8"))) or ""


def test_every_maintained_script_states_its_contract():
    missing = {}
    for script in maintained_scripts():
        if script.name in CONTRACT_WITH_ITS_OWN_CHANGE:
            continue
        doc = docstring(script)
        lacking = [label for label in LABELS if not re.search(rf"^{re.escape(label)} \S", doc, re.MULTILINE)]
        if lacking:
            missing[script.name] = lacking
            continue
        command = doc.split("Command:", 1)[1].split("JSON keys:", 1)[0]
        if f"benchmarks/{script.name}" not in command:
            missing[script.name] = [f"a Command: paragraph naming benchmarks/{script.name}"]
    assert not missing, f"benchmarks without their contract paragraphs (docs/development.md): {missing}"


def test_every_maintained_script_is_run_by_a_test():
    tests = {p: p.read_text(encoding="utf-8") for p in (REPO / "tests").glob("test_*.py")}
    unrun = [s.name for s in maintained_scripts() if not any(s.name in text for text in tests.values())]
    assert not unrun, f"maintained benchmarks no test names (add its smallest mode to SMALLEST below): {unrun}"


def test_the_records_are_apart_each_with_its_commit():
    """benchmarks/studies/README.md lists every record script with the commit it ran at,
    and no maintained script or test runs one."""
    readme = (STUDIES / "README.md").read_text(encoding="utf-8")
    rows = {line.split("|")[1].strip(): line for line in readme.splitlines() if line.startswith("| `")}
    for script in sorted(STUDIES.glob("*.py")):
        row = next((line for key, line in rows.items() if key.startswith(f"`{script.name}`")), None)
        assert row is not None, f"benchmarks/studies/README.md does not list {script.name}"
        assert re.search(r"\b[0-9a-f]{7}\b", row), f"benchmarks/studies/README.md: no commit for {script.name}"
    records = {p.name for p in STUDIES.glob("*.py")}
    assert records, "benchmarks/studies holds the records of past studies"
    assert not records & {p.name for p in BENCHMARKS.glob("*.py")}, "a record is also in the maintained set"
    for text in [p.read_text(encoding="utf-8") for p in (REPO / "tests").glob("test_*.py")]:
        for name in records:
            assert f"studies/{name}" not in text and f'"studies" / "{name}"' not in text, \
                f"a test runs the record {name}: records are not maintained"


def test_the_results_readme_accounts_for_every_result():
    """benchmarks/results/README.md names each file and folder it keeps, with the commit or
    date and the command it came from."""
    readme = (BENCHMARKS / "results" / "README.md").read_text(encoding="utf-8")
    unlisted = [p.name for p in (BENCHMARKS / "results").iterdir()
                if p.name != "README.md" and f"`{p.name}" not in readme]
    assert not unlisted, f"benchmarks/results/README.md does not say where these came from: {unlisted}"


def _need_shared(*paths: Path) -> None:
    for path in paths:
        if not path.exists():
            pytest.skip(f"real test data not available: {path} is absent (../shared is not checked out beside the repo)")


def _run(args: list[str], timeout: int = 300, ok: tuple[int, ...] = (0,)) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(REPO), "PATHTWT_SHARED": str(SHARED), "OMP_NUM_THREADS": "1"}
    for launcher in ("WORLD_SIZE", "RANK", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT"):
        env.pop(launcher, None)
    res = subprocess.run([sys.executable, *args], cwd=REPO, env=env, capture_output=True, text=True, timeout=timeout)
    assert res.returncode in ok, f"{' '.join(args)} exited {res.returncode}:\n{res.stderr[-3000:]}"
    return res


def _printed_json(res: subprocess.CompletedProcess) -> dict:
    text = res.stdout
    return json.loads(text[text.index("{"):])


def test_area_shrink_speed_smallest(tmp_path):
    out = tmp_path / "out.json"
    _run(["benchmarks/area_shrink_speed.py", "--batch", "4", "--repeat", "1", "--sides", "267", "448",
          "--json", str(out)])
    data = json.loads(out.read_text())
    assert {"cpu", "avx2", "avx512f", "path", "first_call_s", "rows"} <= data.keys()
    assert [r["side"] for r in data["rows"]] == [267, 448]
    assert data["rows"][1]["route"] == "OpenCV (whole factor)"  # 448 -> 224 is a whole factor
    assert all(r["cv2_over_area_shrink"] > 0 and r["median_us"]["ours"] > 0 for r in data["rows"])


def test_tiling_speed_smallest(tmp_path):
    res = _run(["benchmarks/tiling_speed.py", "--width", "4096", "--height", "4096", "--repeat", "1",
                "--cache", str(tmp_path)], ok=(0, 1))
    data = _printed_json(res)
    assert data["tiles_kept"] > 0 and data["mask_read_s"] > 0 and data["tile_s"] > 0
    # exit 1 says the target was missed (at this size the fixed costs dominate)
    assert res.returncode == int(data["ratio"] > data["target_ratio"])


def test_transmil_memory_smallest(tmp_path):
    out = tmp_path / "out.json"
    _run(["benchmarks/transmil_memory.py", "--sizes", "200", "400", "--dim", "64", "--threads", "1",
          "--json", str(out)])
    rows = json.loads(out.read_text())["rows"]
    assert [r["tiles"] for r in rows] == [200, 400]
    assert all(r["peak_rss_mb"] > 0 and r["tokens"] > r["tiles"] for r in rows)


def test_extract_memory_smallest():
    data = _printed_json(_run(["benchmarks/extract_memory.py", "--slides", "3", "--checkpoint", "2"]))
    assert data["slides"] == 3 and data["tiles_total"] > 0
    assert data["peak_rss_mb_after_3"] >= data["peak_rss_mb_after_2"] > 0
    assert data["peak_growth_mb_10_to_end"] >= 0


def test_cpu_precision_smallest(tmp_path):
    out = tmp_path / "out.json"
    _run(["benchmarks/cpu_precision.py", "--threads", "1", "--mm-n", "256", "--backbones", "vit-s14-tiny",
          "--batch", "2", "--train-batch", "2", "--rounds", "1", "--json", str(out)])
    data = json.loads(out.read_text())
    assert {"machine", "mm_gflops", "forward", "train", "ratios", "seconds"} <= data.keys()
    assert data["mm_gflops"]["fp32"] > 0 and set(data["forward"]) == set(data["train"]) == {"vit-s14-tiny"}


def test_extract_throughput_smallest():
    _need_shared(SHARED_SLIDES / "CMU-1-Small-Region.svs")
    data = _printed_json(_run(["benchmarks/extract_throughput.py", "--backbone", "vit-s14-tiny", "--batch-sizes", "2",
                               "--depths", "12,5", "--rounds", "1", "--matmul-n", "256", "--extract-tiles", "8",
                               "--workers", "0"]))
    assert {"machine", "matmul", "forward", "extract", "bf16", "ratios", "targets_met"} <= data.keys()
    assert set(data["forward"]["depths"]) == {"12", "5"}
    assert data["ratios"]["mac_ratio_12_over_5"] > 2 and data["extract"]["tiles_per_s"] > 0


def test_extract_variants_smallest():
    _need_shared(SHARED_SLIDES / "CMU-1-Small-Region.svs")
    data = _printed_json(_run(["benchmarks/extract_variants.py", "--backbone", "vit-s14-tiny", "--depths", "12,6",
                               "--rounds", "1", "--batch-size", "8"]))
    assert data["cohort"]["tiles"] > 0
    assert {v["depth"] for v in data["variants"].values()} == {12, 6}
    assert all(v["ratio"] > 0 for v in data["variants"].values())


def test_reader_throughput_smallest(tmp_path):
    _need_shared(SHARED_SLIDES / "CMU-1-Small-Region.svs")
    out = tmp_path / "out.json"
    _run(["benchmarks/reader_throughput.py", "--rows", "1", "--jobs", "2", "--cases", "svs", "--json", str(out)])
    data = json.loads(out.read_text())
    svs = data["cases"]["svs"]
    assert svs["tiles"] > 0 and svs["limit"] > 0 and svs["new"] > 0
    assert svs["extract_tiles_per_s"]["1"] > 0 and data["model_only_tiles_per_s"] > 0


def test_decode_tolerance_smallest(tmp_path):
    _need_shared(SHARED_SLIDES / "CMU-1-Small-Region.svs", SHARED_BACH)
    out = tmp_path / "out.json"
    _run(["benchmarks/decode_tolerance.py", "--bach", "2", "--json", str(out)])
    data = json.loads(out.read_text())
    assert "fancy" in data["decoders"] and data["sets"]
    assert all(s["streams"] > 0 for s in data["sets"].values())


def test_distill_throughput_smallest(tmp_path):
    _need_shared(SHARED_SLIDES / "CMU-1-Small-Region.svs")
    out = tmp_path / "out.json"
    _run(["benchmarks/distill_throughput.py", "--steps", "4", "--batch-size", "4", "--rss-tiles", "64", "--files", "2",
          "--workers", "1", "--threads", "1", "--json", str(out)])
    data = json.loads(out.read_text())
    assert data["in_memory_tiles_per_s"] > 0 and data["streamed_tiles_per_s"] > 0
    assert set(data["peak_rss_mib"]) == {"6", "64"}  # a tenth of --rss-tiles when that is under 1,000
    assert data["fp32"]["held_out_tiles"] == data["bf16"]["held_out_tiles"] > 0


def test_feed_rate_smallest(tmp_path):
    _need_shared(SHARED_BACH)
    data = _printed_json(_run(["benchmarks/feed_rate.py", "--make", str(tmp_path / "slides"), "--quick", "--json"]))
    assert set(data["reader_us_per_tile"]) == set(data["tiles"]) == {"20x", "40x"}
    assert data["host_us_per_tile"] > 0 and data["torch_ops_per_batch"] > 0 and data["decode_amplification"] >= 1
    assert 0 < data["tiles"]["40x"] < data["tiles"]["20x"]  # 2 x 2 images: 40x reads 448 px a tile


def test_plan_time_smallest(tmp_path):
    out = tmp_path / "out.json"
    _run(["benchmarks/plan_time.py", "--base", "HEAD", "--scale", "0.003", "--rounds", "1", "--json", str(out)],
         timeout=600)
    data = json.loads(out.read_text())
    assert data["slides"] > 0 and data["jobs"]["store"] > 0 and data["jobs"]["base"] > 0
    assert len(data["times"]["base"]) == len(data["times"]["store"]) == 1 and data["ratio_warm"] > 0


def test_compress_phases_smallest(tmp_path):
    from rank_faults import write_tiles

    tiles = write_tiles(tmp_path / "tiles", 8)
    out = tmp_path / "out.json"
    job = (f"--method twt --backbone vit-s14-tiny --random-init --calibration {tiles} --depth 2 --steps 2 "
           f"--batch-size 4 --audition-steps 0 --device cpu --precision fp32 --no-progress --out {tmp_path / 'student'}")
    _run(["benchmarks/compress_phases.py", "--job", job, "--json", str(out)])
    data = json.loads(out.read_text())
    (only,) = data["jobs"]
    assert only["wall_s"] > 0 and only["phases"] and data["discover"] is None and data["startup_s"] > 0
    assert (tmp_path / "student" / "model.safetensors").exists()


def test_compare_demo_tables_smallest(tmp_path):
    results = BENCHMARKS / "results"
    res = _run(["benchmarks/compare_demo_tables.py", str(results / "demo_bf16_a72522b" / "tables.md"),
                str(results / "demo_bf16_21d7917" / "tables.md")])
    assert res.stdout.startswith("|") and "teacher" in res.stdout
    # --choices reads a results folder; the stored runs keep meanpool's choices as JSON
    folder = tmp_path / "results" / "mil" / "vit" / "twt-6" / "grading" / "meanpool" / "seed0"
    folder.mkdir(parents=True)
    (folder / "metrics.json").write_text(json.dumps({"selection": {"C": 0.01}}))
    out = tmp_path / "choices.json"
    _run(["benchmarks/compare_demo_tables.py", "--choices", str(tmp_path / "results"), "--json", str(out)])
    assert json.loads(out.read_text()) == {"twt-6/grading/seed0": 0.01}


def test_workflow_times_smallest(tmp_path):
    from test_workflow_times import LOG

    log = tmp_path / "run.snakemake.log"
    log.write_text(LOG)
    out = tmp_path / "out.json"
    _run(["benchmarks/workflow_times.py", str(log), "--json", str(out)])
    assert json.loads(out.read_text()) == {"log": str(log), "wall_s": 99.0,
                                           "rules": {"tile": [5.0, 8.0], "demo_slides": [90.0]}}
