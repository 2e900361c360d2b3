"""The store's parts without Snakemake: keys, the table of value-changing settings, records
checked against their keys, locks, publishing by rename, a cohort's extraction by claimed
slides, the study's views, ls/du/gc, and the faults: a store that cannot be written or is
full, a record that disagrees with its key, a slide or weights file changed, two writers
of one entry at once."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from pathtwt.config import store_keys
from pathtwt.config.check import load_schema, validate_schema
from pathtwt.errors import OutputError, StoreError
from pathtwt.io.store import lock as store_lock
from pathtwt.io.store.features_set import SlideJob, make_features_set
from pathtwt.io.store.keys import entry_key
from pathtwt.io.store.layout import Store
from pathtwt.io.store.lock import EntryLock
from pathtwt.io.store.maintenance import list_lines, remove, unused, usage
from pathtwt.io.store.make import Target, make_entry
from pathtwt.io.store.records import new_record, read_checked
from pathtwt.io.store.views import features_view, products_before_the_store, tiles_view

PATHTWT = [sys.executable, "-m", "pathtwt"]


# ---- keys and the table they come from ------------------------------------------------------


def test_a_key_is_its_inputs_and_nothing_else():
    a = entry_key("tiles", {"tiling": {"tile_size": 224, "target_mpp": 1}, "slide": {"sha256": "x"}})
    assert a == entry_key("tiles", {"slide": {"sha256": "x"}, "tiling": {"target_mpp": 1.0, "tile_size": 224.0}})
    assert a != entry_key("tiles", {"tiling": {"tile_size": 256, "target_mpp": 1}, "slide": {"sha256": "x"}})
    assert a != entry_key("calibration", {"tiling": {"tile_size": 224, "target_mpp": 1}, "slide": {"sha256": "x"}})
    assert len(a) == 24 and int(a, 16) >= 0


def _schema_section(path: tuple[str, ...]) -> dict:
    node = load_schema()["properties"]
    for part in path:
        node = node[part] if part != "*" else node["additionalProperties"]
        node = node.get("properties", node)
    return node


@pytest.mark.parametrize("section", sorted(store_keys.SETTINGS), ids=".".join)
def test_every_setting_of_a_stored_stage_is_classed(section):
    """A new key in a stage that makes stored products must be classed (value-changing, a
    file's content, or how it runs), so none is forgotten from the keys silently."""
    keys = set(_schema_section(section)) - {"tiling"}
    classed = store_keys.SETTINGS[section]
    assert keys == set(classed), f"classify {sorted(keys - set(classed))} / drop {sorted(set(classed) - keys)}"
    assert set(classed.values()) <= {store_keys.VALUE, store_keys.CONTENT, store_keys.RUN}


def test_what_changes_no_value_is_in_no_key():
    run = {s: [k for k, c in table.items() if c == store_keys.RUN] for s, table in store_keys.SETTINGS.items()}
    assert {"batch_size", "threads", "per_slide_jobs"} <= set(run[("extract",)])
    assert "batch_size" in run[("discovery",)] and "threads" in run[("compress",)]
    assert {"precision", "embedding", "decode", "device"} <= set(store_keys.values(("extract",), {}))


# ---- a study's keys: a change reaches exactly the products made from it ----------------------


def _products(tmp_path: Path, **changes):
    """StudyProducts of a one-cohort study over three small slide files (distinct bytes)."""
    from pathtwt.config.check import LabelTable
    from pathtwt.config.products import StudyProducts

    slides = tmp_path / "slides"
    slides.mkdir(exist_ok=True)
    for s in ("a", "b", "c"):
        if not (slides / f"{s}.svs").exists():
            (slides / f"{s}.svs").write_bytes(s.encode() * 100)
    weights = tmp_path / "w.safetensors"
    if not weights.exists():
        weights.write_bytes(b"weights")
    cfg = {"cohorts": {"c": {"slides": str(slides), "labels": "x.csv", "tiling": {"tile_size": 224}}},
           "tasks": {"t": {"cohort": "c"}}, "backbones": {"vit-s14-tiny": {"weights": str(weights)}},
           "variants": {"uncompressed": {"method": "none"}, "twt-2": {"method": "twt", "depth": 2}},
           "store": str(tmp_path / "store")}
    for dotted, value in changes.items():
        node = cfg
        *parents, last = dotted.split(".")
        for part in parents:
            node = node.setdefault(part, {})
        node[last] = value
    config = validate_schema(cfg, source="t")
    config["study"] = "s"
    table = LabelTable(Path("x.csv"), ("a", "b", "c"), ("0", "1", "0"), ("train", "train", "test"))
    return StudyProducts(config, table_of=lambda c: table, slide_paths_of=lambda c: {s: slides / f"{s}.svs" for s in "abc"},
                         cache=tmp_path / "cache", say=lambda line: None)


def _keys(p) -> dict[str, set[str]]:
    out: dict[str, set[str]] = {}
    for name, _, names in p.study_entries():
        out.setdefault(names["kind"] + ("-set" if "/sets/" in name else ""), set()).add(name)
    return out


@pytest.mark.parametrize("change, reached", [
    ({"extract.precision": "fp32"}, {"features", "features-set"}),
    ({"extract.batch_size": 7, "extract.threads": 3, "discovery.batch_size": 5, "compress.threads": 4}, set()),
    ({"cohorts.c.tiling.tile_size": 256}, {"tiles", "calibration", "discovery", "models", "features", "features-set"}),
    ({"cohorts.c.tiling.target_mpp": 0.6}, {"tiles", "calibration", "discovery", "models", "features", "features-set"}),
    ({"compress.lr": 1e-4}, {"models", "features", "features-set"}),
    ({"calibration.seed": 3}, {"calibration", "discovery", "models", "features", "features-set"}),
])
def test_a_changed_setting_reaches_exactly_the_products_made_from_it(tmp_path, change, reached):
    base = _keys(_products(tmp_path))
    changed = _keys(_products(tmp_path, **change))
    assert {kind for kind in base if base[kind] != changed[kind]} == reached


def test_a_slide_or_weights_file_changed_under_its_name_gets_new_keys(tmp_path):
    before = _products(tmp_path)
    tiles, models = before.tiles_key("c", "a"), before.model_key("vit-s14-tiny", "twt-2")
    before.fingerprints.save()
    again = _products(tmp_path)
    assert again.tiles_key("c", "a") == tiles and again.fingerprints.hashed == 0  # kept by file identity
    (tmp_path / "slides" / "a.svs").write_bytes(b"A" * 100)  # same name and size, other bytes
    lines = []
    changed = _products(tmp_path)
    changed.say = lines.append
    assert changed.tiles_key("c", "a") != tiles and changed.tiles_key("c", "b") == before.tiles_key("c", "b")
    (tmp_path / "w.safetensors").write_bytes(b"other weights")
    assert changed.model_key("vit-s14-tiny", "twt-2") != models
    assert len(lines) == 1 and "w.safetensors changed since they were last hashed" in lines[0]


# ---- records, publishing, locks -------------------------------------------------------------


def _tiles_target(store: Store, inputs: dict) -> Target:
    record = new_record("tiles", inputs, {"slide": "a"})
    entry = store.tiles(record["key"])
    entry.coords.parent.mkdir(parents=True, exist_ok=True)  # as Snakemake makes its outputs' folders
    return Target(entry.record, record, [entry.coords, entry.thumbnail])


def _writes(target: Target, status: int = 0, size: int = 1):
    """A command that writes the entry's files and exits with ``status``."""
    def run():
        for f in target.files:
            f.write_bytes(b"x" * size)
        return status
    return run


def test_an_entry_is_published_by_its_record_and_a_failed_command_leaves_none(tmp_path):
    store = Store(tmp_path / "store")
    target = _tiles_target(store, {"slide": "a"})
    assert make_entry(store, target, _writes(target, 3), say=print) == 3
    assert not target.record_path.exists() and not Store(store.root).has_tiles(target.record["key"])
    assert make_entry(store, target, _writes(target), say=print) == 0
    assert Store(store.root).has_tiles(target.record["key"])
    said = []
    assert make_entry(store, target, lambda: pytest.fail("made twice"), say=said.append) == 0
    assert "made by another run meanwhile" in said[-1]
    target.files[1].unlink()  # a file of the entry deleted by hand: the entry is made again
    assert not Store(store.root).has_tiles(target.record["key"])
    assert make_entry(store, target, _writes(target), say=said.append) == 0 and target.files[1].exists()


def test_a_folder_entry_is_renamed_into_place_whole(tmp_path):
    store = Store(tmp_path / "store")
    record = new_record("model", {"m": 1})
    folder = store.model(record["key"])
    folder.mkdir(parents=True)  # as Snakemake leaves it: the outputs' folder, empty
    target = Target(folder, record, [Store.building(folder) / "model.json"], folder=True)

    def run():
        assert not (folder / "entry.json").exists()
        (Store.building(folder) / "model.json").write_text("{}")
        return 0

    assert make_entry(store, target, run, say=print) == 0
    assert sorted(p.name for p in folder.iterdir()) == ["entry.json", "model.json"]
    assert not Store.building(folder).exists()


def test_a_record_that_disagrees_with_its_key_is_refused_in_one_line(tmp_path):
    store = Store(tmp_path / "store")
    target = _tiles_target(store, {"slide": "a"})
    make_entry(store, target, _writes(target), say=print)
    record = json.loads(target.record_path.read_text())
    record["inputs"]["slide"] = "b"  # corrupted, or another entry's record moved here by hand
    target.record_path.write_text(json.dumps(record))
    with pytest.raises(StoreError) as err:
        tiles_view(store, tmp_path / "v" / "tiles", tmp_path / "v" / "thumbs", {"a": target.record["key"]})
    message = str(err.value)
    assert "\n" not in message and str(target.record_path) in message and "delete the entry" in message
    assert not (tmp_path / "v" / "tiles").exists()


def test_a_lock_is_held_by_one_writer_and_a_dead_writers_lock_is_broken(tmp_path, monkeypatch):
    store = Store(tmp_path / "store")
    entry = store.model("k")
    first, second = EntryLock(store, entry), EntryLock(store, entry)
    assert first.try_acquire() and not second.try_acquire() and not second.is_free()
    first.release()
    assert second.try_acquire()
    second.release()
    # a writer that died on this host: its pid is gone
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    lock = EntryLock(store, entry)
    lock.path.parent.mkdir(parents=True, exist_ok=True)
    lock.path.write_text(json.dumps({"host": store_lock._host(), "pid": int(dead.stdout), "heartbeat": "x"}))
    assert lock.is_free() and lock.try_acquire()
    lock.release()
    # a writer on another node: live while its heartbeat moves, stale once it has not for STALE_S
    beat = tmp_path / "beat"
    beat.touch()
    lock.path.write_text(json.dumps({"host": "other-node", "pid": 1, "heartbeat": str(beat)}))
    assert not lock.try_acquire()
    monkeypatch.setattr(store_lock, "STALE_S", 0.5)
    time.sleep(0.6)
    assert lock.try_acquire()
    lock.release()
    # the heartbeats of writers that are gone are found for gc (this process's own beats on)
    gone = store.locks / "alive" / "other-node-1-0"
    gone.touch()
    os.utime(gone, (time.time() - 10, time.time() - 10))
    assert gone in store_lock.stale_heartbeats(store)


def test_two_writers_of_one_entry_at_once_make_it_once(tmp_path):
    """Two `pathtwt store make` of the same entry at once (two studies naming one store):
    one runs its command, the other waits and uses what it made."""
    store = tmp_path / "store"
    record = {"kind": "calibration", "inputs": {"n": 1}, "names": {}}
    key = entry_key("calibration", record["inputs"])
    out = store / "calibration" / f"{key}.h5"
    out.parent.mkdir(parents=True)  # as Snakemake makes its outputs' folders
    made = tmp_path / "made"
    maker = (f"import time, pathlib; pathlib.Path({str(made)!r}).open('a').write('x'); time.sleep(1.5); "
             f"pathlib.Path({str(out)!r}).write_text('h5')")
    cmd = [*PATHTWT, "store", "make", "--entry", str(store / "calibration" / f"{key}.json"), "--record",
           json.dumps(record), "--files", str(out), "--", sys.executable, "-c", maker]
    procs = [subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True) for _ in range(2)]
    logs = [p.communicate(timeout=60)[0] for p in procs]
    assert [p.returncode for p in procs] == [0, 0], logs
    assert made.read_text() == "x"  # the command ran once
    assert sum("made by another run meanwhile" in log for log in logs) == 1
    assert sum("being made by" in log for log in logs) == 1  # the waiter said whom it waited for


