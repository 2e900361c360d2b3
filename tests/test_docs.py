"""The documentation is built, its commands run as shown, and its references cannot drift.

- `mkdocs build --strict` builds the site (a broken link, anchor, snippet or missing page
  fails it), and the built reference pages hold every schema key and every flag;
- every `pathtwt ...` command in a code block of the docs (the files they include
  too) and of the README names a subcommand that exists and only flags that subcommand
  takes, and one without placeholders parses as it stands (choices, types, required
  arguments);
- every full study config shown validates against the schema;
- the README stays a front page: at most 250 lines, its relative links resolve, and its
  "Two commands" section keeps the test command `.ci/run` runs.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib.util
import io
import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from pathtwt.cli import build_parser
from pathtwt.cli.options import iter_parsers

REPO = Path(__file__).resolve().parents[1]
DOCS = REPO / "docs"
FENCE = re.compile(r"^\s*(`{3,}|~{3,})")
SNIPPET = re.compile(r'^--8<-- "([^":]+)(?::[^"]*)?"\s*$', re.M)
INCLUDE = re.compile(r"^<!-- pathtwt: include (\S+) -->$", re.M)


def _hook():
    spec = importlib.util.spec_from_file_location("docs_reference_hook", DOCS / "hooks" / "reference.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _pages() -> list[Path]:
    """The README, every docs page, and every file a page includes as a snippet."""
    pages = [REPO / "README.md", *sorted(DOCS.glob("*.md"))]
    included = {REPO / m for p in pages for pattern in (SNIPPET, INCLUDE)
                for m in pattern.findall(p.read_text(encoding="utf-8"))}
    return pages + sorted(included - set(pages))


GENERATED = re.compile(r"^<!-- pathtwt: [^>]*: begin -->$.*?^<!-- pathtwt: [^>]*: end -->$", re.M | re.S)


def _code_blocks(path: Path) -> list[str]:
    """The contents of the fenced code blocks of a Markdown file, outside the references
    generated from the parsers and the schema (their usage lines are not commands)."""
    blocks, fence, lines = [], None, []
    for line in GENERATED.sub("", path.read_text(encoding="utf-8")).splitlines():
        match = FENCE.match(line)
        if fence is None and match:
            fence, lines = match.group(1), []
        elif fence is not None and match and match.group(1).startswith(fence) and not line.strip().strip(fence[0]):
            blocks.append("\n".join(lines) + "\n")
            fence = None
        elif fence is not None:
            lines.append(line)
    return blocks


def _commands(block: str) -> list[list[str]]:
    """The `pathtwt` command lines of a code block, continuation lines joined, as argument
    lists starting at the subcommand (comments, pipes and chained commands cut off)."""
    text = re.sub(r"\\\n\s*", " ", block)
    commands = []
    for line in text.splitlines():
        try:
            tokens = shlex.split(line, comments=True)
        except ValueError:
            tokens = line.split()
        for i, token in enumerate(tokens):
            head = token.rsplit("/", 1)[-1]
            if head == "pathtwt" and (i == 0 or tokens[i - 1] in ("-m", "srun", "&&", ";") or "/" in token):
                rest = tokens[i + 1:]
                if rest and rest[0].endswith(":"):
                    continue  # a message the command prints ("pathtwt tile: error: ..."), not a command
                for j, t in enumerate(rest):
                    if t in ("|", "&&", ";", ">", "2>", "||"):
                        rest = rest[:j]
                        break
                commands.append(rest)
    return commands


def _subcommand_parser(root: argparse.ArgumentParser, args: list[str]) -> tuple[str, argparse.ArgumentParser, list[str]]:
    parsers = dict(iter_parsers(root))
    path, parser, rest = "pathtwt", root, list(args)
    while rest and f"{path} {rest[0]}" in parsers:
        path = f"{path} {rest[0]}"
        parser = parsers[path]
        rest = rest[1:]
    return path, parser, rest


def _flags(parser: argparse.ArgumentParser) -> set[str]:
    return {s for action in parser._actions for s in action.option_strings}


def test_every_pathtwt_command_in_the_docs_exists_with_its_flags():
    root = build_parser()
    seen, problems = 0, []
    for page in _pages():
        for block in _code_blocks(page):
            for args in _commands(block):
                seen += 1
                path, parser, rest = _subcommand_parser(root, args)
                where = f"{page.relative_to(REPO)}: pathtwt {' '.join(args)}"
                if path == "pathtwt":
                    problems.append(f"{where}: no such subcommand")
                    continue
                if any(isinstance(a, argparse._SubParsersAction) for a in parser._actions):
                    problems.append(f"{where}: {path} needs one of its subcommands")
                if not any(mark in t for t in args for mark in ("...", "(", "[", "|", "$")):
                    try:  # a command without placeholders parses as it stands: choices, types, required
                        with contextlib.redirect_stderr(io.StringIO()) as err:
                            root.parse_args(args)
                    except SystemExit:
                        problems.append(f"{where}: {err.getvalue().strip().splitlines()[-1]}")
                flags = _flags(parser)
                for token in rest:
                    token = token.strip("([")
                    if token.startswith("-") and len(token) > 1 and not token[1].isdigit():
                        flag = token.split("=", 1)[0].rstrip(")]")
                        if flag not in flags:
                            problems.append(f"{where}: {path} has no {flag}")
    assert seen >= 15, f"only {seen} pathtwt commands found in the docs' code blocks"
    assert not problems, "\n".join(problems)


def test_the_command_finder_reads_continuations_and_stops_at_pipes():
    block = "PYTHONPATH=$PWD torchrun -m pathtwt compress --backbone h0-mini \\\n  --depth 5 | tee log  # note --nope\n"
    assert _commands(block) == [["compress", "--backbone", "h0-mini", "--depth", "5"]]
    assert _commands(".venv/bin/pathtwt tile s.svs --out s.h5 && .venv/bin/pathtwt report") == [
        ["tile", "s.svs", "--out", "s.h5"], ["report"]]
    assert _commands("pathtwt compress: error: lower --batch-size") == []


def test_every_full_config_shown_validates_against_the_schema():
    from pathtwt.config.check import validate_schema

    checked = 0
    for page in _pages():
        for block in _code_blocks(page):
            try:
                data = yaml.safe_load(block)
            except yaml.YAMLError:
                continue
            if isinstance(data, dict) and {"cohorts", "tasks", "variants"} <= set(data):
                validate_schema(data, source=str(page.relative_to(REPO)))
                checked += 1
    assert checked >= 2, "the README and the docs show a full study config"


def test_readme_is_a_front_page():
    text = (REPO / "README.md").read_text(encoding="utf-8")
    assert len(text.splitlines()) <= 250
    targets = re.findall(r"\]\(([^)#\s]+)(?:#[^)]*)?\)", text) + re.findall(r'src="([^"]+)"', text)
    assert "docs/assets/similarity-vit-s14.png" in targets
    for target in targets:
        if "://" not in target:
            assert (REPO / target).exists(), f"README links to {target}, which does not exist"
    two = text.split("## Two commands", 1)[1].split("\n## ", 1)[0]
    ci = (REPO / ".ci" / "run").read_text(encoding="utf-8")
    test_command = next(b.strip() for b in _code_blocks(REPO / "README.md") if "pytest" in b)
    assert test_command in two and test_command in ci, ".ci/run runs exactly the README's test command"


@pytest.fixture(scope="module")
def site(tmp_path_factory) -> Path:
    if importlib.util.find_spec("mkdocs") is None or importlib.util.find_spec("material") is None:
        pytest.skip("mkdocs and mkdocs-material are not installed (pip install -e '.[docs]')")
    out = tmp_path_factory.mktemp("site")
    run = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(out)],
        cwd=REPO, capture_output=True, text=True, timeout=300,
        env={**os.environ, "NO_MKDOCS_2_WARNING": "1"},  # Material's banner about MkDocs 2, not ours
    )
    assert run.returncode == 0, f"mkdocs build --strict failed:\n{run.stderr[-4000:]}"
    return out


def test_site_builds_strict_with_every_page_of_the_nav(site):
    config = yaml.safe_load((REPO / "mkdocs.yml").read_text(encoding="utf-8").replace("!!python", "#"))

    def pages(nav):
        for item in nav:
            value = next(iter(item.values())) if isinstance(item, dict) else item
            yield from (pages(value) if isinstance(value, list) else [value])

    for page in pages(config["nav"]):
        built = site / ("index.html" if page == "index.md" else page.removesuffix(".md") + "/index.html")
        assert built.exists(), f"{page} is in the nav but was not built"


def test_the_committed_references_are_current(tmp_path):
    """docs/configuration.md and docs/cli.md hold the references the code generates now, so
    they read on GitHub as on the site; after changing a key, flag or help text, run
    `python docs/hooks/reference.py`."""
    hook = _hook()
    stale = [p.name for p in hook.stale_pages()]
    assert not stale, f"{stale} are stale: run python docs/hooks/reference.py"
    cli = (DOCS / "cli.md").read_text(encoding="utf-8")
    assert "| `--attention-slides` | `ATTENTION_SLIDES` |" in cli and "==SUPPRESS==" not in cli
    assert "| `report.attention_slides` | integer | `1` |" in (DOCS / "configuration.md").read_text(encoding="utf-8")
    # a page whose block says other than the code is stale, and regenerating it mends it
    for name in hook.COMMITTED:
        (tmp_path / name).write_text((DOCS / name).read_text(encoding="utf-8").replace("| `--", "| `--x", 1))
    assert sorted(p.name for p in hook.stale_pages(tmp_path)) == ["cli.md"]
    assert hook.expected_pages(tmp_path)[tmp_path / "cli.md"] == cli


def test_configuration_reference_holds_every_schema_key(site):
    html = (site / "configuration" / "index.html").read_text(encoding="utf-8")
    hook = _hook()
    from pathtwt.config.check import load_schema

    keys = [path for path, _, _ in hook.iter_config_keys(load_schema(), "") if path]
    assert len(keys) >= 90
    missing = [k for k in keys if f"<code>{k}</code>" not in html]
    assert not missing, f"the configuration reference lacks {missing}"
    # defaults are shown as the schema (and the tiling defaults it is filled with) give them
    assert "<code>cohorts.NAME.tiling.target_mpp</code></td>\n<td>number</td>\n<td><code>0.5</code>" in html


def test_cli_reference_holds_every_subcommand_and_flag(site):
    html = (site / "cli" / "index.html").read_text(encoding="utf-8")
    for path, parser in iter_parsers(build_parser()):
        if path == "pathtwt":
            continue
        assert f"<code>{path}</code>" in html, f"the command-line reference lacks {path}"
        hidden = {s for a in parser._actions if a.help == argparse.SUPPRESS for s in a.option_strings}
        for flag in _flags(parser) - {"-h", "--help"} - hidden:
            assert f"<code>{flag}</code>" in html, f"the command-line reference lacks {path} {flag}"


def test_troubleshooting_lists_every_refusal(site):
    html = (site / "troubleshooting" / "index.html").read_text(encoding="utf-8")
    refusals = list(_hook().iter_refusals())
    assert len(refusals) > 200, "the user-facing errors of the package are found"
    missing = [f"{m}:{line}" for _, _, m, line, _ in refusals if f"<code>{m}:{line}</code>" not in html]
    assert not missing, f"the troubleshooting page lacks the refusals raised at {missing[:5]}"


ALLOWED_TAGS = {"div", "figure", "figcaption", "img", "br", "details", "summary", "span", "a", "sub", "sup"}


def test_prose_holds_no_stray_html_tag():
    """Markdown passes an unknown `<word>` through as HTML: `R² L<i>` once set the rest of
    a page in italics. Outside code, only the tags the pages use on purpose."""
    for page in sorted(DOCS.glob("*.md")) + [REPO / "README.md"]:
        text = re.sub(r"```.*?```", "", page.read_text(encoding="utf-8"), flags=re.S)
        text = re.sub(r"`[^`\n]*`", "", text)
        stray = sorted({t for t in re.findall(r"</?([A-Za-z][A-Za-z0-9]*)[\s/>]", text) if t.lower() not in ALLOWED_TAGS})
        assert not stray, f"{page.name}: raw HTML tags {stray} in the prose; put them in backticks"
