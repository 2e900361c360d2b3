"""A study's products and their store keys, derived from its config before anything runs.

The workflow asks for the key of each product it plans (a slide's tiles, a backbone's
calibration tiles and discovery, a compressed model, a variant's extractor and a cohort's
set of features) and :class:`StudyProducts` computes it once and keeps it: a slide is
fingerprinted once per plan (and hashed once per file identity, :class:`FingerprintCache`),
a weights file once per identity (:class:`WeightsHashes`), never again per rule. The inputs
of each key are the settings :mod:`pathtwt.config.store_keys` classes as value-changing,
plus the keys of the products it is made from (a model's teacher and calibration, a slide's
features' tiles and extractor), so a change reaches exactly the products made from it.

``pathtwt store gc --keep-used-by STUDY.yaml`` derives the same keys from the same config.
"""

from __future__ import annotations

import inspect
import os
from dataclasses import asdict
from pathlib import Path
from typing import Any, Callable, Mapping

from pathtwt.config.store_keys import values
from pathtwt.io.layout import RANDOM_INIT
from pathtwt.io.store.keys import entry_key
from pathtwt.io.store.layout import Store

# spec fields that describe where a backbone comes from or how it is credited, not what it computes
DESCRIPTIVE_SPEC_FIELDS = ("hub_id", "hub_file", "default_weights", "licence", "card", "variant_dir")


def resolve_backbones(config: Mapping[str, Any], say: Callable[[str], Any] = print) -> dict[str, dict[str, Any]]:
    """Backbone name used in paths -> how to build its teacher. A backbone whose weights
    file is configured but absent is replaced by its ``fallback`` with random weights."""
    out = {}
    for name, cfg in config["backbones"].items():
        weights = cfg["weights"]
        if weights and not Path(weights).is_file() and cfg["fallback"]:
            say(f"pathtwt workflow: weights {weights} of backbone {name} not found; using {cfg['fallback']} with "
                "RANDOM weights instead (results are a plumbing check only)")
            out[cfg["fallback"]] = dict(cfg, teacher=cfg["fallback"], weights=None, random=True, configured=name)
        else:
            out[name] = dict(cfg, teacher=name, random=False, configured=name)
    return out


def random_init_seed() -> int:
    """The seed a backbone's random weights are drawn with (create_backbone's default)."""
    from pathtwt.models.registry import create_backbone

    return int(inspect.signature(create_backbone).parameters["init_seed"].default)


def architecture(name: str) -> dict[str, Any]:
    """What a registry backbone computes: its spec less where it comes from."""
    from pathtwt.models.registry import get_spec

    return {k: v for k, v in asdict(get_spec(name)).items() if k not in DESCRIPTIVE_SPEC_FIELDS}


