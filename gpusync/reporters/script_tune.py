"""`gpusync tune SCRIPT`: its candidates as measured and judged, the settings chosen (in every
form --emit prints), and the tuned-settings file `-o` writes (`gpusync run` reads it)."""
from __future__ import annotations

import json
import time

import yaml
from tabulate import tabulate

from .. import knobs
from ..knobs import user
from .common import md_cell, md_fence, md_rows
from .registry import renders

UNCHANGED = "baseline"  # the candidate that is the script as it is (JSON: "baseline")


def _status(tune, run) -> str:
    """The candidate's JSON status, read from its typed verdict."""
    from ..tune import RunStatus

    if run.status is not RunStatus.RUN:
        return run.status.value
    if tune.decision is not None and run.candidate.name == tune.decision.chosen:
        return RunStatus.CHOSEN.value
    verdict = tune.decision.outcomes.get(run.candidate.name) if tune.decision else None
    rejected = verdict is not None and verdict.status.rejected
    return (RunStatus.REJECTED if rejected else RunStatus.RUN).value


def _reason(tune, run) -> str:
    """Why: the run's failure, or its verdict (its status already says chosen or rejected)."""
    from ..tune import CandidateStatus

    if run.candidate.name == UNCHANGED:
        return "the script as it is"
    verdict = tune.decision.outcomes.get(run.candidate.name) if tune.decision else None
    if run.reason or verdict is None:
        return run.reason
    if verdict.status in (CandidateStatus.CHOSEN, CandidateStatus.REJECTED,
                          CandidateStatus.DIFFERS):
        return verdict.reason
    return verdict.text


def chosen_settings(tune) -> dict:
    name = tune.decision.chosen if tune.decision else UNCHANGED
    run = next(r for r in tune.runs if r.candidate.name == name)
    settings = run.candidate.settings
    return {k: v for k, v in settings.items() if knobs.active(k, settings)}


def versions() -> dict:
    import importlib.metadata as md

    out = {}
    for dist in ("torch", "torchrec", "fbgemm-gpu", "fbgemm-gpu-cpu", "gpusync"):
        try:
            out[dist] = md.version(dist)
        except md.PackageNotFoundError:
            continue
    return out


def script_document(tune) -> dict:
    """The gpusync-tune JSON document of a ScriptTune."""
    from ..schemas import document as schema_document

    measured = {m.name: m for m in tune.result.variants} if tune.result else {}
    settings = chosen_settings(tune)
    unchanged = {k: v for k, v in tune.runs[0].candidate.settings.items() if k in settings}
    changes = {k: v for k, v in settings.items() if unchanged.get(k) != v}
    candidates = []
    for run in tune.runs:
        m = measured.get(run.candidate.name)
        # a run that raised counted the syncs of its steps up to the failure: no figure
        report = run.report if _status(tune, run) != "failed" else None
        candidates.append({
            "name": run.candidate.name, "settings": run.candidate.settings,
            "status": _status(tune, run), "reason": _reason(tune, run),
            "p50_ms": round(m.p50_ms, 4) if m else None,
            "p90_ms": round(m.p90_ms, 4) if m else None,
            "syncs_per_step": report.syncs_per_step if report is not None else None,
            "syncs_by_phase": report.syncs_by_phase if report is not None else None,
            "parity": run.parity or (m.parity if m else None),
            "peak_alloc_mb": run.peak_alloc_mb,
            "peak_reserved_mb": run.peak_reserved_mb, "output": run.output or None})
    return schema_document("gpusync-tune", {
        "device": tune.device, "target": tune.target, "command": tune.command,
        "baseline": UNCHANGED, "chosen": tune.decision.chosen if tune.decision else UNCHANGED,
        "p50_gain": round(tune.decision.p50_gain, 4) if tune.decision else 0.0,
        "p90_gain": round(tune.decision.p90_gain, 4) if tune.decision else 0.0,
        "baseline_noise": _noise(tune.baseline_noise),
        "settings": settings, "changes": changes, "emit": _emit(tune, changes),
        "candidates": candidates, "builds": tune.builds, "notes": tune.notes,
        "versions": versions(), "date": time.strftime("%Y-%m-%d")})


