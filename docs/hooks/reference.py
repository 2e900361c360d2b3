"""The generated parts of the documentation, and the MkDocs hook that puts them in.

The configuration reference is read from the schema the workflow validates against
(``pathtwt/config/schema.yaml`` through :func:`pathtwt.config.check.load_schema`, so the
tiling defaults are the ones ``pathtwt tile`` uses), the command-line reference from the
argparse parsers of ``pathtwt.cli``. Both are committed in their pages
(``docs/configuration.md``, ``docs/cli.md``) between a begin and an end marker line, so
they read on GitHub as on the site; ``tests/test_docs.py`` fails when they are stale, and

    .venv/bin/python docs/hooks/reference.py           # rewrites them from the code
    .venv/bin/python docs/hooks/reference.py --check   # lists the stale ones, exit 1

The list of refusals and the package layout (with source line numbers, which every edit
moves) are filled in only when the site is built, at their marker lines.
"""

from __future__ import annotations

import argparse
import ast
import json
import re
import sys
from pathlib import Path
from typing import Any, Iterator

CONFIG_MARKER = "<!-- pathtwt: configuration reference -->"
CLI_MARKER = "<!-- pathtwt: command-line reference -->"
DOCS = Path(__file__).resolve().parents[1]
REFUSALS_MARKER = "<!-- pathtwt: refusals -->"
LAYOUT_MARKER = "<!-- pathtwt: package layout -->"


# ---------------------------------------------------------------- configuration


def _cell(text: Any) -> str:
    """Text for one Markdown table cell: one line, pipes escaped, and a ``<`` outside code
    spans written as an entity (``DIR/<slide_id>.h5`` is not an HTML tag)."""
    parts = " ".join(str(text).split()).replace("|", "\\|").split("`")
    return "`".join(part if i % 2 else part.replace("<", "&lt;") for i, part in enumerate(parts))


def _type_of(node: dict) -> str:
    types = node.get("type", "")
    types = types if isinstance(types, list) else [types]
    shown = []
    for t in types:
        if t == "array":
            item = node.get("items", {})
            inner = item.get("type", "any")
            if "enum" in item:
                inner = " \\| ".join(str(v) for v in item["enum"])
            shown.append(f"list of {inner}")
        elif t:
            shown.append(t)
    text = " or ".join(shown) or "any"
    if "enum" in node:
        text += ": " + " \\| ".join("null" if v is None else str(v) for v in node["enum"])
    bounds = [f"{k} {node[k]}" for k in ("minimum", "exclusiveMinimum", "maximum", "minItems", "maxItems") if k in node]
    if "pattern" in node:
        bounds.append(f"pattern `{node['pattern']}`")
    if bounds:
        text += f" ({', '.join(bounds)})"
    return text


def _default_of(node: dict, required: bool) -> str:
    if required:
        return "required"
    if "default" not in node:
        return "—"
    return f"`{json.dumps(node['default'])}`"


def iter_config_keys(node: dict, path: str, required: bool = False) -> Iterator[tuple[str, dict, bool]]:
    """(dotted key, schema node, required) for ``node`` and every key under it; a mapping of
    user-chosen names (cohorts, tasks, ...) appears as ``NAME``."""
    yield path, node, required
    needed = set(node.get("required", []))
    for key, child in node.get("properties", {}).items():
        yield from iter_config_keys(child, f"{path}.{key}" if path else key, key in needed)
    extra = node.get("additionalProperties")
    if isinstance(extra, dict) and extra.get("type") == "object":
        yield from iter_config_keys(extra, f"{path}.NAME", False)


def config_reference() -> str:
    from pathtwt.config.check import load_schema

    schema = load_schema()
    lines = []
    plain = [k for k, v in schema["properties"].items() if "properties" not in v and "additionalProperties" not in v]
    sections = [k for k in schema["properties"] if k not in plain]
    header = ["| key | type | default | description |", "|---|---|---|---|"]

    def row(path: str, node: dict, required: bool) -> str:
        text = node.get("description") or ("One entry per name you choose; its keys follow." if path.endswith(".NAME") else "")
        return f"| `{path}` | {_type_of(node)} | {_default_of(node, required)} | {_cell(text)} |"

    lines += ["## Top-level keys", "", *header]
    lines += [row(k, schema["properties"][k], False) for k in plain]
    for key in sections:
        node = schema["properties"][key]
        lines += ["", f"## `{key}`", "", _cell(node.get("description", "")), "", *header]
        lines += [row(p, n, r) for p, n, r in iter_config_keys(node, key) if p != key]
    return "\n".join(lines) + "\n"