def test_a_slides_features_file_is_its_entry_under_its_extractors_record(tmp_path, capsys):
    """A per-slide extraction job: the features file is the entry (no record of its own),
    made once under its lock beside the extractor's shared record."""
    from pathtwt.cli import main

    store = Store(tmp_path / "store")
    plan = {"kind": "extractor", "inputs": {"model": "m"}, "names": {"backbone": "b"}}
    extractor = entry_key("extractor", plan["inputs"])
    out = store.features(extractor, entry_key("tiles", {"slide": "a"}))
    out.parent.mkdir(parents=True)  # as Snakemake makes its outputs' folders
    make = ["store", "make", "--entry", str(out), "--record", json.dumps(plan), "--", sys.executable, "-c"]
    assert main([*make, f"open({str(out)!r}, 'w').write('h5')"]) == 0
    assert out.read_text() == "h5" and {p.name for p in out.parent.iterdir()} == {"entry.json", out.name}
    assert main([*make, "raise SystemExit(3)"]) == 0  # there: the command is not run again
    assert "made by another run meanwhile" in capsys.readouterr().out
    out.unlink()
    assert main([*make, "raise SystemExit(3)"]) == 3


def test_a_slide_changed_since_the_plan_is_refused_by_its_job(tmp_path):
    slide = tmp_path / "a.svs"
    slide.write_bytes(b"a" * 64)
    from pathtwt.wsi.fingerprint import head_tail_sha256

    size, digest = head_tail_sha256(slide)
    slide.write_bytes(b"b" * 64)
    record = {"kind": "tiles", "inputs": {"slide": {"size": size, "sha256": digest}}, "names": {}}
    key = entry_key("tiles", record["inputs"])
    entry = tmp_path / "store" / "tiles" / f"{key}.json"
    res = subprocess.run([*PATHTWT, "store", "make", "--entry", str(entry), "--record", json.dumps(record),
                          "--check-slide", str(slide), "--", "true"], capture_output=True, text=True)
    assert res.returncode == 1 and len(res.stderr.strip().splitlines()) == 1
    assert f"{slide}: changed since the workflow was planned" in res.stderr and "run the workflow again" in res.stderr
    assert not entry.exists()