def _emit(tune, changes: dict) -> dict:
    """The chosen settings' spelling; `why` says why there is no code to paste."""
    emit: dict = knobs.emit(changes, tune.builds)
    emit["why"] = None
    if not emit["python"]:
        if changes:
            emit["why"] = "the chosen settings are environment variables (emit.env)"
        else:
            verdict = tune.decision.outcomes.get(UNCHANGED) if tune.decision else None
            kept = verdict.reason if verdict is not None and verdict.reason else (
                tune.notes[0] if tune.notes else "no candidate was measured")
            if kept.startswith("baseline (") and kept.endswith(")"):
                kept = kept[len("baseline ("):-1]
            emit["why"] = f"nothing chosen, the script's own settings kept: {kept}"
    return emit


def _noise(noise: float | None) -> float | None:
    """The baseline's run-to-run difference; JSON has no infinity (a NaN loss: the notes say)."""
    import math

    return noise if noise is not None and math.isfinite(noise) else None


@renders("tune-script", "table")
def script_table(tune) -> str:
    return _script_text(tune, "table")


@renders("tune-script", "json")
def script_json(tune) -> str:
    return json.dumps(script_document(tune), indent=2) + "\n"


@renders("tune-script", "markdown")
def script_markdown(tune) -> str:
    return _script_text(tune, "markdown")


@renders("tune-script", "html")
def script_html(tune) -> str:
    from .html import render_tune

    samples = {m.name: m.samples_ms for m in tune.result.variants} if tune.result else {}
    return render_tune(script_document(tune), samples)


def candidates_table(tune, candidates: list[dict], fmt: str) -> str:
    """Every candidate, timed or not (a GPU's gain on a CPU runs once, scanned: its times are
    `-`): the technique table's columns, from the JSON document's candidates."""
    rows = []
    base = candidates[0]["p50_ms"]
    for c in candidates:
        timed = c["p50_ms"] is not None
        phases = ", ".join(f"{k} {n:g}" for k, n in (c["syncs_by_phase"] or {}).items()) or "-"
        rows.append([c["name"] + (" (the script as it is)" if c["name"] == UNCHANGED else ""),
                     f"{c['p50_ms']:.3f}" if timed else "-",
                     f"{c['p90_ms']:.3f}" if timed else "-",
                     f"{c['p50_ms'] / base:.3f}" if timed and base else "-",
                     "-" if c["syncs_per_step"] is None else f"{c['syncs_per_step']:g}", phases,
                     c["parity"] or "-"])
    if fmt == "markdown":
        rows = md_rows(rows)
    head = ""
    if tune.result is not None:
        r = tune.result
        head = (f"{r.repeats} samples per timed candidate, each the mean of {r.steps} steps, "
                f"on {r.hardware}\n")
    return head + tabulate(rows, headers=["candidate", "p50 ms", "p90 ms", "vs baseline",
                                          "syncs/step", "syncs by phase", "parity"],
                           tablefmt="github" if fmt == "markdown" else "simple") + "\n"


def _script_text(tune, fmt: str) -> str:
    from ..tune import faster

    data = script_document(tune)
    md = fmt == "markdown"
    out = [f"## gpusync tune of {md_cell(tune.target)}" if md else f"gpusync tune of {tune.target}"]
    out.append(candidates_table(tune, data["candidates"], fmt))
    for c in data["candidates"]:
        line = f"- {c['name']}: {c['status']}" + (f": {c['reason']}" if c["reason"] else "")
        out.append(" ".join(line.splitlines()) if md else line)
    out += [f"note: {note}" for note in tune.notes]
    gain = ""
    if data["chosen"] != UNCHANGED:
        gain = (f" (median {faster(data['p50_gain'])}, P90 {faster(data['p90_gain'])} "
                "than the script as it is)")
    out.append(f"\nchosen: {data['chosen']}{gain}")
    out.append("change: " + (", ".join(f"{k}={knobs.text(v)}" for k, v in
                                       data["changes"].items()) or "nothing (keep the script's "
                             "own settings)"))
    if data["emit"]["python"]:
        out += ["\nin your code:", *_code(_with_gpusync_note(data), md)]
    out += user.export_lines(data["emit"]["env"])
    for saver in sync_savers(tune, data):
        out += [f"\n{saver['name']}: {saver['text']}; in your code:", *_code(saver["python"], md)]
    return "\n".join(out) + "\n"