# ---------------------------------------------------------------- command line


def _subparsers(parser: argparse.ArgumentParser) -> dict[str, tuple[argparse.ArgumentParser, str]]:
    """name -> (parser, its one-line help) of ``parser``'s subcommands."""
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            helps = {a.dest: a.help or "" for a in action._choices_actions}
            return {name: (sub, helps.get(name, "")) for name, sub in action.choices.items()}
    return {}


def _usage_item(action: argparse.Action, required: bool) -> str:
    """One argument of a usage line: ``--flag VALUE``, ``NAME`` or a positional's choices."""
    if not action.option_strings:
        if action.metavar is not None:
            text = action.metavar if isinstance(action.metavar, str) else " ".join(action.metavar)
        else:
            text = "{" + ",".join(map(str, action.choices)) + "}" if action.choices else action.dest
        return {"*": f"[{text} ...]", "?": f"[{text}]", "+": f"{text} ..."}.get(action.nargs, text)
    text = action.option_strings[0]
    if action.nargs != 0:
        text += " " + _metavar(action)
        if action.nargs in ("+", "*"):
            text += " ..."
    return text if required else f"[{text}]"


def _usage(parser: argparse.ArgumentParser) -> str:
    """The usage lines, written here rather than by argparse (whose layout changes between
    Python versions), so the committed reference is the same wherever it is generated."""
    grouped = {id(a): g for g in parser._mutually_exclusive_groups for a in g._group_actions}  # noqa: SLF001
    items, positionals, seen = [], [], set()
    for action in parser._actions:  # noqa: SLF001
        group = grouped.get(id(action))
        if action.help == argparse.SUPPRESS:
            continue
        if not action.option_strings:  # after the options, as argparse shows them
            positionals.append(_usage_item(action, True))
            if isinstance(action, argparse._SubParsersAction):  # noqa: SLF001
                positionals.append("...")
        elif group is None:
            items.append(_usage_item(action, action.required))
        elif id(group) not in seen:
            seen.add(id(group))
            inner = " | ".join(_usage_item(a, True) for a in group._group_actions)  # noqa: SLF001
            items.append(f"({inner})" if group.required else f"[{inner}]")
    items += positionals
    # lines of at most 88 characters, never broken inside an argument, continued under the first
    lines, indent = [parser.prog], " " * (len(parser.prog) + 1)
    for item in items:
        if len(lines[-1]) + 1 + len(item) > 88 and lines[-1].strip() != "":
            lines.append(indent + item)
        else:
            lines[-1] += " " + item
    return "\n".join(lines)


def _metavar(action: argparse.Action) -> str:
    metavar = action.metavar or ("{" + ",".join(map(str, action.choices)) + "}" if action.choices else action.dest.upper())
    return metavar if isinstance(metavar, str) else " ".join(metavar)


def _help(parser: argparse.ArgumentParser, action: argparse.Action) -> str:
    if not action.help:
        return ""
    formatter = parser.formatter_class(prog=parser.prog)
    return formatter._expand_help(action).replace("`", "")  # noqa: SLF001 (argparse's own expansion of %(default)s)


def _command_section(path: str, parser: argparse.ArgumentParser, summary: str) -> list[str]:
    level = "#" * min(2 + path.count(" ") - 1, 4)
    lines = [f"{level} `{path}`", ""]
    text = parser.description or summary
    if text:
        lines += [_cell(text), ""]
    lines += ["```text", _usage(parser), "```", ""]
    rows = []
    for action in parser._actions:
        if isinstance(action, (argparse._HelpAction, argparse._SubParsersAction)) or action.help == argparse.SUPPRESS:
            continue
        name = ", ".join(f"`{s}`" for s in action.option_strings) or f"`{action.metavar or action.dest}`"
        value = ""
        if action.nargs != 0 and action.option_strings:
            value = f"`{_metavar(action)}`"
            if action.nargs in ("+", "*"):
                value += " ..."
        required = " (required)" if action.required and action.option_strings else ""
        rows.append(f"| {name} | {value} | {_cell(_help(parser, action))}{required} |")
    if rows:
        lines += ["| argument | value | meaning |", "|---|---|---|", *rows, ""]
    return lines


