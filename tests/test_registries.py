"""The registries are the one place their entries are named: a MIL head's name is written
as a string only in ``pathtwt/mil/heads.py`` (everything else reads the registry), a slide
reader's name is compared only in ``pathtwt/wsi/readers.py``, the readers of the head
registry agree with it, and the "where each extension goes" table of
docs/development.md names files that exist and entries its registries hold."""

from __future__ import annotations

import ast
import importlib
import io
import re
import tokenize
from collections.abc import Mapping
from pathlib import Path

import pytest
import yaml

from pathtwt.mil import heads

ROOT = Path(__file__).resolve().parents[1]
REGISTRY = ROOT / "pathtwt" / "mil" / "heads.py"
# Lower case only: the registry names are lower-case identifiers; display names in prose
# ("ABMIL", "TransMIL") are not a head's key. Word boundaries keep config keys such as
# `transmil_heads` (a TransMIL option, not a head name) out.
NAMES = re.compile(r"(?<![\w])(" + "|".join(re.escape(n) for n in heads.names()) + r")(?![\w])")
# path relative to the repository -> why a head name may be written there. The shipped
# configs (config/), the docs and the tests are outside the scan: they are the user's
# choices and examples, not code that could disagree with the registry.
ALLOWED: dict[str, str] = {}


def package_files() -> list[Path]:
    """The package's and the workflow's code and data files."""
    files = [*ROOT.joinpath("pathtwt").rglob("*.py"), *ROOT.joinpath("pathtwt").rglob("*.yaml"),
             *ROOT.joinpath("workflow").rglob("*.smk"), *ROOT.joinpath("workflow").rglob("*.py"),
             *ROOT.joinpath("workflow").rglob("*.yaml"), ROOT / "Snakefile"]
    return sorted(p for p in files if p != REGISTRY and "__pycache__" not in p.parts)


def _docstrings(tree: ast.AST) -> set[int]:
    """ids of the docstring nodes of a module and its classes and functions (prose, not a
    value the code uses)."""
    found = set()
    for node in ast.walk(tree):
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)) and node.body:
            first = node.body[0]
            if isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant) and isinstance(first.value.value, str):
                found.add(id(first.value))
    return found


def string_literals(path: Path) -> list[tuple[int, str]]:
    """(line, text) of every string the file's code or data holds: Python string constants
    (f-string parts included, docstrings left out), the string tokens of Snakemake files
    (comments are not tokens of that kind) and every key and value of a YAML file."""
    text = path.read_text(encoding="utf-8")
    if path.suffix == ".py":
        tree = ast.parse(text, filename=str(path))
        skip = _docstrings(tree)
        return [(node.lineno, node.value) for node in ast.walk(tree)
                if isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in skip]
    if path.suffix in (".yaml", ".yml"):
        out: list[tuple[int, str]] = []

        def walk(node) -> None:
            if isinstance(node, yaml.ScalarNode):
                out.append((node.start_mark.line + 1, str(node.value)))
            elif isinstance(node, yaml.SequenceNode):
                for item in node.value:
                    walk(item)
            elif isinstance(node, yaml.MappingNode):
                for key, value in node.value:
                    walk(key)
                    walk(value)

        for document in yaml.compose_all(text, Loader=yaml.SafeLoader):
            if document is not None:
                walk(document)
        return out
    # Snakefile and .smk: Python's tokenizer reads their strings (the rule syntax is tokens too)
    return [(tok.start[0], tok.string) for tok in tokenize.generate_tokens(io.StringIO(text).readline)
            if tok.type == tokenize.STRING]


def head_names_written(path: Path) -> list[str]:
    return [f"{path.relative_to(ROOT)}:{line}: {literal.strip()[:80]!r}"
            for line, literal in string_literals(path) if NAMES.search(literal)]


def test_no_mil_head_name_is_written_outside_its_registry():
    files = package_files()
    # the readers that once held their own copy of the names are among the scanned files
    scanned = {str(p.relative_to(ROOT)) for p in files}
    assert {"workflow/rules/common.smk", "pathtwt/config/schema.yaml", "pathtwt/cli/train_mil.py",
            "pathtwt/explain/scores.py", "pathtwt/mil/layout.py", "pathtwt/mil/train.py"} <= scanned
    found = [hit for path in files if str(path.relative_to(ROOT)) not in ALLOWED for hit in head_names_written(path)]
    assert not found, ("MIL head names written outside pathtwt/mil/heads.py (read them from the registry):\n"
                       + "\n".join(found))