def _code(python: str, md: bool) -> list[str]:
    fence = md_fence(python)
    return [*([fence + "python"] if md else []), python, *([fence] if md else [])]


@renders("tune-emit", "env")
def emit_env(tune) -> str:
    emit = script_document(tune)["emit"]
    also = ("# the other chosen settings are code: gpusync tune --emit python\n"
            if emit["python"] else "")
    none = ("# no environment variable carries these settings in the installed libraries\n"
            if emit["python"] else
            "# nothing to change: the script's own settings were kept\n")
    return ("".join(f"{line}\n" for line in user.export_lines(emit["env"])) or none) + also


@renders("tune-emit", "python")
def emit_python(tune) -> str:
    """The chosen settings as code that runs without gpusync (but for gpusync's own sync-free
    writeback, which says so); when none was chosen, the candidates that keep the results and
    sync less, commented out."""
    data = script_document(tune)
    emit = data["emit"]
    if emit["python"]:
        return _with_gpusync_note(data) + "\n"
    out = []
    if emit["env"]:
        out.append("# nothing to change in the code: the chosen settings are environment "
                   "variables (gpusync tune --emit env)")
    else:
        out.append("# nothing to change: the script's own settings were kept")
    for saver in sync_savers(tune, data):
        out += [f"\n# not chosen, but {saver['name']}: {saver['text']}:",
                *(f"# {line}" if line and not line.startswith("#") else line
                  for line in saver["python"].splitlines())]
    return "\n".join(out) + "\n"


@renders("tune-emit", "yaml")
def emit_yaml(tune) -> str:
    return (f"# the chosen settings, for `gpusync run <this file> -- python {tune.target} ...` "
            "(gpusync tune --emit python: the same without gpusync, where the libraries have "
            "them)\n" + yaml.safe_dump({"settings": script_document(tune)["settings"]},
                                        sort_keys=False))


NEEDS_GPUSYNC = ("# gpusync.writeback=syncfree is gpusync's own technique: it needs gpusync "
                 "installed\n# (pip install gpusync), or run the unchanged script with "
                 "`gpusync run tuned.yaml -- python ...`")


def _with_gpusync_note(data: dict) -> str:
    """The chosen settings' code, saying which part needs gpusync installed (the rest is the
    libraries' own)."""
    from ..knobs.fbgemm import WRITEBACK

    python = data["emit"]["python"]
    if data["changes"].get(WRITEBACK) == "syncfree":
        return f"{NEEDS_GPUSYNC}\n{python}"
    return python


def sync_savers(tune, data: dict) -> list[dict]:
    """The candidates, not chosen, that keep the script's results (identical, or within the
    rounding a fused optimizer makes) and make fewer syncs per step (what a CPU measures
    exactly), with their code."""
    by = {c["name"]: c for c in data["candidates"]}
    base = by[UNCHANGED]["syncs_per_step"]
    out = []
    for run in tune.runs[1:]:
        c = by[run.candidate.name]
        if (c["name"] == data["chosen"] or not run.parity_kept or base is None
                or c["syncs_per_step"] is None or c["syncs_per_step"] >= base):
            continue
        python = knobs.emit(run.candidate.changed, tune.builds)["python"]
        kept = "identical results" if c["parity"] == "identical" else f"results {c['parity']}"
        if python:
            out.append({"name": c["name"], "python": python, "text": (
                f"{kept} with {c['syncs_per_step']:g} syncs per step instead of {base:g}")})
    return out


def tuned_text(tune) -> str:
    """The file `gpusync tune -o` writes: the document without what the script built."""
    data = script_document(tune)
    data.pop("builds")
    head = ("# written by gpusync tune; run the script with these settings:\n"
            f"#   gpusync run <this file> -- python {tune.target} ...\n")
    return head + yaml.safe_dump(data, sort_keys=False)