def cli_reference() -> str:
    from pathtwt.cli import build_parser

    root = build_parser()
    lines = [
        "Every subcommand, its arguments and their defaults, as `pathtwt COMMAND --help` prints them.",
        "",
    ]

    def walk(path: str, parser: argparse.ArgumentParser, summary: str) -> None:
        lines.extend(_command_section(path, parser, summary))
        for name, (sub, help_text) in _subparsers(parser).items():
            walk(f"{path} {name}", sub, help_text)

    for name, (parser, help_text) in _subparsers(root).items():
        walk(f"pathtwt {name}", parser, help_text)
    return "\n".join(lines) + "\n"


# ---------------------------------------------------------------- refusals and layout


def _package_root() -> Path:
    import pathtwt

    return Path(pathtwt.__file__).resolve().parent


# the errors a user meets: pathtwt.errors' classes (and their subclasses) and SystemExit
USER_ERRORS = {"PathtwtError", "SlideError", "ConfigError", "WeightsError", "NumericsError", "ProbeDataError", "OutputError", "StoreError",
               "SystemExit"}

# package -> the heading its refusals are listed under, in the order of the pipeline
STAGES = {
    "config": "Configs and label tables",
    "wsi": "Slides and tiling",
    "demo": "Demo slides",
    "models": "Backbones and weights",
    "devices.py": "Devices",
    "compress": "Calibration and compression",
    "features": "Extraction and export",
    "io": "Files between stages",
    "mil": "MIL heads and label tables",
    "probe": "Tile probes",
    "analysis": "Analyses",
    "report": "Report",
    "cli": "Command-line arguments",
}


def _message_text(node: ast.AST) -> str:
    """The message of a raise as a reader sees it: literal text, with each value filled in at
    run time shown as {expression}."""
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return node.value
    if isinstance(node, ast.JoinedStr):
        parts = []
        for value in node.values:
            if isinstance(value, ast.Constant):
                parts.append(str(value.value))
            else:
                parts.append("{" + ast.unparse(value.value) + "}")
        return "".join(parts)
    if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Add):
        return _message_text(node.left) + _message_text(node.right)
    return "{" + ast.unparse(node) + "}"


def _plain(text: str) -> str:
    """``text`` as literal Markdown table text: one line, nothing read as markup."""
    text = " ".join(str(text).split()).replace("`", "")
    for char in ("\\", "_", "*", "[", "]", ">", "{", "}"):
        text = text.replace(char, "\\" + char)
    return text.replace("<", "&lt;").replace("|", "\\|")


def iter_refusals() -> Iterator[tuple[str, str, str, int, str]]:
    """(stage, error class, module path, line, message) of every raise of a user-facing error
    in the package."""
    root = _package_root()
    for path in sorted(root.rglob("*.py")):
        rel = path.relative_to(root)
        stage = STAGES.get(rel.parts[0]) if len(rel.parts) > 1 else STAGES.get(rel.name)
        if stage is None:
            continue
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if not isinstance(node, ast.Raise) or not isinstance(node.exc, ast.Call):
                continue
            func = node.exc.func
            name = func.id if isinstance(func, ast.Name) else getattr(func, "attr", "")
            if name not in USER_ERRORS or not node.exc.args:
                continue
            yield stage, name, f"pathtwt/{rel.as_posix()}", node.lineno, _message_text(node.exc.args[0])


def refusals_reference() -> str:
    rows: dict[str, list[str]] = {stage: [] for stage in STAGES.values()}
    for stage, error, module, line, message in iter_refusals():
        rows[stage].append(f"| {_plain(message)} | {error} | `{module}:{line}` |")
    lines = []
    for stage, body in rows.items():
        if body:
            lines += [f"### {stage}", "", "| message | error | raised in |", "|---|---|---|", *body, ""]
    return "\n".join(lines) + "\n"


