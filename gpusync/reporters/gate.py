"""The gate's verdict: text for a terminal, GitHub workflow annotations, or JSON."""
from __future__ import annotations

import json
from dataclasses import asdict

from .registry import renders


def _escape_data(text: str) -> str:
    """GitHub workflow command data: %, CR and LF are encoded."""
    return text.replace("%", "%25").replace("\r", "%0D").replace("\n", "%0A")


def _escape_property(text: str) -> str:
    """GitHub workflow command property values: also : and , are encoded."""
    return _escape_data(text).replace(":", "%3A").replace(",", "%2C")


def _annotation(level: str, message: str, title: str = "gpusync", file: str = "",
                line: int = 0) -> str:
    props = [f"title={_escape_property(title)}"]
    if file:
        props = [f"file={_escape_property(file)}", *([f"line={line}"] if line else []), *props]
    return f"::{level} {','.join(props)}::{_escape_data(message)}"


@renders("gate", "text")
def gate_text(verdict) -> str:
    out = []
    for p in verdict.problems:
        where = f" ({p.file}:{p.line})" if p.file else ""
        fix = f"\n  fix: {p.advice}" if p.advice and not p.improvement else ""
        out.append(f"FAIL {p.message}{where}{fix}")
    out += [f"note: {note}" for note in verdict.notes]
    if verdict.suggested_baseline:
        out.append(f"suggested new baseline written to {verdict.suggested_baseline}")
    out.append(f"gate: {verdict.headline}")
    return "\n".join(out) + "\n"


@renders("gate", "json")
def gate_json(verdict) -> str:
    from ..schemas import document

    return json.dumps(document("gpusync-gate", {
        "status": verdict.status.value, "exit_code": verdict.exit_code,
        "problems": [_problem(p) for p in verdict.problems], "notes": verdict.notes,
        "suggested_baseline": verdict.suggested_baseline}), indent=2) + "\n"


def _problem(problem) -> dict:
    """A problem's JSON form (schemas/gate.schema.json), whose key for the advice is "fix"."""
    d = {("fix" if k == "advice" else k): v for k, v in asdict(problem).items()}
    return {**d, "kind": problem.kind.value}


def failed_json(message: str) -> str:
    """The document of a gate whose scan failed (exit 3): a CI step that reads the JSON gets
    the status and why, not an empty stdout."""
    from ..schemas import document

    return json.dumps(document("gpusync-gate", {
        "status": "failed", "exit_code": 3, "problems": [], "notes": [message],
        "suggested_baseline": None}), indent=2) + "\n"


def failed_github(message: str) -> str:
    """The annotation for a gate whose scan failed (exit 3): the pull request shows why the
    check failed, not only the log."""
    return _annotation("error", message, title="gpusync: the scanned code failed") + "\n"


@renders("gate", "github")
def gate_github(verdict) -> str:
    out = []
    for p in verdict.problems:
        level = "warning" if p.improvement else "error"
        # the advice travels with every annotation: for a site gone, the baseline's
        message = p.message + (f"\nfix: {p.advice}" if p.advice else "")
        out.append(_annotation(level, message, f"gpusync: {p.kind.value}", p.file, p.line))
    out += [_annotation("notice", note) for note in verdict.notes]
    if verdict.suggested_baseline:
        out.append(_annotation("notice", "suggested new baseline written to "
                               f"{verdict.suggested_baseline}"))
    return "\n".join(out) + "\n"
