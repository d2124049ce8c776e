"""The patch `gpusync fix` prints: a unified diff `git apply` and `patch -p1` accept, paths
relative to the current directory, each hunk's header naming the sites it removes; above it,
comment lines (ignored by both tools) say per patch what was verified."""
from __future__ import annotations

import difflib
import os
from dataclasses import dataclass, field

from .result import FixResult, Verified

_CONTEXT = 3
_NO_NEWLINE = "\\ No newline at end of file\n"


@dataclass
class Hunk:
    file: str  # as the diff names it
    header: str  # "@@ -12,7 +12,8 @@"
    lines: list[str]
    patches: list[Verified] = field(default_factory=list)  # whose edits fall in it


def relative(path: str) -> str:
    return os.path.relpath(path)


def _range(start: int, length: int) -> str:
    if length == 0:
        return f"{start},0"
    return f"{start + 1}" if length == 1 else f"{start + 1},{length}"


def hunks(result: FixResult) -> list[Hunk]:
    out: list[Hunk] = []
    for path, (before, after) in result.texts.items():
        old, new = before.splitlines(keepends=True), after.splitlines(keepends=True)
        matcher = difflib.SequenceMatcher(None, old, new, autojunk=False)
        for group in matcher.get_grouped_opcodes(_CONTEXT):
            i1, i2, j1, j2 = group[0][1], group[-1][2], group[0][3], group[-1][4]
            lines: list[str] = []
            for tag, a1, a2, b1, b2 in group:
                if tag == "equal":
                    lines += [" " + line for line in old[a1:a2]]
                    continue
                lines += ["-" + line for line in old[a1:a2]]
                lines += ["+" + line for line in new[b1:b2]]
            lines = [line if line.endswith("\n") else line + "\n" + _NO_NEWLINE
                     for line in lines]
            header = f"@@ -{_range(i1, i2 - i1)} +{_range(j1, j2 - j1)} @@"
            touched = [v for v in result.patches if any(
                e.path == path and i1 < _line(v, e.path, e.end[0]) + 1
                and _line(v, e.path, e.start[0]) <= i2 + 1 for e in v.proposal.edits)]
            out.append(Hunk(relative(path), header, lines, touched))
    return out


def _line(v: Verified, path: str, line: int) -> int:
    """An edit's line in the original text (a second round's edit was made on the first's)."""
    return (v.lines or {}).get(path, {}).get(line, line)


def _removes(hunk: Hunk) -> str:
    names = dict.fromkeys(f"{v.proposal.site.op} at line {v.proposal.site.line} "
                          f"({v.proposal.remedy})" for v in hunk.patches)
    return f" removes {'; '.join(names)}: verified (see above)" if names else ""


def render(result: FixResult) -> str:
    """The whole patch: the verification as comment lines, then each file's hunks."""
    lines = [f"# {result.command or 'gpusync fix ' + result.target}: {len(result.patches)} "
             "patch(es), syncs per "
             f"step {result.syncs_before:g} -> {_after(result)}"]
    for v in result.patches:
        site = v.proposal.site
        lines.append(f"# {v.proposal.remedy} at {site.relative_where}: "
                     f"{v.proposal.summary}")
        lines.append(f"#   verified: removes {', '.join(v.check.removed)}"
                     + (f"; moves {', '.join(v.check.moved)}" if v.check.moved else "")
                     + f"; {', '.join(v.check.parity)} (seed {result.seed})")
    text = "\n".join(lines) + "\n"
    current = None
    for hunk in hunks(result):
        if hunk.file != current:
            current = hunk.file
            text += f"--- a/{hunk.file}\n+++ b/{hunk.file}\n"
        text += hunk.header + _removes(hunk) + "\n" + "".join(hunk.lines)
    return text


def _after(result: FixResult) -> str:
    if not result.patches:
        return f"{result.syncs_before:g} (no patch)"
    return "not verified" if result.syncs_after is None else f"{result.syncs_after:g}"