def layout_reference() -> str:
    """The package's folders and modules with the first line of each module's docstring."""
    root = _package_root()
    lines = ["| module | what it does |", "|---|---|"]
    for path in sorted(root.rglob("*.py"), key=lambda p: (p.parent.relative_to(root).parts, p.name != "__init__.py", p.name)):
        doc = ast.get_docstring(ast.parse(path.read_text(encoding="utf-8"))) or ""
        first = doc.strip().split("\n\n")[0].replace("\n", " ")
        rel = path.relative_to(root).as_posix()
        name = f"pathtwt/{rel[:-len('__init__.py')]}" if path.name == "__init__.py" else f"pathtwt/{rel}"
        if path.name == "__init__.py" and not first:
            continue
        shown = f"**`{name}`**" if path.name == "__init__.py" else f"`{name}`"
        lines.append(f"| {shown} | {_plain(first) or '—'} |")
    return "\n".join(lines) + "\n"


# ---------------------------------------------------------------- the hook

# A page can be a README that lives beside the files it documents (workflow/profiles/,
# workflow/envs/): `<!-- pathtwt: include PATH -->` puts that file in. It links into the docs
# as ../../docs/PAGE.md, which is right where it lives; on the site the page is beside them.
INCLUDE = re.compile(r"^<!-- pathtwt: include (\S+) -->$", re.M)
LINK_INTO_DOCS = re.compile(r"\]\((?:\.\./)+docs/")


def include(match: re.Match) -> str:
    text = (Path(__file__).resolve().parents[2] / match.group(1)).read_text(encoding="utf-8")
    return LINK_INTO_DOCS.sub("](", text)


# The references committed in their pages: page -> (marker, generator). The generated text
# stands between "<!-- pathtwt: ...: begin -->" and "<!-- pathtwt: ...: end -->".
COMMITTED = {"configuration.md": (CONFIG_MARKER, config_reference), "cli.md": (CLI_MARKER, cli_reference)}


def _ends(marker: str) -> tuple[str, str]:
    return marker.replace(" -->", ": begin -->"), marker.replace(" -->", ": end -->")


def refreshed(markdown: str, marker: str, text: str) -> str:
    """``markdown`` with the block between ``marker``'s begin and end lines set to ``text``."""
    begin, end = _ends(marker)
    pattern = re.compile(re.escape(begin) + r"\n.*?" + re.escape(end), re.S)
    if not pattern.search(markdown):
        raise ValueError(f"no {begin} ... {end} block")
    return pattern.sub(lambda _: f"{begin}\n{text}{end}", markdown, count=1)


def expected_pages(docs: Path = DOCS) -> dict[Path, str]:
    """Each committed reference page as it should read now."""
    out = {}
    for name, (marker, generate) in COMMITTED.items():
        path = docs / name
        out[path] = refreshed(path.read_text(encoding="utf-8"), marker, generate())
    return out


def stale_pages(docs: Path = DOCS) -> list[Path]:
    return [path for path, text in expected_pages(docs).items() if path.read_text(encoding="utf-8") != text]


def on_page_markdown(markdown: str, page, config, files) -> str:  # noqa: ARG001 (MkDocs' signature)
    markdown = INCLUDE.sub(include, markdown)
    # the committed references, as the code reads now (the test keeps the committed copy equal)
    for marker, generate in COMMITTED.values():
        if _ends(marker)[0] in markdown:
            markdown = refreshed(markdown, marker, generate())
    if REFUSALS_MARKER in markdown:
        markdown = markdown.replace(REFUSALS_MARKER, refusals_reference())
    if LAYOUT_MARKER in markdown:
        markdown = markdown.replace(LAYOUT_MARKER, layout_reference())
    return markdown


def main(argv: list[str]) -> int:
    check = argv == ["--check"]
    if argv and not check:
        print("usage: python docs/hooks/reference.py [--check]", file=sys.stderr)
        return 2
    if check:
        stale = stale_pages()
        for path in stale:
            print(f"{path.relative_to(DOCS.parent)} is stale: run python docs/hooks/reference.py", file=sys.stderr)
        return 1 if stale else 0
    for path, text in expected_pages().items():
        if path.read_text(encoding="utf-8") != text:
            tmp = path.with_name(f".{path.name}.tmp")
            tmp.write_text(text, encoding="utf-8")
            tmp.replace(path)
            print(f"wrote {path.relative_to(DOCS.parent)}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
