"""pathtwt labels: a cohort's published metadata tables -> pathtwt's slide_id,label,split table."""

from __future__ import annotations

import argparse
import json
import sys

HELP = (
    "build a label table (slide_id,label,split) from a cohort's published metadata: PANDA train.csv, "
    "TCGA-PRAD clinical Gleason patterns, CAMELYON17 stage_labels.csv, CAMELYON16 reference.csv, or a seeded class-stratified split of any table "
    "(expected columns: config/README.md)"
)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    sub = parser.add_subparsers(dest="cohort", metavar="COHORT", required=True)

    panda = sub.add_parser("panda", help="PANDA: train.csv (image_id, isup_grade) + a split file (Song et al.)")
    panda.add_argument("train_csv", metavar="TRAIN_CSV", help="PANDA's train.csv")
    panda.add_argument(
        "--splits", required=True, metavar="FILE",
        help="split file: slide_id or image_id, and split (train/val/test) or fold_0 (.csv or .tsv)",
    )
    panda.add_argument("--split-column", default=None, help="split column of --splits (default: split, else fold_0)")

    tcga = sub.add_parser("tcga-prad", help="TCGA-PRAD: clinical Gleason primary/secondary -> ISUP grade group")
    tcga.add_argument("clinical", metavar="CLINICAL", help="clinical table (BCR clinical_patient_prad.txt or GDC clinical.tsv)")
    tcga.add_argument(
        "--slides", required=True, metavar="DIR|FILE",
        help="slide folder, GDC manifest (filename column) or list of slide file names",
    )
    tcga.add_argument("--split", default="test", help="split of every slide (default: %(default)s, external test)")

    c17 = sub.add_parser("camelyon17", help="CAMELYON17: stage_labels.csv slide rows -> 0 negative, 1 metastasis")
    c17.add_argument("stage_labels", metavar="STAGE_LABELS", help="CAMELYON17's stage_labels.csv (patient,stage)")
    c17.add_argument(
        "--corrected", default=None, metavar="FILE",
        help="corrected slide stages in the same patient,stage format (e.g. Ling et al.); override the originals (default: none)",
    )
    c17.add_argument("--splits", default=None, metavar="FILE", help="split file (slide_id or patient, split) instead of a drawn split (default: none, a seeded drawn split)")
    c17.add_argument(
        "--fractions", type=float, nargs=3, default=[0.6, 0.2, 0.2], metavar=("TRAIN", "VAL", "TEST"),
        help="patient fractions of the drawn split (default: %(default)s)",
    )
    c17.add_argument("--seed", type=int, default=0, help="seed of the drawn patient split (default: %(default)s)")

    c16 = sub.add_parser("camelyon16", help="CAMELYON16: reference.csv (+ normal_/tumor_ training slides)")
    c16.add_argument("reference", metavar="REFERENCE_CSV", help="the test set's reference.csv (name, class, ...)")
    c16.add_argument(
        "--training-slides", default=None, metavar="DIR|FILE",
        help="also label the training slides, by their names normal_NNN / tumor_NNN (default: none)",
    )
    c16.add_argument("--split", default="test", help="split of every slide (default: %(default)s, external test)")

    drawn = sub.add_parser(
        "split", help="any slide_id,label[,...] table without a split (e.g. BACH): a seeded split drawn per class"
    )
    drawn.add_argument("table", metavar="LABELS_CSV", help="label table with slide_id and the label column")
    drawn.add_argument("--label-column", default="label", help="column of class indices 0..C-1 (default: %(default)s)")
    drawn.add_argument(
        "--fractions", type=float, nargs=3, default=None, metavar=("TRAIN", "VAL", "TEST"),
        help="fractions of each class's slides (default without --folds: 0.6 0.2 0.2)",
    )
    drawn.add_argument("--seed", type=int, default=0, help="seed of the drawn split (default: %(default)s)")
    drawn.add_argument(
        "--folds", type=int, default=None, metavar="K",
        help="k-fold cross-validation instead of fractions: a `fold` column 0..K-1, stratified by class (every slide "
        "tested once; fold f's heads select on fold f+1 and train on the rest; default: none, a fractions split)",
    )
    drawn.add_argument(
        "--group-column", default=None, metavar="COL",
        help="with --folds: keep every group's slides (a patient, a case) in one fold; copied to a `group` column (default: none, every slide its own group)",
    )
    drawn.add_argument(
        "--holdout", type=float, default=0.0, metavar="FRACTION",
        help="with --folds: this fraction of the slides (by group, stratified) is a compression-only hold-out "
        "(split `compress`, fold -1) that no fold tests (default: %(default)s)",
    )
    drawn.add_argument("--clam-splits", default=None, metavar="DIR",
                       help="with --folds: also write CLAM's splits_{k}.csv (train,val,test columns) there (default: none)")
    drawn.add_argument("--stamp-splits", default=None, metavar="JSON",
                       help="with --folds: also write STAMP's splits.json (train_patients / test_patients per fold) (default: none)")

    for p in (panda, tcga, c17, c16, drawn):
        p.add_argument("--out", required=True, metavar="CSV", help="label table to write (slide_id,label,split,...)")