# ---- faults of the store's folder -----------------------------------------------------------


@pytest.fixture()
def small_disk(tmp_path):
    from small_disk import SmallDisk, mount_small_disk

    gen = mount_small_disk(tmp_path / "disk", "4m")
    next(gen)
    yield SmallDisk(tmp_path / "disk")
    next(gen, None)


def test_a_full_store_is_one_line_and_leaves_no_entry(small_disk):
    store = Store(small_disk.out / "store")
    store.ensure()
    small_disk.leave(64 << 10)
    target = _tiles_target(store, {"slide": "big"})

    def run():
        from pathtwt.io.atomic import atomic_output

        with atomic_output(target.files[0]) as tmp:
            tmp.write_bytes(os.urandom(1 << 20))
        return 0

    with pytest.raises(OutputError) as err:
        make_entry(store, target, run, say=print)
    assert "\n" not in str(err.value) and str(target.files[0]) in str(err.value)
    assert not target.record_path.exists() and not target.files[0].exists()


def test_a_store_that_cannot_be_written_is_one_line(small_disk):
    store = Store(small_disk.out / "store")
    small_disk.read_only()
    try:
        with pytest.raises(StoreError) as err:
            store.ensure()
        assert "\n" not in str(err.value) and "cannot be written" in str(err.value) and "store:" in str(err.value)
        # what the plan says before any job, when it has entries to make there
        why = store.writable()
        assert why is not None and "\n" not in why and "not writable" in why and "store: key" in why
    finally:
        small_disk.read_only(False)


