"""One table of slide formats (pathtwt.wsi.formats.FORMATS): every suffix list is read
from it, and no module writes its own; each format's reader is a row of the readers' table
(pathtwt.wsi.readers.READERS), which gives the reader choices."""

from __future__ import annotations

import argparse
import ast
from pathlib import Path

import yaml

from pathtwt.wsi import formats
from pathtwt.wsi.formats import FORMATS, SLIDE_SUFFIXES, WORKFLOW_SUFFIXES
from pathtwt.wsi.readers import names as reader_names
from pathtwt.wsi.readers import reader_named

PACKAGE = Path(__file__).resolve().parents[1] / "pathtwt"
# suffixes only a whole-slide format has: a literal list holding one is a slide suffix list
SLIDE_ONLY = {".svs", ".ndpi", ".mrxs", ".scn", ".vms", ".bif"}


def test_no_slide_suffix_list_is_written_outside_the_table():
    found = []
    for path in sorted(PACKAGE.rglob("*.py")):
        if path == Path(formats.__file__).resolve():
            continue
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, (ast.Tuple, ast.List, ast.Set)):
                words = {e.value.lower() for e in node.elts if isinstance(e, ast.Constant) and isinstance(e.value, str)}
                if len(words & SLIDE_ONLY) >= 2:
                    found.append(f"{path.relative_to(PACKAGE.parent)}:{node.lineno}")
    assert not found, f"slide suffix lists outside pathtwt/wsi/formats.py: {found}"


def test_every_list_reads_the_table():
    from pathtwt.cli import predict, tile
    from pathtwt.mil import label_builders

    assert predict.SLIDE_SUFFIXES == SLIDE_SUFFIXES
    assert set(label_builders.SLIDE_SUFFIXES) == set(SLIDE_SUFFIXES) | set(formats.ARCHIVE_SUFFIXES)
    parser = argparse.ArgumentParser()
    tile.add_arguments(parser)
    reader = next(a for a in parser._actions if a.dest == "reader")
    assert tuple(reader.choices) == ("auto", *reader_names())
    assert len(set(SLIDE_SUFFIXES)) == len(SLIDE_SUFFIXES)  # each suffix one format
    assert all(f.reader in reader_names() for f in FORMATS)


def test_the_schema_default_is_the_tables_workflow_suffixes():
    schema = yaml.safe_load((PACKAGE / "config" / "schema.yaml").read_text(encoding="utf-8"))

    def defaults(node):
        if isinstance(node, dict):
            if "extensions" in node.get("properties", {}):
                yield node["properties"]["extensions"]["default"]
            for value in node.values():
                yield from defaults(value)

    found = list(defaults(schema))
    assert found and all(tuple(d) == WORKFLOW_SUFFIXES for d in found)


def test_native_tiles_follow_the_table_and_the_vendor():
    assert formats.format_of("a/b.SVS").native_tiles and not formats.format_of("x.ndpi").native_tiles
    assert formats.format_of("x.unknown") is None
    assert reader_named("openslide").native_tiles({"openslide.vendor": "aperio"})
    assert not reader_named("openslide").native_tiles({"openslide.vendor": "hamamatsu"})
    assert reader_named("tiffslide").native_tiles({}) and not reader_named("image").native_tiles({})


def test_the_formats_page_lists_every_format():
    page = (PACKAGE.parent / "docs" / "formats.md").read_text(encoding="utf-8")
    for fmt in FORMATS:
        row = next((line for line in page.splitlines() if line.startswith(f"| {fmt.name} |")), None)
        assert row is not None, f"docs/formats.md lacks a row for {fmt.name}"
        assert all(f"`{suffix}`" in row for suffix in fmt.suffixes), row
        assert ("| yes |" in row) == fmt.native_tiles, row
