"""README.md and docs/commands/*.md against the CLI itself, so that neither can drift: every
`gpusync ...` line they show names a command that exists and options it takes, with valid
values (a line with no placeholders is parsed whole by click), and every option of every
command is in its page's options table. Read from click's command tree, not from --help text."""
from __future__ import annotations

import re
import shlex
from pathlib import Path

import click
import pytest

from gpusync import verbosity
from gpusync.cli import cli

ROOT = Path(__file__).resolve().parents[2]
COMMAND_DOCS = ROOT / "docs" / "commands"
DOCS = [ROOT / "README.md", *sorted(COMMAND_DOCS.glob("*.md"))]
SHELL = {"sh", "bash", "console", "shell"}
# where the options of the `gpusync` group itself (-q, -v, --version) are documented
SHARED_PAGE = COMMAND_DOCS / "common.md"
SHARED_OPTIONS = {"-q", "--quiet", "-v", "--verbose", "-h", "--help", "--version"}
# the words that end one shell command in a line: a pipe, a list, a redirection
COMMAND_END = re.compile(r"\s(?:\||&&|\|\||;|[12]?>>?|<)\s")
PLACEHOLDER = re.compile(r"(?:^|[^a-z])[A-Z][A-Z0-9_]*(?:$|[^a-z])|\.\.\.")


@pytest.fixture(autouse=True)
def _verbosity_restored():
    """Parsing `-q` / `-v` sets gpusync's verbosity (their callbacks): put it back."""
    yield
    verbosity.set_level(verbosity.NORMAL)


def _fenced(text: str):
    """(language, first line number, lines) of each fenced block; text outside them with the
    blocks blanked (line numbers kept)."""
    blocks, outside, current = [], [], None
    for number, line in enumerate(text.splitlines(), 1):
        if line.startswith("```"):
            if current is None:
                current = (line[3:].strip(), number, [])
            else:
                blocks.append(current)
                current = None
            outside.append("")
        elif current is not None:
            current[2].append(line)
            outside.append("")
        else:
            outside.append(line)
    assert current is None, f"a code block opened at line {current[1]} is never closed"
    return blocks, "\n".join(outside)


def _shell_lines(lines: list[str]) -> list[str]:
    """Whole command lines: a line ending in a backslash, or followed by an indented one (a
    synopsis), goes on; comments and a prompt's `$ ` dropped; output lines (no prompt in a
    console block that has one) left out."""
    prompted = any(line.startswith("$ ") for line in lines)
    joined: list[str] = []
    going_on = False
    for line in lines:
        if going_on or (not prompted and joined and line.startswith(" ")):
            joined[-1] = joined[-1].removesuffix("\\").rstrip() + " " + line.strip()
        elif line.startswith("$ ") or not prompted:
            joined.append(line.removeprefix("$ "))
        else:  # a console block's output
            continue
        going_on = joined[-1].endswith("\\")
    return [re.sub(r"(^|\s)#\s.*$", "", line).strip() for line in joined]


def command_lines(path: Path) -> list[tuple[str, bool]]:
    """(text, whole) for each gpusync command the page shows: `whole` for a line of a shell
    block (a usage line, parsed whole when it has no placeholder), not for inline code."""
    blocks, outside = _fenced(path.read_text())
    found = []
    for language, _, lines in blocks:
        if language in SHELL:
            found += [(line, True) for line in _shell_lines(lines)]
        elif language == "yaml":  # a CI recipe's `- run: ...` steps
            found += [(m.group(1), True) for line in lines
                      if (m := re.search(r"\brun:\s+(.*)$", line))]
    for span in re.findall(r"`([^`]+)`", outside):
        found.append((" ".join(span.split()), False))
    return [(segment.strip(), whole) for text, whole in found
            for segment in COMMAND_END.split(f" {text} ") if _gpusync_words(segment) is not None]


def _gpusync_words(segment: str) -> list[str] | None:
    """The words after `gpusync` (or `-m gpusync`) in one shell command, None if it runs no
    gpusync command."""
    try:
        words = shlex.split(segment)
    except ValueError:
        words = segment.split()
    for i, word in enumerate(words):
        if word in ("gpusync", ".venv/bin/gpusync") and i + 1 < len(words) \
                and (i == 0 or words[i - 1] in ("-m", "exec", "time")):
            return [w.strip("[]") for w in words[i + 1:] if w.strip("[]") not in ("", "...")]
    return None