def test_every_allowed_exception_still_exists_and_says_why():
    for rel, reason in ALLOWED.items():
        assert (ROOT / rel).is_file() and reason.strip(), rel
        assert head_names_written(ROOT / rel), f"{rel} no longer writes a head name: drop its exception"


def test_the_scan_sees_strings_and_ignores_prose_and_other_words(tmp_path):
    """A test of the test: names in plain strings, f-strings, dict keys, Snakemake strings
    and YAML values are found; docstrings, comments, identifiers and longer words are not."""
    name = heads.names()[0]
    code = tmp_path / "a.py"
    code.write_text(f'"""The {name} head."""\n# {name}\nbuild_{name} = 1\nX = {{"{name}": 1}}\nY = f"a {{X}} {name}"\n'
                    f'Z = "{name}_heads"\n')
    assert [line for line, text in string_literals(code) if NAMES.search(text)] == [4, 5]
    rules = tmp_path / "r.smk"
    rules.write_text(f'# {name}\nrule a:\n    output: "x/{name}/y"\n    shell: "echo"\n')
    assert [line for line, text in string_literals(rules) if NAMES.search(text)] == [3]
    data = tmp_path / "s.yaml"
    data.write_text(f"# {name}\nheads:\n  enum: [{name}]\n  {name}_heads: 1\n")
    assert [line for line, text in string_literals(data) if NAMES.search(text)] == [3]


# ---------------------------------------------------------------- readers of the head registry


def test_the_command_line_and_the_config_offer_exactly_the_registered_heads():
    import argparse

    from pathtwt.cli import train_mil
    from pathtwt.config.check import load_schema, validate_schema
    from pathtwt.mil.protocols import MILConfig

    parser = argparse.ArgumentParser()
    train_mil.add_arguments(parser)
    action = next(a for a in parser._actions if a.dest == "aggregator")
    assert tuple(action.choices) == heads.names() and action.default == heads.DEFAULT_HEAD == MILConfig().aggregator
    node = load_schema()["properties"]["mil"]["properties"]["heads"]
    assert node["items"]["enum"] == list(heads.names())
    assert node["default"] == heads.workflow_default() and node["default"]
    assert all(h.summary in node["description"] for h in heads.HEADS)  # the config reference lists every head
    with pytest.raises(Exception, match="is not one of"):
        validate_schema({"mil": {"heads": ["no-such-head"]}}, source="test")


def test_the_workflow_wildcard_matches_every_head_and_nothing_else():
    pattern = re.compile(f"^(?:{heads.wildcard_pattern()})$")
    assert all(pattern.match(n) for n in heads.names())
    assert not any(pattern.match(n) for n in ("", "seed0", heads.names()[0] + "x", "x" + heads.names()[-1]))


def test_every_head_resolves_and_the_explainers_read_the_registry():
    from pathtwt.explain.scores import ATTRIBUTION

    assert set(ATTRIBUTION) == set(heads.attention_names())
    for head in heads.HEADS:
        if head.build is not None:
            model = heads.build_head(head.name, in_dim=8, n_classes=3, hidden_dim=16, dropout=0.0, heads=2, landmarks=4)
            assert hasattr(model, "standardize")  # the epoch loop fits the input statistics
            assert head.dropout is not None
        else:
            assert callable(head.fitter) and not heads.is_buildable(head.name)
    with pytest.raises(ValueError, match="unknown aggregator"):
        heads.get_head("no-such-head")


def test_a_head_is_either_built_or_fitted():
    with pytest.raises(ValueError, match="exactly one"):
        heads.MILHead(name="x", display="X", summary="x")
    with pytest.raises(ValueError, match="exactly one"):
        heads.MILHead(name="x", display="X", summary="x", build="a:b", fit="a:c")


# ---------------------------------------------------------------- where each extension goes