# ---- a cohort's extraction, slide by slide ---------------------------------------------------


def _set(store: Store, tmp_path: Path, n: int):
    extractor = new_record("extractor", {"model": "m"})
    key = extractor["key"]
    jobs = [SlideJob(f"s{i}", str(tmp_path / f"c{i}.h5"), store.features(key, f"{i:024x}")) for i in range(n)]
    members = new_record("features-set", {"extractor": key, "tiles": [j.out.stem for j in jobs]})
    return extractor, members, store.features_set(key, members["key"]), jobs


def test_a_killed_extraction_keeps_its_slides_and_the_next_embeds_only_the_rest(tmp_path):
    store = Store(tmp_path / "store")
    extractor, members, path, jobs = _set(store, tmp_path, 4)
    seen = []

    def dies_after_two(claimed):
        seen.append([j.slide for j in claimed])
        for job in claimed[:2]:
            job.out.parent.mkdir(parents=True, exist_ok=True)
            job.out.write_bytes(b"f")
        return 137

    assert make_features_set(store, path, members, extractor, jobs, dies_after_two, say=print) == 137
    assert not path.exists() and [j.out.exists() for j in jobs] == [True, True, False, False]

    def embeds(claimed):
        seen.append([j.slide for j in claimed])
        for job in claimed:
            job.out.write_bytes(b"f")
        return 0

    assert make_features_set(store, path, members, extractor, jobs, embeds, say=print) == 0
    assert seen == [["s0", "s1", "s2", "s3"], ["s2", "s3"]] and path.is_file()
    read_checked(path, kind="features-set", key=members["key"])