def _option(command: click.Command, name: str) -> click.Option | None:
    for param in command.params:
        if isinstance(param, click.Option) and name in (*param.opts, *param.secondary_opts):
            return param
    return None


def _leaf(words: list[str]) -> tuple[list[click.Command], list[str], list[str]]:
    """(the commands the words may name, the path to them, the words left): group options
    skipped, a placeholder subcommand (TECHNIQUE, `TECHNIQUE|all`) standing for any."""
    command: click.Command = cli
    path = ["gpusync"]
    while isinstance(command, click.Group):
        while words and words[0] in SHARED_OPTIONS:
            words = words[1:]
        if not words:  # the group named in prose (`gpusync bench`)
            return [command], path, []
        names = words[0].split("|")
        unknown = [n for n in names if n not in command.commands and not PLACEHOLDER.search(n)]
        assert not unknown, f"{' '.join(path)} has no subcommand {unknown[0]!r}"
        named = [command.commands[n] for n in names if n in command.commands]
        if len(named) != len(names):  # a placeholder: any subcommand
            return list(command.commands.values()), [*path, words[0]], words[1:]
        command, path, words = named[0], [*path, names[0]], words[1:]
    return [command], path, words


def _check_value(options: list[click.Option], value: str, where: str) -> None:
    """Each alternative of `a|b` a valid value of the option (of one of them, for a placeholder
    subcommand), unless it is a placeholder itself (N, FILE, ...)."""
    for alternative in value.split("|"):
        if PLACEHOLDER.search(alternative):
            continue
        errors = []
        for option in options:
            try:
                option.type.convert(alternative, option, click.Context(click.Command("doc")))
            except click.BadParameter as e:
                errors.append(e.format_message())
        if len(errors) == len(options):
            pytest.fail(f"{where}: {alternative!r} for {options[0].opts[-1]}: {errors[0]}")


def check_line(text: str, whole: bool, where: str) -> None:
    words = _gpusync_words(text)
    assert words is not None
    candidates, path, rest = _leaf(words)
    where = f"{where}: `{text}`"
    concrete, i = whole, 0
    while i < len(rest):
        word = rest[i]
        if word == "--":
            break
        if not word.startswith("-") or re.fullmatch(r"-[\d.]+", word):
            concrete &= not PLACEHOLDER.search(word) and "|" not in word
            i += 1
            continue
        name, _, value = word.partition("=")
        if name in SHARED_OPTIONS:  # every command's (-h / --help is click's own)
            i += 1
            continue
        for spelling in name.split("/"):
            options = [o for c in candidates if (o := _option(c, spelling)) is not None]
            assert options, f"{where}: {' '.join(path)} has no option {spelling}"
        if options[0].is_flag or options[0].count:
            i += 1
            continue
        if not value and (i + 1 == len(rest) or rest[i + 1] == "--"):
            assert not whole, f"{where}: {name} needs a value"  # in prose, the option named
            break
        if not value:
            value, i = rest[i + 1], i + 1
        _check_value(options, value, where)
        concrete &= not PLACEHOLDER.search(value) and "|" not in value
        i += 1
    if concrete and len(candidates) == 1:  # an example: click parses it as it would run it
        try:
            parent = click.Context(cli, info_name="gpusync")
            candidates[0].make_context(path[-1], list(rest), parent=parent)
        except click.UsageError as e:
            pytest.fail(f"{where}: {e.format_message()}")


def _lines():
    for path in DOCS:
        for text, whole in command_lines(path):
            yield pytest.param(text, whole, id=f"{path.name}: {text[:60]}")


@pytest.mark.parametrize("text, whole", list(_lines()))
def test_each_command_line_shown_parses(text, whole):
    check_line(text, whole, "docs")


def _commands(command: click.Command, path: tuple = ()):
    """Every command under a top-level one, bench's techniques and `bench all` among them."""
    yield path, command
    if isinstance(command, click.Group):
        for name, sub in command.commands.items():
            yield from _commands(sub, (*path, name))


def table_options(path: Path) -> set[str]:
    """The options a page documents: those named in the first cell of a table row."""
    _, outside = _fenced(path.read_text())
    names = set()
    for line in outside.splitlines():
        if line.startswith("|") and not re.fullmatch(r"[|\s:-]+", line):
            first = re.split(r"(?<!\\)\|", line)[1]
            names |= set(re.findall(r"`(-{1,2}[a-zA-Z][\w-]*)", first))
    return names