class StudyProducts:
    """The keys of one study's products. ``table_of(cohort)`` and ``slide_paths_of(cohort)``
    give a cohort's label table and slide files (the workflow's, which wait for the demo
    cohorts to be written); ``cache`` is the folder of pathtwt's caches (None: none)."""

    def __init__(self, config: Mapping[str, Any], *, table_of: Callable[[str], Any],
                 slide_paths_of: Callable[[str], Mapping[str, Path]], cache: Path | None = None,
                 say: Callable[[str], Any] = print):
        from pathtwt.models.weights import WeightsHashes
        from pathtwt.wsi.fingerprint import FingerprintCache

        self.config, self.say = config, say
        self.store = Store(os.path.expanduser(str(config["store"])))
        self._table_of, self._paths_of = table_of, slide_paths_of
        self.fingerprints = FingerprintCache(cache / "fingerprints" if cache else None)
        self.weights = WeightsHashes(cache / "weights-sha256.json" if cache else None)
        self.backbones = resolve_backbones(config, say)
        self._keys: dict[tuple[str, ...], str] = {}
        self._inputs: dict[tuple[str, str], dict[str, Any]] = {}
        self._names: dict[tuple[str, str], dict[str, Any]] = {}
        self._teachers: dict[str, dict[str, Any]] = {}
        self._entries: list[tuple[tuple[str, str, dict[str, Any]], bool]] | None = None

    # ---- the keys ------------------------------------------------------------------------

    def _remember(self, name: tuple[str, ...], kind: str, inputs: dict[str, Any], names: dict[str, Any]) -> str:
        key = entry_key(kind, inputs)
        self._keys[name] = key
        self._inputs.setdefault((kind, key), inputs)
        self._names.setdefault((kind, key), names)
        return key

    def tiles_key(self, cohort: str, slide: str) -> str:
        """A slide's tiles: its fingerprint, how it is read and tiled, its ROI's content."""
        name = ("tiles", cohort, slide)
        if name not in self._keys:
            from pathtwt.config.check import roi_file

            cfg = self.config["cohorts"][cohort]
            path = Path(self._paths_of(cohort)[slide])
            size, digest = self.fingerprints.get(path)
            roi = roi_file(self.config, cohort, slide)
            inputs = {"slide": {"size": size, "sha256": digest}, "reading": values(("cohorts", "*"), cfg),
                      "tiling": values(("cohorts", "*", "tiling"), cfg["tiling"]),
                      "roi": _file_sha256(roi) if roi is not None else None}
            self._remember(name, "tiles", inputs, {"cohort": cohort, "slide": slide, "slide_path": str(path)})
        return self._keys[name]

    def teacher_inputs(self, backbone: str) -> dict[str, Any]:
        """A teacher: its architecture and its weights' content (random weights: their seed)."""
        if backbone not in self._teachers:
            from pathtwt.models.registry import get_spec
            from pathtwt.models.weights import local_weights_path

            b = self.backbones[backbone]
            weights: dict[str, Any]
            if b["random"]:
                weights = {"random_init_seed": random_init_seed()}
            else:
                spec = get_spec(b["teacher"])
                path = local_weights_path(spec, b["weights"])
                if path is not None:
                    weights = {"sha256": self.weights.sha256(path)}
                    for file, old in self.weights.replaced.items():
                        self.say(f"pathtwt store: weights {file} changed since they were last hashed (sha256 {old[:12]} "
                                 f"-> {weights['sha256'][:12]}): nothing made from the old weights is used")
                    self.weights.replaced.clear()
                else:
                    # from the hub (downloaded by the first job, or already in its cache): keyed by
                    # name, the same before the download and after it
                    weights = {"hub": spec.hub_id, "file": spec.hub_file}
                    self.say(f"pathtwt store: backbone {backbone}'s weights come from the hub ({spec.hub_id}); its "
                             f"entries are keyed by that name, not the weights' content: give backbones.{backbone}."
                             "weights a local file to key them by content (a new hub revision is not noticed)")
            self._teachers[backbone] = {"architecture": architecture(b["teacher"]), "weights": weights}
        return self._teachers[backbone]

    def calibration_slides(self, backbone: str) -> list[tuple[str, str]]:
        """(cohort, slide) of a backbone's calibration tiles, in the order the draw reads them
        (:func:`~pathtwt.config.check.backbone_calibration_slides`)."""
        from pathtwt.config.check import backbone_calibration_slides

        return backbone_calibration_slides(self.config, self.backbones[backbone], self._table_of)

    def calibration_key(self, backbone: str) -> str:
        """Calibration tiles: the slides' tiles keys in the order the draw reads them (which
        their cohorts' and slides' names decide) with the slides' names (a held-out slide is
        known by its name), and the draw's settings."""
        name = ("calibration", backbone)
        if name not in self._keys:
            slides = self.calibration_slides(backbone)
            inputs = {"tiles": [[s, self.tiles_key(c, s)] for c, s in slides],
                      "settings": values(("calibration",), self.config["calibration"])}
            self._remember(name, "calibration", inputs, {"backbone": backbone})
        return self._keys[name]

    def discovery_goal(self, backbone: str) -> tuple[int | None, float | None]:
        """(depth, eps) of the partition drawn on the similarity figure: discovery.depth or
        discovery.eps when set, else the first TWT variant of the backbone, else eps 0.1."""
        from pathtwt.compress.registry import PAPER_METHOD

        d = self.config["discovery"]
        if d["depth"] is not None or d["eps"] is not None:
            return d["depth"], d["eps"]
        for v in self.compressed_variants(backbone):
            var = self.config["variants"][v]
            if var["method"] == PAPER_METHOD:
                return var["depth"], var["eps"]
        return None, 0.1

    def discovery_key(self, backbone: str) -> str:
        name = ("discovery", backbone)
        if name not in self._keys:
            inputs = {"teacher": self.teacher_inputs(backbone), "calibration": self.calibration_key(backbone),
                      "settings": values(("discovery",), self.config["discovery"]),
                      "goal": list(self.discovery_goal(backbone)), "device": self.config["compress"]["device"]}
            self._remember(name, "discovery", inputs, {"backbone": backbone})
        return self._keys[name]

    def uses_plan(self, backbone: str, variant: str) -> bool:
        """A TWT variant whose depth (or eps) is the one discovery partitioned for reuses
        that plan; others partition the similarity matrix in their compress job."""
        from pathtwt.compress.registry import PAPER_METHOD

        v = self.config["variants"][variant]
        return v["method"] == PAPER_METHOD and (v["depth"], v["eps"]) == self.discovery_goal(backbone)

    def model_key(self, backbone: str, variant: str) -> str:
        """A compressed model: its teacher, calibration tiles, method and settings (and the
        discovery plan it starts from, where it reuses one)."""
        name = ("model", backbone, variant)
        if name not in self._keys:
            inputs = {"teacher": self.teacher_inputs(backbone), "calibration": self.calibration_key(backbone),
                      "variant": values(("variants", "*"), self.config["variants"][variant]),
                      "compress": values(("compress",), self.config["compress"]),
                      "tokens": self.config["discovery"]["tokens"],
                      "plan": self.discovery_key(backbone) if self.uses_plan(backbone, variant) else None}
            self._remember(name, "model", inputs, {"backbone": backbone, "variant": variant})
        return self._keys[name]

    def extractor_key(self, backbone: str, variant: str) -> str:
        """The features of a backbone variant: its model and the value-changing extraction settings."""
        name = ("extractor", backbone, variant)
        if name not in self._keys:
            kind = self.variant_kind(variant)
            if kind == RANDOM_INIT:
                teacher = self.backbones[backbone]["teacher"]
                model = {"teacher": {"architecture": architecture(teacher), "weights": {"random_init_seed": random_init_seed()}}}
            elif kind == "teacher":
                model = {"teacher": self.teacher_inputs(backbone)}
            else:
                model = {"model": self.model_key(backbone, variant)}
            inputs = {"model": model, "settings": values(("extract",), self.config["extract"])}
            self._remember(name, "extractor", inputs, {"backbone": backbone, "variant": variant})
        return self._keys[name]

    def extracted_slides(self, cohort: str) -> list[str]:
        """Slides whose features are extracted: all but a compression-only hold-out."""
        from pathtwt.mil.folds import HOLDOUT_SPLIT

        table = self._table_of(cohort)
        held = set(table.ids_in_split(HOLDOUT_SPLIT))
        return [s for s in table.slide_ids if s not in held]

    def set_key(self, backbone: str, variant: str, cohort: str) -> str:
        """The features of a cohort's extracted slides by a variant: one extraction job's entry."""
        name = ("features-set", backbone, variant, cohort)
        if name not in self._keys:
            tiles = sorted({self.tiles_key(cohort, s) for s in self.extracted_slides(cohort)})
            inputs = {"extractor": self.extractor_key(backbone, variant), "tiles": tiles}
            self._remember(name, "features-set", inputs, {"backbone": backbone, "variant": variant, "cohort": cohort})
        return self._keys[name]

    # ---- variants ------------------------------------------------------------------------

    def variants(self, backbone: str) -> list[str]:
        """Variant names for a backbone, the uncompressed one included."""
        from pathtwt.config.check import backbone_variants

        return backbone_variants(self.config, self.backbones[backbone])

    def compressed_variants(self, backbone: str) -> list[str]:
        from pathtwt.config.check import compressed_variants

        return compressed_variants(self.config, self.backbones[backbone])

    def variant_kind(self, variant: str) -> str:
        """How a variant's backbone is built: RANDOM_INIT (the teacher's architecture with
        random weights), "teacher" (a variant of method none, or `uncompressed` probed
        without being configured) or "compressed" (a model of the store)."""
        method = self.config["variants"][variant]["method"] if variant in self.config["variants"] else "none"
        if variant == RANDOM_INIT or method == RANDOM_INIT:
            return RANDOM_INIT
        return "teacher" if method == "none" else "compressed"

    # ---- the whole study ---------------------------------------------------------------

    def task_cohorts(self) -> list[str]:
        """The cohorts the tasks train and test on (training cohorts first)."""
        tasks = self.config["tasks"].values()
        return list(dict.fromkeys([t["cohort"] for t in tasks] + [c for t in tasks for c in t["external"]]))

    def calibrated_backbones(self) -> list[str]:
        """Backbones whose calibration tiles are drawn: a compressed variant, or the analyses."""
        from pathtwt.config.check import is_calibrated

        return [b for b in self.backbones if is_calibrated(self.config, self.backbones[b])]

    def study_entries(self, sets: bool | None = None) -> list[tuple[str, str, dict[str, Any]]]:
        """(entry name, key, names) of every store entry the study uses: each slide's tiles,
        each backbone's calibration tiles and discovery, each compressed model, each slide's
        features by each variant and (``sets``, default: unless extraction runs per slide)
        each cohort's set. Entry names are the store's (``tiles/T``, ``features/E/T``;
        :mod:`pathtwt.io.store.maintenance`). The list is built once per plan."""
        if sets is None:
            sets = not self.config["extract"]["per_slide_jobs"]
        if self._entries is None:
            self._entries = self._all_entries()
        return [entry for entry, is_set in self._entries if sets or not is_set]

    def _all_entries(self) -> list[tuple[tuple[str, str, dict[str, Any]], bool]]:
        """:meth:`study_entries` with the sets, each entry with whether it is a cohort's set."""
        out = []
        cohorts = self.task_cohorts()
        for cohort in cohorts:
            out += [(f"tiles/{self.tiles_key(cohort, s)}", self.tiles_key(cohort, s),
                     {"kind": "tiles", "cohort": cohort, "slide": s}) for s in self._table_of(cohort).slide_ids]
        for b in self.calibrated_backbones():
            out.append((f"calibration/{self.calibration_key(b)}", self.calibration_key(b), {"kind": "calibration",
                                                                                          "backbone": b}))
            if self.compressed_variants(b):
                out.append((f"discovery/{self.discovery_key(b)}", self.discovery_key(b), {"kind": "discovery",
                                                                                        "backbone": b}))
        for b in self.backbones:
            out += [(f"models/{self.model_key(b, v)}", self.model_key(b, v), {"kind": "models", "backbone": b, "variant": v})
                    for v in self.compressed_variants(b)]
        sets = set()
        for b in self.backbones:
            for v in self.variants(b):
                e = self.extractor_key(b, v)
                for cohort in cohorts:
                    names = {"kind": "features", "backbone": b, "variant": v, "cohort": cohort}
                    sets.add(f"features/{e}/sets/{self.set_key(b, v, cohort)}")
                    out.append((f"features/{e}/sets/{self.set_key(b, v, cohort)}", self.set_key(b, v, cohort), names))
                    out += [(f"features/{e}/{self.tiles_key(cohort, s)}", self.tiles_key(cohort, s), dict(names, slide=s))
                            for s in self.extracted_slides(cohort)]
        # an entry two products share (two backbones' calibration, one slide in two cohorts) once
        first: dict[str, tuple[str, str, dict[str, Any]]] = {}
        for entry in out:
            first.setdefault(entry[0], entry)
        return [(entry, name in sets) for name, entry in first.items()]

    # ---- what is known -------------------------------------------------------------------

    def names_of(self, kind: str, key: str) -> dict[str, Any]:
        """The names of the first product of this plan with that key (a slide, a backbone variant)."""
        return self._names[(kind, key)]

    def inputs_of(self, kind: str, key: str) -> dict[str, Any]:
        """The inputs of a key computed for this plan."""
        return self._inputs[(kind, key)]


def _file_sha256(path: Path) -> str:
    from pathtwt.io.atomic import sha256_file

    return sha256_file(path)


def entries_used_by(config_files: list[str], *, store: str | None = None) -> tuple[Path, set[str]]:
    """The store (``store``, else the first config's) and the names of the entries the
    studies of ``config_files`` (each read as ``snakemake --configfile`` reads it) use."""
    from pathtwt.config.check import check_slides_on_disk, load_and_check
    from pathtwt.config.slide_reads import cache_root

    root, names = None, set()
    for path in config_files:
        config, tables = load_and_check([path])
        root = root or Path(os.path.expanduser(store or str(config["store"])))
        paths = {c: check_slides_on_disk(config, c, table) for c, table in tables.items()}
        products = StudyProducts(config, table_of=tables.__getitem__, slide_paths_of=paths.__getitem__,
                                 cache=cache_root(), say=lambda line: None)
        names.update(name for name, _, _ in products.study_entries())
        products.fingerprints.save()
    return root, names
