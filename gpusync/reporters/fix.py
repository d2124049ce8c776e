"""`gpusync fix`: the patch (a unified diff, the default) or its JSON (hunks, the sites each
patch removes, what was verified; the patches dropped and the sites refused, with reasons)."""
from __future__ import annotations

import json
from typing import Any

from .. import schemas
from ..fix import diff
from ..fix.result import Check, FixResult
from ..report import Site
from .registry import renders


def _site(site: Site) -> dict[str, Any]:
    return {"op": site.op, "file": diff.relative(site.file), "line": site.line,
            "per_step": site.per_step, "library": site.library_line or None}


def _where(site: Site) -> str:
    """file:line, and the library line beneath it (one line of yours may lead to several)."""
    under = f" (in {site.library_line})" if site.library_line else ""
    return f"{site.relative_where}{under}"


def _check(check: Check | None) -> dict[str, Any] | None:
    if check is None:
        return None
    return {"syncs_per_step": check.syncs_per_step, "removed": check.removed,
            "moved": check.moved, "parity": check.parity, "failure": check.failure}


def _not_offered(result: FixResult) -> list[str]:
    lines = [f"# dropped: {d.proposal.remedy} at {_where(d.proposal.site)}: {d.reason}"
             for d in result.dropped]
    lines += [f"# not offered: {r.remedy} at {_where(r.site)}: {r.reason}"
              for r in result.refused]
    lines += [f"# no mechanical remedy: {s.op} at {_where(s)} ({s.per_step:g}/step)"
              for s in result.unremedied]
    lines += [f"# note: {n}" for n in result.notes]
    return lines


@renders("fix", "diff")
def fix_diff(result: FixResult) -> str:
    """The patch; what was dropped or refused as comment lines after it (patch tools skip
    them)."""
    text = diff.render(result)
    more = _not_offered(result)
    return text + ("\n".join(more) + "\n" if more else "")


@renders("fix", "json")
def fix_json(result: FixResult) -> str:
    hunks = [{"file": h.file, "header": h.header, "text": "".join(h.lines),
              "removes": [_site(v.proposal.site) for v in h.patches],
              "remedies": sorted({v.proposal.remedy for v in h.patches})}
             for h in diff.hunks(result)]
    body = {
        "target": result.target, "mode": result.mode, "seed": result.seed,
        "steps": result.steps, "syncs_per_step": {"before": result.syncs_before,
                                                  "after": result.syncs_after},
        "patches": [{"remedy": v.proposal.remedy, "summary": v.proposal.summary,
                     "sites": [_site(s) for s in (v.proposal.site, *v.proposal.also)],
                     "files": sorted({diff.relative(e.path) for e in v.proposal.edits}),
                     "verification": _check(v.check)} for v in result.patches],
        "combined": _check(result.combined),
        "dropped": [{"remedy": d.proposal.remedy, "summary": d.proposal.summary,
                     "site": _site(d.proposal.site), "reason": d.reason}
                    for d in result.dropped],
        "refused": [{"remedy": r.remedy, "site": _site(r.site), "reason": r.reason}
                    for r in result.refused],
        "unremedied": [_site(s) for s in result.unremedied],
        "hunks": hunks, "diff": diff.render(result) if result.patches else "",
        "applied": result.applied, "notes": result.notes,
    }
    return json.dumps(schemas.document("gpusync-fix", body), indent=2) + "\n"
