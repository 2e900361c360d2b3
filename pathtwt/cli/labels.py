"""pathtwt labels: a cohort's published metadata tables -> pathtwt's slide_id,label,split table."""

from __future__ import annotations

import argparse
import json

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
        "--fractions", type=float, nargs=3, default=[0.6, 0.2, 0.2], metavar=("TRAIN", "VAL", "TEST"),
        help="fractions of each class's slides (default: %(default)s)",
    )
    drawn.add_argument("--seed", type=int, default=0, help="seed of the drawn split (default: %(default)s)")

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
        table = lb.build_drawn_split(args.table, args.fractions, args.seed, args.label_column)
    else:
        table = lb.build_camelyon16(args.reference, args.training_slides, args.split)
    lb.write_label_table(table, args.out)
    print(json.dumps({"cohort": args.cohort, "out": str(args.out), "slides": len(table),
                      "per_split_label": lb.summary(table)}))
    return 0