@pytest.mark.parametrize("name", sorted(cli.commands))
def test_each_command_has_a_page_with_every_option_and_no_other(name):
    page = COMMAND_DOCS / f"{name}.md"
    assert page.is_file(), f"`gpusync {name}` has no page {page.relative_to(ROOT)}"
    documented = table_options(page)
    options = {spelling for _, command in _commands(cli.commands[name])
               for param in command.params
               if isinstance(param, click.Option) and not param.hidden
               for spelling in (*param.opts, *param.secondary_opts)} - SHARED_OPTIONS
    assert not options - documented, \
        f"{page.name} does not document {sorted(options - documented)} in its options table"
    assert not documented - options, \
        f"{page.name} documents options `gpusync {name}` lacks: {sorted(documented - options)}"
    assert "(common.md" in page.read_text(), f"{page.name} does not link to common.md"


def test_the_shared_options_are_documented():
    shared = {spelling for param in cli.params if isinstance(param, click.Option)
              for spelling in (*param.opts, *param.secondary_opts)} | {"-h", "--help"}
    assert shared == SHARED_OPTIONS
    assert not shared - table_options(SHARED_PAGE)


def _anchor(heading: str) -> str:
    """GitHub's anchor for a heading."""
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


@pytest.mark.parametrize("path", DOCS, ids=lambda p: p.name)
def test_links_reach_a_file_and_heading(path):
    _, outside = _fenced(path.read_text())
    for target in re.findall(r"\]\(([^)\s]+)\)", outside):
        if re.match(r"[a-z]+:", target):
            continue
        file, _, anchor = target.partition("#")
        linked = (path.parent / file).resolve() if file else path
        assert linked.exists(), f"{path.name}: link to missing {target}"
        if anchor and linked.suffix == ".md":
            _, text = _fenced(linked.read_text())
            anchors = {_anchor(h) for h in re.findall(r"^#+ (.*)$", text, re.M)}
            assert anchor in anchors, f"{path.name}: {target}: no such heading"


# a docs page named in code, a message or a script's manifest: docs/commands/scan.md#steps
DOCS_POINTER = re.compile(r"\bdocs/[\w./-]+?\.md(?:#[\w-]+)?")


def test_every_docs_page_named_in_code_or_a_message_exists():
    """gpusync's messages and comments, the scripts and the tests point at docs pages (and
    their headings) by path: each must reach one, as README sections once moved away."""
    sources = [p for folder in ("gpusync", "scripts", "tests") for p in (ROOT / folder).rglob("*")
               if p.suffix in (".py", ".sh", ".yaml", ".cpp") and p.is_file()]
    named = 0
    for source in sources:
        for pointer in DOCS_POINTER.findall(source.read_text(errors="replace")):
            file, _, anchor = pointer.partition("#")
            page = ROOT / file
            assert page.is_file(), f"{source.relative_to(ROOT)} names missing {pointer}"
            if anchor:
                _, text = _fenced(page.read_text())
                anchors = {_anchor(h) for h in re.findall(r"^#+ (.*)$", text, re.M)}
                assert anchor in anchors, f"{source.relative_to(ROOT)}: {pointer}: no such heading"
            named += 1
    assert named  # the pattern still finds what the code names


def test_readme_is_short_and_links_every_page():
    text = (ROOT / "README.md").read_text()
    assert len(text.splitlines()) <= 150
    # the project's two commands, which scripts/quickstart.sh, scripts/test.sh and .ci/run name
    assert "bash scripts/quickstart.sh" in text and "bash scripts/test.sh" in text
    for page in [*COMMAND_DOCS.glob("*.md"), *(ROOT / "docs" / name for name in (
            "design.md", "guarantees.md", "rules.md", "cost-model.md", "fix.md"))]:
        assert f"({page.relative_to(ROOT)}" in text, f"README.md does not link to {page.name}"


def test_every_code_block_says_its_language():
    """A block without a language would escape the command check above."""
    for path in DOCS:
        blocks, _ = _fenced(path.read_text())
        unnamed = [line for language, line, _ in blocks if not language]
        assert not unnamed, f"{path.name}: code blocks without a language at lines {unnamed}"