DEVELOPMENT = ROOT / "docs" / "development.md"
_CODE = re.compile(r"`([^`]+)`")
_FILE = re.compile(r"^[\w.-]+(/[\w.-]+)+/?$")
# "`SYMBOL` of `path/to/module.py`": the registry the row's entries are in
_REGISTRY = re.compile(r"`(\w+)` of `([\w/.-]+\.py)`")


def extension_table() -> list[dict[str, str]]:
    """The rows of the table under "## Where each extension goes", by column name."""
    text = DEVELOPMENT.read_text(encoding="utf-8")
    section = text.split("## Where each extension goes", 1)[1].split("\n## ", 1)[0]
    lines = [line for line in section.splitlines() if line.startswith("|")]
    header = [c.strip() for c in lines[0].strip("|").split("|")]
    return [dict(zip(header, (c.strip() for c in line.strip("|").split("|")))) for line in lines[2:]]


def _entries_of(registry) -> set[str]:
    return set(registry) if isinstance(registry, Mapping) else {entry.name for entry in registry}


def test_the_extension_table_covers_every_kind():
    assert [row["extension"] for row in extension_table()] == ["MIL head", "encoder", "compression method",
                                                               "slide format", "slide reader", "GPU JPEG decoder"]


@pytest.mark.parametrize("row", extension_table(), ids=lambda r: r["extension"])
def test_the_extension_table_names_files_that_exist(row):
    paths = [c for column in ("its code", "its registry") for c in _CODE.findall(row[column]) if _FILE.match(c)]
    assert paths, row
    missing = [p for p in paths if not (ROOT / p).exists()]
    assert not missing, f"{row['extension']}: {missing} do not exist"


@pytest.mark.parametrize("row", extension_table(), ids=lambda r: r["extension"])
def test_each_registry_of_the_table_holds_the_entries_it_lists(row):
    registries = _REGISTRY.findall(row["its registry"])
    assert registries, f"{row['extension']}: no `SYMBOL` of `module.py` in its registry column"
    listed = set(_CODE.findall(row["registered now"]))
    assert listed
    for symbol, path in registries:
        module = importlib.import_module(path.removesuffix(".py").replace("/", "."))
        registry = getattr(module, symbol)
        assert listed <= _entries_of(registry), f"{symbol} of {path} lacks {sorted(listed - _entries_of(registry))}"
    if "variants.NAME.method" in row["its registry"]:  # the schema's enum a config names a method by
        from pathtwt.config.check import load_schema

        enum = load_schema()["properties"]["variants"]["additionalProperties"]["properties"]["method"]["enum"]
        assert listed <= set(enum)


# ---------------------------------------------------------------- compression method names

# A method's name written as a whole string (``"raptor"``, ``== "nose"``, a dict key) outside
# these files is a second home for the registry's list. Variant names that begin with one
# ("twt-6") and prose are not names of a method. Path -> why it may write them.
METHOD_NAME_HOMES: dict[str, str] = {
    "pathtwt/compress/registry.py": "the registry itself (and PAPER_METHOD, the paper's method)",
    "pathtwt/compress/budgets.py": "Appendix B's budgets as data, keyed by the registry's names (checked below)",
    "pathtwt/compress/method_options.py": "each --option names the method that reads it (checked below)",
}


def _method_names() -> set[str]:
    from pathtwt.compress.registry import METHODS

    return set(METHODS)


def method_names_written(path: Path) -> list[str]:
    names = _method_names()
    return [f"{path.relative_to(ROOT)}:{line}: {literal!r}" for line, literal in string_literals(path)
            if literal in names]


def test_no_method_name_is_written_outside_its_registry():
    from pathtwt.compress.registry import METHODS

    own_modules = {m.target.split(":")[0].replace(".", "/") + ".py" for m in METHODS.values()}
    files = [*package_files(), REGISTRY]
    found = [hit for path in files
             if (rel := str(path.relative_to(ROOT))) not in METHOD_NAME_HOMES and rel not in own_modules
             for hit in method_names_written(path)]
    assert not found, ("compression method names written outside pathtwt/compress/registry.py (read METHODS, "
                       "goal_of or PAPER_METHOD):\n" + "\n".join(found))
    for rel in METHOD_NAME_HOMES:
        assert method_names_written(ROOT / rel), f"{rel} no longer writes a method name: drop its exception"