def test_a_slide_another_run_is_embedding_is_waited_for_not_embedded_again(tmp_path):
    store = Store(tmp_path / "store")
    extractor, members, path, jobs = _set(store, tmp_path, 3)
    theirs = EntryLock(store, jobs[1].out)
    assert theirs.try_acquire()
    embedded = []

    def embed(claimed):
        embedded.extend(j.slide for j in claimed)
        for job in claimed:
            job.out.parent.mkdir(parents=True, exist_ok=True)
            job.out.write_bytes(b"f")
        jobs[1].out.write_bytes(b"theirs")  # the other run finishes its slide
        theirs.release()
        return 0

    assert make_features_set(store, path, members, extractor, jobs, embed, say=print, poll=0.05) == 0
    assert embedded == ["s0", "s2"] and jobs[1].out.read_bytes() == b"theirs" and path.is_file()


# ---- a study's view, ls / du / gc, results from before the store ------------------------------


def _features_file(path: Path, coords_name: str, **attrs) -> None:
    import numpy as np

    from pathtwt.io.h5 import write_features

    write_features(path, np.zeros((2, 4), np.float32), np.zeros((2, 2), np.int64),
                   {"coords_path": f"/x/tiles/{coords_name}", "status": "ok", **attrs})


def test_features_moved_by_hand_are_refused_and_failures_come_from_the_entries(tmp_path):
    store = Store(tmp_path / "store")
    record = new_record("extractor", {"model": {"model": "m"}, "settings": {"embedding": "cls+mean"}})
    folder = store.extractor(record["key"])
    folder.mkdir(parents=True)
    (folder / "entry.json").write_text(json.dumps(record))
    good, bad = "a" * 24, "b" * 24
    _features_file(folder / f"{good}.h5", f"{good}.coords.h5", embedding_recipe="cls+mean")
    _features_file(folder / f"{bad}.h5", f"{bad}.coords.h5", status="failed", failure_reason="truncated JPEG")
    failures = features_view(store, tmp_path / "view", record["key"], {"s1": good, "s2": bad}, tmp_path / "f.tsv")
    assert [f["slide"] for f in failures] == ["s2"] and "truncated JPEG" in (tmp_path / "f.tsv").read_text()
    assert os.path.realpath(tmp_path / "view" / "s1.h5") == str((folder / f"{good}.h5").resolve())
    (folder / f"{good}.h5").rename(folder / f"{'c' * 24}.h5")  # another slide's name
    with pytest.raises(StoreError, match=r"made from the tiles a+\.coords\.h5, not c+ \(moved by hand"):
        features_view(store, tmp_path / "view", record["key"], {"s1": "c" * 24})