def run(args: argparse.Namespace) -> int:
    from pathtwt.mil import label_builders as lb

    if args.cohort == "panda":
        table = lb.build_panda(args.train_csv, args.splits, args.split_column)
    elif args.cohort == "tcga-prad":
        table = lb.build_tcga_prad(args.clinical, args.slides, args.split)
    elif args.cohort == "camelyon17":
        table = lb.build_camelyon17(args.stage_labels, args.corrected, args.splits, args.fractions, args.seed)
    elif args.cohort == "split":
        return run_split(args)
    else:
        table = lb.build_camelyon16(args.reference, args.training_slides, args.split)
    lb.write_label_table(table, args.out)
    print(json.dumps({"cohort": args.cohort, "out": str(args.out), "slides": len(table),
                      "per_split_label": lb.summary(table)}))
    return 0


def run_split(args: argparse.Namespace) -> int:
    from pathtwt.errors import ConfigError
    from pathtwt.mil import label_builders as lb

    if args.folds is None:
        for flag in ("group_column", "clam_splits", "stamp_splits"):
            if getattr(args, flag) is not None:
                raise ConfigError(f"--{flag.replace('_', '-')} needs --folds K")
        if args.holdout:
            raise ConfigError("--holdout needs --folds K (a fractions split's own train part is what compression uses)")
        table = lb.build_drawn_split(args.table, args.fractions or [0.6, 0.2, 0.2], args.seed, args.label_column)
        lb.write_label_table(table, args.out)
        print(json.dumps({"cohort": args.cohort, "out": str(args.out), "slides": len(table),
                          "per_split_label": lb.summary(table)}))
        return 0
    if args.fractions is not None:
        raise ConfigError("--folds and --fractions exclude each other: give one (folds test every slide once)")
    table = lb.build_fold_split(args.table, args.folds, args.seed, args.label_column, args.group_column, args.holdout)
    lb.write_label_table(table, args.out)
    clam = lb.write_clam_splits(table, args.folds, args.clam_splits) if args.clam_splits else []
    if args.stamp_splits:
        clam.append(lb.write_stamp_splits(table, args.folds, args.stamp_splits))
    notes = lb.fold_notes(table, args.folds, args.holdout)
    print(json.dumps({"cohort": args.cohort, "out": str(args.out), "slides": len(table), "folds": args.folds,
                      "holdout": args.holdout, **notes, "split_files": [str(p) for p in clam]}))
    gaps = notes["not_exactly_stratified"]
    if gaps:
        print(f"pathtwt labels split: groups kept whole, so {len(gaps)} (fold, class) count(s) miss their target by "
              f"a slide or more: {'; '.join(gaps)}", file=sys.stderr)
    if notes["mixed_label_groups"]:
        print(f"pathtwt labels split: groups whose slides carry different labels (kept whole, allowed): "
              f"{', '.join(notes['mixed_label_groups'])}", file=sys.stderr)
    return 0
