"""The package's layering, read from its source: every import statement (at module level,
inside functions, under TYPE_CHECKING) and every "pathtwt.module[:attr]" string that the
code hands to importlib."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[1] / "pathtwt"
DOTTED = re.compile(r"^pathtwt(\.\w+)+(:\w+)?$")


def module_name(path: Path) -> str:
    parts = list(path.relative_to(PACKAGE.parent).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


MODULES = {module_name(p): p for p in PACKAGE.rglob("*.py")}


def resolve(name: str) -> str | None:
    """The longest known module that `name` (a module or module.attribute) lies in."""
    parts = name.split(".")
    while parts:
        candidate = ".".join(parts)
        if candidate in MODULES:
            return candidate
        parts.pop()
    return None


def imports_of(module: str) -> set[str]:
    path = MODULES[module]
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[: len(package.split(".")) - (node.level - 1)]
                base = ".".join(anchor + ([base] if base else []))
            names = [f"{base}.{alias.name}" for alias in node.names] + [base]
        elif isinstance(node, ast.Constant) and isinstance(node.value, str) and DOTTED.match(node.value):
            names = [node.value.split(":")[0]]
        else:
            continue
        for name in names:
            target = resolve(name)
            if target and target != module and target != "pathtwt":
                found.add(target)
    # `from pathtwt.x import y` also names the package pathtwt.x: keep only the deepest
    return {t for t in found if not any(o != t and o.startswith(t + ".") for o in found)}


GRAPH = {module: imports_of(module) for module in MODULES}


def in_package(module: str, package: str) -> bool:
    return module == f"pathtwt.{package}" or module.startswith(f"pathtwt.{package}.")


FORBIDDEN = [
    ("wsi", ("compress", "mil", "analysis", "cli", "models")),
    ("models", ("compress", "mil", "analysis", "cli", "wsi")),
    ("io", ("compress", "mil", "analysis", "cli", "models", "wsi")),
    ("mil", ("models", "compress", "analysis", "cli")),
    # using a trained head on a slide: heads (mil), files (io) and slides (wsi) only
    ("explain", ("compress", "cli", "analysis", "models")),
]
# bench measures the stage packages and machine facts: nothing below it imports it
FORBIDDEN += [(package, ("bench",)) for package in ("wsi", "models", "io", "mil", "explain", "features", "compress",
                                                    "config", "report")]


@pytest.mark.parametrize("package,forbidden", FORBIDDEN, ids=[f"{p}-not-{'-'.join(f)}" for p, f in FORBIDDEN])
def test_lower_layers_do_not_import_upper_ones(package, forbidden):
    bad = sorted(
        f"{module} -> {target}"
        for module, targets in GRAPH.items() if in_package(module, package)
        for target in targets if any(in_package(target, f) for f in forbidden)
    )
    assert not bad, "layering broken:\n" + "\n".join(bad)


def test_only_cli_imports_cli():
    # pathtwt.__main__ is the entry point of `python -m pathtwt`
    bad = sorted(f"{m} -> {t}" for m, ts in GRAPH.items() if not in_package(m, "cli") and m != "pathtwt.__main__"
                 for t in ts if in_package(t, "cli"))
    assert not bad, "\n".join(bad)


def _subcommand_modules() -> set[str]:
    from pathtwt.cli import COMMANDS

    return {f"pathtwt.cli.{m}" for m in COMMANDS.values()}


# Imports of one subcommand by another still to be removed (none); the test fails once such
# an import is gone, so that its entry goes too.
PENDING_SUBCOMMAND_IMPORTS: set[tuple[str, str]] = set()


def test_no_subcommand_imports_another():
    """Each cli module parses and calls; what two subcommands share lives in a shared cli
    module (options, tiling_options) or in the stage packages, never in a subcommand."""
    subcommands = _subcommand_modules()
    found = {(m, t) for m, ts in GRAPH.items() if m in subcommands for t in ts if t in subcommands}
    assert found - PENDING_SUBCOMMAND_IMPORTS == set(), "a subcommand imports another:\n" + "\n".join(
        f"{m} -> {t}" for m, t in sorted(found - PENDING_SUBCOMMAND_IMPORTS))
    gone = PENDING_SUBCOMMAND_IMPORTS - found
    assert not gone, f"no longer imported, remove from PENDING_SUBCOMMAND_IMPORTS: {sorted(gone)}"


def test_the_workflow_imports_no_command_line_module():
    """The rules call `pathtwt` subcommands; their helpers use the package's stages, not
    its command line."""
    root = PACKAGE.parent
    offenders = [str(p.relative_to(root)) for p in [root / "Snakefile", *sorted((root / "workflow").rglob("*.smk"))]
                 if re.search(r"\bpathtwt\.cli\b", p.read_text())]
    assert not offenders, f"the workflow imports pathtwt.cli: {offenders}"


def import_cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Every strongly connected group of two or more modules (Tarjan), each as the sorted
    list of its modules: a group is a set of modules every one of which reaches every other
    through imports, i.e. an import cycle of any length (or several sharing modules)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    groups: list[list[str]] = []

    def visit(root: str) -> None:
        # iterative depth-first walk (a recursive one could hit the recursion limit)
        work = [(root, iter(sorted(graph.get(root, ()))))]
        index[root] = low[root] = len(index)
        stack.append(root)
        on_stack.add(root)
        while work:
            node, targets = work[-1]
            advanced = False
            for target in targets:
                if target not in index:
                    index[target] = low[target] = len(index)
                    stack.append(target)
                    on_stack.add(target)
                    work.append((target, iter(sorted(graph.get(target, ())))))
                    advanced = True
                    break
                if target in on_stack:
                    low[node] = min(low[node], index[target])
            if advanced:
                continue
            work.pop()
            if work:
                parent = work[-1][0]
                low[parent] = min(low[parent], low[node])
            if low[node] == index[node]:
                group = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    group.append(member)
                    if member == node:
                        break
                if len(group) > 1:
                    groups.append(sorted(group))

    for module in sorted(graph):
        if module not in index:
            visit(module)
    return sorted(groups)


def test_no_import_cycles():
    cycles = import_cycles(GRAPH)
    assert not cycles, "import cycles:\n" + "\n".join(" <-> ".join(c) for c in cycles)


def _graph_of(root: Path) -> dict[str, set[str]]:
    """The import graph of a package tree at ``root`` (a folder named pathtwt), read the
    same way as the real one."""
    global PACKAGE, MODULES
    saved = PACKAGE, MODULES
    try:
        PACKAGE = root
        MODULES = {module_name(p): p for p in root.rglob("*.py")}
        return {m: imports_of(m) for m in MODULES}
    finally:
        PACKAGE, MODULES = saved


def test_the_cycle_check_sees_a_three_module_cycle_of_importlib_strings(tmp_path):
    """A test of the test: three modules that reach each other only through "module:attr"
    strings handed to importlib, and lazily, form a cycle the check reports; without the
    closing edge there is none."""
    pkg = tmp_path / "pathtwt"
    (pkg / "compress").mkdir(parents=True)
    (pkg / "__init__.py").write_text("")
    (pkg / "compress" / "__init__.py").write_text("")
    (pkg / "compress" / "a.py").write_text('TARGET = "pathtwt.compress.b:run"\n')
    (pkg / "compress" / "b.py").write_text('def run():\n    import importlib\n'
                                          '    return importlib.import_module("pathtwt.compress.c")\n')
    (pkg / "compress" / "c.py").write_text('METHODS = {"a": "pathtwt.compress.a:TARGET"}\n')
    assert import_cycles(_graph_of(pkg)) == [["pathtwt.compress.a", "pathtwt.compress.b", "pathtwt.compress.c"]]
    (pkg / "compress" / "c.py").write_text("METHODS = {}\n")
    assert import_cycles(_graph_of(pkg)) == []


def test_the_checker_sees_function_level_and_string_imports(tmp_path):
    """The walk above must see the imports that hide: a lazy one in a function body and a
    "module:attr" string for importlib (a layering rule it could not see would pass
    vacuously)."""
    assert "pathtwt.cli.options" in GRAPH["pathtwt.cli.discover"]
    registry_targets = GRAPH["pathtwt.compress.registry"]
    assert "pathtwt.compress.methods.twt" in registry_targets  # named only as a string
    lazy = [m for m, p in MODULES.items() if "    from pathtwt." in p.read_text()]
    assert lazy and all(GRAPH[m] for m in lazy)


def test_library_code_names_no_machine_path():
    offenders = [str(p.relative_to(PACKAGE.parent)) for p in MODULES.values() if "../shared" in p.read_text() or "\"shared\"" in p.read_text()]
    assert not offenders, f"library code hard-codes ../shared: {offenders}"


def test_tests_reach_the_shared_files_only_through_conftest():
    """conftest.py alone builds the path of the real test files (honouring PATHTWT_SHARED);
    a test that built ../shared itself would miss them wherever they lie elsewhere."""
    tests = Path(__file__).resolve().parent
    built = re.compile(r"""/\s*["']shared["']|parents\[2\]|environ\.get\(\s*["']PATHTWT_SHARED""")
    offenders = [p.name for p in sorted(tests.glob("*.py"))
                 if p.name not in ("conftest.py", Path(__file__).name) and built.search(p.read_text())]
    assert not offenders, f"these tests build the ../shared path themselves; use conftest's SHARED_*: {offenders}"