def test_ls_du_and_gc_keep_what_a_study_uses(tmp_path):
    store = Store(tmp_path / "store")
    kept, dropped = (_tiles_target(store, {"slide": s}) for s in ("a", "b"))
    for target in (kept, dropped):
        make_entry(store, target, _writes(target, size=5000), say=print)
    lines = list_lines(store)
    assert len(lines) == 2 and all(line.startswith("tiles/") for line in lines)
    assert usage(store)["tiles"][0] == 2
    doomed = unused(store, {f"tiles/{kept.record['key']}"})
    assert [e.name for e in doomed] == [f"tiles/{dropped.record['key']}"]
    remove(doomed)
    assert store.has_tiles(kept.record["key"]) and not Store(store.root).has_tiles(dropped.record["key"])
    assert not dropped.files[0].exists()


def test_gc_counts_only_what_it_removed_and_names_what_it_could_not(tmp_path, monkeypatch):
    from pathtwt.io.store import maintenance

    store = Store(tmp_path / "store")
    tiles = _tiles_target(store, {"slide": "a"})
    make_entry(store, tiles, _writes(tiles, size=5000), say=print)
    model = new_record("model", {"m": 1})
    folder = store.model(model["key"])
    folder.mkdir(parents=True)
    make_entry(store, Target(folder, model, [Store.building(folder) / "model.json"], folder=True),
               lambda: (Store.building(folder) / "model.json").write_bytes(b"x" * 5000) and 0, say=print)
    doomed = unused(store, set())
    assert sorted(e.kind for e in doomed) == ["models", "tiles"]

    def refused(path, *args, **kwargs):
        raise PermissionError(13, "Permission denied", str(path))

    monkeypatch.setattr(maintenance.shutil, "rmtree", refused)
    monkeypatch.setattr(Path, "unlink", lambda path, missing_ok=False: refused(path) if path.suffix == ".h5"
                        else os.unlink(path))
    freed, failed = remove(doomed)
    assert freed < sum(e.size for e in doomed)  # the folder and the tiles' coords file stay
    assert len(failed) == 2 and all("\n" not in line and "Permission denied" in line for line in failed)
    assert any(line.startswith(f"models/{model['key']} could not be removed") and str(folder) in line
               for line in failed)
    assert any(line.startswith(f"tiles/{tiles.record['key']}") and str(tiles.files[0]) in line and
               "by hand, or run pathtwt store gc again" in line for line in failed)
    assert folder.is_dir() and tiles.files[0].exists()
    monkeypatch.undo()
    left = unused(store, set())
    assert remove(left) == (sum(e.size for e in left), [])
    assert not folder.exists() and not tiles.files[0].exists()


def test_a_study_folder_from_before_the_store_is_found(tmp_path):
    results = tmp_path / "results" / "old"
    (results / "tiles" / "c").mkdir(parents=True)
    assert products_before_the_store(results) == []
    (results / "tiles" / "c" / "s1.h5").symlink_to(tmp_path / "elsewhere.h5")
    assert products_before_the_store(results) == []
    (results / "features" / "b" / "v" / "c").mkdir(parents=True)
    (results / "features" / "b" / "v" / "c" / "s1.h5").write_bytes(b"")
    assert products_before_the_store(results) == ["features/"]
