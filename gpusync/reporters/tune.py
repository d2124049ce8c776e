"""`gpusync tune PROFILE`: a profile's candidates as measured, the verdict on each, and the
tuned profile `-o` writes."""
from __future__ import annotations

import datetime as _dt
import json

import yaml

from .bench import technique_table
from .registry import renders


def profile_document(tuned) -> dict:
    """The gpusync-tune-profile JSON document of a ProfileTune."""
    from ..schemas import document as schema_document
    from ..tune import tuned_args

    profile, result, decision = tuned
    return schema_document("gpusync-tune-profile", {
        "result": result.to_dict(), "chosen": decision.chosen,
        "args": tuned_args(profile, decision), "p50_gain": decision.p50_gain,
        "p90_gain": decision.p90_gain, "parity_allowance": decision.allowance,
        "verdicts": decision.verdicts})


@renders("tune", "table")
def profile_table(tuned) -> str:
    return _profile_text(tuned, "table")


@renders("tune", "json")
def profile_json(tuned) -> str:
    return json.dumps(profile_document(tuned), indent=2) + "\n"


@renders("tune", "markdown")
def profile_markdown(tuned) -> str:
    return _profile_text(tuned, "markdown")


@renders("tune", "html")
def profile_html(tuned) -> str:
    from .html import render_tune

    data = profile_document(tuned)
    data["candidates"] = profile_candidates(tuned)
    return render_tune(data)


def profile_candidates(tuned) -> list[dict]:
    """The profile's candidates in the script form's spelling (status, reason), raw samples
    kept: each status read from the decision's typed verdict."""
    from ..tune import RunStatus

    _, result, decision = tuned
    out = []
    for v in result.to_dict()["variants"]:
        verdict = decision.outcomes.get(v["name"])
        status = (RunStatus.CHOSEN if v["name"] == decision.chosen
                  else RunStatus.REJECTED if verdict is not None and verdict.status.rejected
                  else RunStatus.RUN)
        out.append({**v, "status": status.value, "reason": verdict.text if verdict else ""})
    return out + [{"name": n, "status": RunStatus.NOT_RUN.value, "reason": why, "p50_ms": None}
                  for n, why in result.skipped.items()]


def _profile_text(tuned, fmt: str) -> str:
    from ..tune import faster, tuned_args

    profile, result, decision = tuned
    lines = [f"- {name}: {verdict}" for name, verdict in decision.verdicts.items()]
    args = ", ".join(f"{k}={v}" for k, v in tuned_args(profile, decision).items())
    summary = f"tuned: {decision.chosen}\nargs: {args}\n"
    if decision.chosen != result.reference:
        summary = (f"tuned: {decision.chosen}: median {faster(decision.p50_gain)} than the "
                   f"baseline, P90 {faster(decision.p90_gain)} than the baseline "
                   f"({result.reference})\nargs: {args}\n")
    sep = "\n" if fmt == "markdown" else ""
    return technique_table(result, fmt) + "\n" + sep + "\n".join(lines) + "\n\n" + summary


def tuned_profile_text(tuned) -> str:
    """A profile (scan, gate and tune take it) with the chosen args and what was measured."""
    from ..tune import tuned_args

    profile, result, decision = tuned
    by = {m.name: m for m in result.variants}
    ref, chosen = by[result.reference], by[decision.chosen]
    data = {"name": f"{profile.name}-tuned",
            "description": f"{profile.name} with tuned settings ({decision.chosen})",
            "workload": profile.workload, "args": tuned_args(profile, decision),
            "steps": profile.steps, "warmup": profile.warmup}
    if profile.requires:
        data["requires"] = list(profile.requires)
    data["tune"] = profile.tune
    data["tuned"] = {
        "candidate": decision.chosen, "baseline": result.reference, "device": result.hardware,
        "date": result.date, "torch": str(result.torch_version),
        "p50_ms": {ref.name: round(ref.p50_ms, 4), chosen.name: round(chosen.p50_ms, 4)},
        "p90_ms": {ref.name: round(ref.p90_ms, 4), chosen.name: round(chosen.p90_ms, 4)},
        "p50_gain": round(decision.p50_gain, 4), "p90_gain": round(decision.p90_gain, 4),
        "samples": result.repeats, "steps_per_sample": result.steps,
        "parity_allowance": decision.allowance, "verdicts": decision.verdicts,
        "not_run": dict(result.skipped)}
    head = (f"# written by gpusync tune on {_dt.date.today().isoformat()} from {profile.path}\n"
            f"# use it like any profile: gpusync scan <this file>\n")
    return head + yaml.safe_dump(data, sort_keys=False)
