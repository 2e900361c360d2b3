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
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import SHARED, SHARED_BACH, SHARED_SLIDES

REPO = Path(__file__).resolve().parents[1]
BENCHMARKS = REPO / "benchmarks"
STUDIES = BENCHMARKS / "studies"
LABELS = ("Measures:", "Command:", "JSON keys:")


def maintained_scripts() -> list[Path]:
    """The scripts directly under benchmarks/ (a module with a ``__main__`` block): the
    maintained set. Helpers without one (host_waits.py) are imported by scripts and tests."""
    return sorted(p for p in BENCHMARKS.glob("*.py") if "__main__" in p.read_text(encoding="utf-8"))


def docstring(path: Path) -> str:
    return ast.get_docstring(ast.parse(path.read_text(encoding="utf-8"))) or ""


def test_every_maintained_script_states_its_contract():
    missing = {}
    for script in maintained_scripts():
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
    assert not unrun, f"maintained benchmarks no test names (a test runs its smallest mode: tests/test_benchmark_suite.py): {unrun}"


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


def smallest_command(script: str) -> list[str]:
    """The first command of the script's Command: paragraph (its smallest mode), as words;
    the environment assignments before it are the runner's (:func:`_run` sets them)."""
    doc = " ".join(docstring(BENCHMARKS / script).split())
    assert "Command:" in doc, f"benchmarks/{script} states no Command: paragraph (docs/development.md)"
    command = re.search(r"`([^`]+)`", doc.split("Command:", 1)[1].split("JSON keys:", 1)[0])
    assert command, f"benchmarks/{script}: its Command: paragraph has no `command` in backquotes"
    words = shlex.split(command.group(1))
    while "=" in words[0]:
        words.pop(0)
    assert words[0].endswith("python") and words[1] == f"benchmarks/{script}", words
    return words[1:]


def documented_keys(script: str) -> set[str]:
    """The names the script's JSON keys: paragraph writes in backquotes."""
    doc = " ".join(docstring(BENCHMARKS / script).split())
    assert "JSON keys:" in doc, f"benchmarks/{script} states no JSON keys: paragraph (docs/development.md)"
    return set(re.findall(r"`([^`]+)`", doc.split("JSON keys:", 1)[1]))


def run_smallest(script: str, tmp_path: Path, timeout: int = 300, ok: tuple[int, ...] = (0,),
                 **names: Path) -> tuple[subprocess.CompletedProcess, Path]:
    """Run the contract's smallest command with its placeholders (out.json, and the upper-case
    names given, e.g. DIR) replaced by paths under ``tmp_path``; the process and out.json's path."""
    out = tmp_path / "out.json"
    names = {"out.json": out, **names}
    pattern = re.compile("|".join(rf"(?<![\w/.]){re.escape(k)}(?![\w/])" for k in names))
    words = [pattern.sub(lambda m: str(names[m.group(0)]), w) for w in smallest_command(script)]
    return _run(words, timeout=timeout, ok=ok), out