def test_the_data_keyed_by_method_names_only_registered_methods():
    from pathtwt.compress.budgets import PAPER_BUDGETS
    from pathtwt.compress.method_options import METHOD_OPTIONS
    from pathtwt.compress.registry import GOALS, METHODS, PAPER_METHOD

    assert set(PAPER_BUDGETS) <= set(METHODS) and PAPER_METHOD in METHODS
    assert {spec.method for spec in METHOD_OPTIONS.values()} <= set(METHODS)
    assert all(m.goal in GOALS for m in METHODS.values())


def test_the_method_scan_sees_whole_names_only(tmp_path):
    code = tmp_path / "a.py"
    code.write_text('"""twt"""\nif m == "nose":\n    pass\nV = "twt-6"\nD = {"raptor": 1}\nS = "linear_single_layers"\n')
    assert [line for line, text in string_literals(code) if text in _method_names()] == [2, 5]


# ---------------------------------------------------------------- slide reader names

READER_TABLE = ROOT / "pathtwt" / "wsi" / "readers.py"
# A reader's name compared (``slide.reader == "openslide"``, ``reader in ("image", ...)``,
# a ``case``) or used as a dict key outside the readers' table is a fact about that reader
# kept somewhere else: a new reader would miss it. Path -> why it may still do so.
READER_NAME_COMPARED: dict[str, str] = {}


def _reader_names() -> set[str]:
    from pathtwt.wsi.readers import names

    return set(names())


def _strings_in(node: ast.AST) -> list[str]:
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return [node.value]
    if isinstance(node, (ast.Tuple, ast.List, ast.Set)):
        return [text for element in node.elts for text in _strings_in(element)]
    return []


def reader_names_compared(path: Path) -> list[str]:
    """'path:line: code' of each comparison, ``case`` or dict key that holds a reader's name."""
    names = _reader_names()
    hits = []
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), filename=str(path))):
        if isinstance(node, ast.Compare):
            operands = [node.left, *node.comparators]
        elif isinstance(node, ast.MatchValue):
            operands = [node.value]
        elif isinstance(node, ast.Dict):
            operands = [key for key in node.keys if key is not None]
        else:
            continue
        if any(text in names for operand in operands for text in _strings_in(operand)):
            hits.append(f"{path.relative_to(ROOT) if path.is_relative_to(ROOT) else path.name}:{node.lineno}: "
                        f"{ast.unparse(node)[:80]}")
    return hits


def test_no_reader_name_is_compared_outside_the_readers_table():
    files = [p for p in package_files() if p.suffix == ".py" and p != READER_TABLE]
    scanned = {str(p.relative_to(ROOT)) for p in files}
    # the modules that once compared reader names are among the scanned files
    assert {"pathtwt/wsi/slides.py", "pathtwt/wsi/supertiles.py", "pathtwt/wsi/formats.py"} <= scanned
    found = [hit for path in files if str(path.relative_to(ROOT)) not in READER_NAME_COMPARED
             for hit in reader_names_compared(path)]
    assert not found, ("slide reader names compared outside pathtwt/wsi/readers.py (give the reader's row a field "
                       "and read it):\n" + "\n".join(found))
    for rel, reason in READER_NAME_COMPARED.items():
        assert reason.strip() and reader_names_compared(ROOT / rel), f"{rel} compares no reader name: drop its exception"


def test_the_reader_scan_sees_comparisons_cases_and_keys_only(tmp_path):
    code = tmp_path / "a.py"
    code.write_text('"""openslide"""\n'                       # 1 docstring: prose
                    'if slide.reader == "tiffslide":\n'        # 2
                    '    pass\n'
                    'ok = r not in ("image", "x")\n'           # 4
                    'D = {"ome-zarr": 1}\n'                    # 5
                    'match r:\n'
                    '    case "openslide":\n'                  # 7
                    '        pass\n'
                    'S = "openslide"\n'                        # 9 a plain value: a format's reader, a logger
                    'T = kind == "images"\n')                  # 10 another word
    assert [int(hit.split(":")[1]) for hit in reader_names_compared(code)] == [2, 4, 5, 7]