def _run(args: list[str], timeout: int = 300, ok: tuple[int, ...] = (0,)) -> subprocess.CompletedProcess:
    """A benchmark in a fresh process from the repository root, with the package on the path
    and one compute thread (the test process's worker has its share of the cores)."""
    env = {**os.environ, "PYTHONPATH": str(REPO), "PATHTWT_SHARED": str(SHARED), "OMP_NUM_THREADS": "1"}
    for launcher in ("WORLD_SIZE", "RANK", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT"):
        env.pop(launcher, None)
    res = subprocess.run([sys.executable, *args], cwd=REPO, env=env, capture_output=True, text=True, timeout=timeout)
    assert res.returncode in ok, f"{' '.join(args)} exited {res.returncode}:\n{res.stderr[-3000:]}"
    return res


def _printed_json(res: subprocess.CompletedProcess) -> dict:
    text = res.stdout
    return json.loads(text[text.index("{"):])


def _documented(script: str, data: dict) -> dict:
    """``data``, once every key of it is one the contract's JSON keys: paragraph names (a
    trailing count written N there)."""
    keys = {re.sub(r"_\d+$", "_N", key) for key in data}
    assert keys <= documented_keys(script), f"{script} writes keys its contract does not name: {keys - documented_keys(script)}"
    return data


def test_area_shrink_speed_smallest(tmp_path):
    _, out = run_smallest("area_shrink_speed.py", tmp_path)
    data = _documented("area_shrink_speed.py", json.loads(out.read_text()))
    assert [r["side"] for r in data["rows"]] == [267, 448]
    assert data["rows"][1]["route"] == "OpenCV (whole factor)"  # 448 -> 224 is a whole factor
    assert all(r["cv2_over_area_shrink"] > 0 and r["median_us"]["ours"] > 0 for r in data["rows"])


def test_tiling_speed_smallest(tmp_path):
    res, _ = run_smallest("tiling_speed.py", tmp_path, ok=(0, 1), DIR=tmp_path / "slides")
    data = _documented("tiling_speed.py", _printed_json(res))
    assert data["tiles_kept"] > 0 and data["mask_read_s"] > 0 and data["tile_s"] > 0
    # exit 1 says the target was missed (at this size the fixed costs dominate)
    assert res.returncode == int(data["ratio"] > data["target_ratio"])


def test_transmil_memory_smallest(tmp_path):
    _, out = run_smallest("transmil_memory.py", tmp_path)
    rows = _documented("transmil_memory.py", json.loads(out.read_text()))["rows"]
    assert [r["tiles"] for r in rows] == [200, 400]
    assert all(r["peak_rss_mb"] > 0 and r["tokens"] > r["tiles"] for r in rows)


def test_extract_memory_smallest(tmp_path):
    res, _ = run_smallest("extract_memory.py", tmp_path)
    data = _documented("extract_memory.py", _printed_json(res))
    assert data["slides"] == 3 and data["tiles_total"] > 0
    assert data["peak_rss_mb_after_3"] >= data["peak_rss_mb_after_2"] > 0
    assert data["peak_growth_mb_10_to_end"] >= 0


def test_cpu_precision_smallest(tmp_path):
    _, out = run_smallest("cpu_precision.py", tmp_path)
    data = _documented("cpu_precision.py", json.loads(out.read_text()))
    assert data["mm_gflops"]["fp32"] > 0 and set(data["forward"]) == set(data["train"]) == {"vit-s14-tiny"}


def test_extract_throughput_smallest(tmp_path):
    _need_shared(SHARED_SLIDES / "CMU-1-Small-Region.svs")
    res, _ = run_smallest("extract_throughput.py", tmp_path)
    data = _documented("extract_throughput.py", _printed_json(res))
    assert set(data["forward"]["depths"]) == {"12", "5"}
    assert data["ratios"]["mac_ratio_12_over_5"] > 2 and data["extract"]["tiles_per_s"] > 0


def test_extract_variants_smallest(tmp_path):
    _need_shared(SHARED_SLIDES / "CMU-1-Small-Region.svs")
    res, _ = run_smallest("extract_variants.py", tmp_path)
    data = _documented("extract_variants.py", _printed_json(res))
    assert data["cohort"]["tiles"] > 0
    assert {v["depth"] for v in data["variants"].values()} == {12, 6}
    assert all(v["ratio"] > 0 for v in data["variants"].values())


def test_reader_throughput_smallest(tmp_path):
    _need_shared(SHARED_SLIDES / "CMU-1-Small-Region.svs")
    _, out = run_smallest("reader_throughput.py", tmp_path)
    data = _documented("reader_throughput.py", json.loads(out.read_text()))
    svs = data["cases"]["svs"]
    assert svs["tiles"] > 0 and svs["limit"] > 0 and svs["new"] > 0
    assert svs["extract_tiles_per_s"]["1"] > 0 and data["model_only_tiles_per_s"] > 0


def test_decode_tolerance_smallest(tmp_path):
    _need_shared(SHARED_SLIDES / "CMU-1-Small-Region.svs", SHARED_BACH)
    _, out = run_smallest("decode_tolerance.py", tmp_path)
    data = _documented("decode_tolerance.py", json.loads(out.read_text()))
    assert "fancy" in data["decoders"] and data["sets"]
    assert all(s["streams"] > 0 for s in data["sets"].values())


def test_distill_throughput_smallest(tmp_path):
    _need_shared(SHARED_SLIDES / "CMU-1-Small-Region.svs")
    _, out = run_smallest("distill_throughput.py", tmp_path)
    data = _documented("distill_throughput.py", json.loads(out.read_text()))
    assert data["in_memory_tiles_per_s"] > 0 and data["streamed_tiles_per_s"] > 0
    assert set(data["peak_rss_mib"]) == {"6", "64"}  # a tenth of --rss-tiles when that is under 1,000
    assert data["fp32"]["held_out_tiles"] == data["bf16"]["held_out_tiles"] > 0


def test_feed_rate_smallest(tmp_path):
    _need_shared(SHARED_BACH)
    res, _ = run_smallest("feed_rate.py", tmp_path, DIR=tmp_path / "slides")
    data = _documented("feed_rate.py", _printed_json(res))
    assert set(data["reader_us_per_tile"]) == set(data["tiles"]) == {"20x", "40x"}
    assert data["host_us_per_tile"] > 0 and data["torch_ops_per_batch"] > 0 and data["decode_amplification"] >= 1
    assert 0 < data["tiles"]["40x"] < data["tiles"]["20x"]  # 2 x 2 images: 40x reads 448 px a tile


def test_plan_time_smallest(tmp_path):
    _, out = run_smallest("plan_time.py", tmp_path, timeout=600)
    data = _documented("plan_time.py", json.loads(out.read_text()))
    assert data["slides"] > 0 and data["jobs"]["store"] > 0 and data["jobs"]["base"] > 0
    assert len(data["times"]["base"]) == len(data["times"]["store"]) == 1 and data["ratio_warm"] > 0


def test_compress_phases_smallest(tmp_path):
    from rank_faults import write_tiles

    tiles = write_tiles(tmp_path / "tiles", 8)
    _, out = run_smallest("compress_phases.py", tmp_path, TILES=tiles, OUT=tmp_path / "student")
    data = _documented("compress_phases.py", json.loads(out.read_text()))
    (only,) = data["jobs"]
    assert only["wall_s"] > 0 and only["phases"] and data["discover"] is None and data["startup_s"] > 0
    assert (tmp_path / "student" / "model.safetensors").exists()


def test_compare_demo_tables_smallest(tmp_path):
    res, _ = run_smallest("compare_demo_tables.py", tmp_path)
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
    _, out = run_smallest("workflow_times.py", tmp_path, LOG=log)
    assert _documented("workflow_times.py", json.loads(out.read_text())) == {
        "log": str(log), "wall_s": 99.0, "rules": {"tile": [5.0, 8.0], "demo_slides": [90.0]}}
