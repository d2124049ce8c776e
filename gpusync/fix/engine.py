"""`gpusync fix`: scan the script with the remedies' observers, ask each remedy for the edit of
each site, and keep only the edits a run proves: the patched copy, scanned, no longer has the
site and has no new one, and, run with the same seeds, computes what the original computes."""
from __future__ import annotations

import dataclasses

from .. import remedies as remedies_pkg
from ..errors import GpusyncError
from ..progress import Progress
from ..remedies import Proposal, Refusal
from ..remedies.helpers.source import EditError, Source, apply, check
from . import compare, sites
from .result import Check, Dropped, FixResult, Verified
from .runner import FixPlan, FixRun, Runner

OVERLAP = "with the other patches: "


class _Original:
    """The original's run, and (only when a difference needs it) a second run of it: whether
    its results repeat under the same seeds."""

    def __init__(self, runner: Runner):
        self.runner = runner
        self.run = runner.original()
        self._again: FixRun | None = None
        self._ran_again = False

    def again(self) -> FixRun | None:
        if not self._ran_again:
            self._ran_again = True
            self._again, _ = self.runner.run({})
        return self._again


def fix_script(plan: FixPlan, only: tuple[str, ...] = (), progress: Progress | None = None
               ) -> FixResult:
    progress = progress or Progress("gpusync fix")
    runner = Runner(plan)
    progress.stage("scanning the script as it is")
    original = _Original(runner)
    result = FixResult(plan.target, "", plan.mode, plan.seed, plan.steps,
                       original.run.syncs_per_step)
    files: dict[str, Source] = {}
    _round(_propose(original.run, files, only, result), result, original, files, plan,
           progress)
    overlapped = [d for d in result.dropped if d.reason.startswith(OVERLAP + "edits overlap")]
    if overlapped and result.texts:
        _second_round(result, overlapped, files, plan, only, progress)
    removed = {s for v in result.patches for s in (v.proposal.site, *v.proposal.also)}
    # a remedy that refuses a site another one removed (an `item` of a one_hot, not a
    # logging read) has nothing to tell the user
    result.refused = [r for r in result.refused if r.site not in removed]
    if any(d.reason.startswith(OVERLAP + "edits overlap") for d in result.dropped):
        result.notes.append("a patch dropped for editing what a kept one edits may pass on its "
                            "own: apply this patch and run gpusync fix again")

    progress.close()
    return result


def _round(candidates: list[list[Proposal]], result: FixResult, original: _Original,
           files: dict[str, Source], plan: FixPlan, progress: Progress) -> None:
    """Verify each site's proposals (in the remedies' order: the first proved is kept), then
    the kept ones together."""
    for k, group in enumerate(candidates, 1):
        for proposal in group:
            progress.stage(f"verifying {k}/{len(candidates)}: {proposal.remedy} at "
                           f"{proposal.site.relative_where}")
            outcome = _verify([proposal], original, original.runner, files, plan)
            if outcome.failure is None:
                result.patches.append(Verified(proposal, outcome))
                break
            result.dropped.append(Dropped(proposal, outcome.failure))
    _combine(result, original, original.runner, files, plan, progress)


def _second_round(result: FixResult, overlapped: list[Dropped], files: dict[str, Source],
                  plan: FixPlan, only: tuple[str, ...], progress: Progress) -> None:
    """The proposals dropped for editing what a kept patch edits, proposed again on the
    patched text (one remedy's edit made, the other's is one more), verified against it."""
    first = {path: after for path, (_, after) in result.texts.items()}
    progress.stage("second round: the patches that overlapped kept ones, on the patched text")
    try:
        patched = _Original(Runner(plan, base=first, name="second"))
    except GpusyncError:
        return  # the first round's combined check passed: not expected; keep what it proved
    ahead = {path: sites.LineMap.of(files[path].text, text) for path, text in first.items()}
    wanted = {sites.key(d.proposal.site, ahead): d for d in overlapped}
    files2 = {path: Source(path, text, files[path].encoding) for path, text in first.items()}
    second = FixResult(plan.target, "", plan.mode, plan.seed, plan.steps,
                       patched.run.syncs_per_step)
    _round(_propose(patched.run, files2, only, second, keep=lambda s: sites.key(s) in wanted),
           second, patched, files2, plan, progress)
    if not second.patches or second.syncs_after is None:
        return
    back = {path: sites.LineMap.of(text, files[path].text).old_to_new
            for path, text in first.items()}
    fixed = {id(wanted[sites.key(v.proposal.site)]) for v in second.patches}
    result.dropped = [d for d in result.dropped if id(d) not in fixed]
    result.patches += [dataclasses.replace(v, lines=back) for v in second.patches]
    result.texts.update({path: (files[path].text, after)
                         for path, (_, after) in second.texts.items()})
    result.combined, result.syncs_after = second.combined, second.syncs_after


def _propose(original: FixRun, files: dict[str, Source], only: tuple[str, ...],
             result: FixResult, keep=lambda site: True) -> list[list[Proposal]]:
    """Per site that syncs every step, the proposals of the remedies that know it, in the
    remedies' order. A proposal whose edits another site's proposal made already (two copies of
    one DataLoader's batch) counts once: that site is added to the first one's `also`."""
    chosen = [r for r in remedies_pkg.REMEDIES if not only or set(names(r)) & set(only)]
    groups: list[list[Proposal]] = []
    where: dict[tuple, tuple[int, int]] = {}  # (remedy, edits) -> (group, position)
    for site in filter(keep, sites.per_step(original.sites)):
        source = _source(site.file, files)
        fresh: list[Proposal] = []
        answered = False
        for remedy in chosen if source is not None else []:
            answer = remedy.propose(site, source, original.facts)  # type: ignore[arg-type]
            if only and answer is not None and answer.remedy not in only:
                continue
            answered = answered or answer is not None
            if isinstance(answer, Refusal):
                result.refused.append(answer)
            elif answer is not None and (answer.remedy, answer.edits) in where:
                g, k = where[(answer.remedy, answer.edits)]
                first = groups[g][k]
                if site != first.site and site not in first.also:
                    groups[g][k] = dataclasses.replace(first, also=(*first.also, site))
            elif answer is not None:
                where[(answer.remedy, answer.edits)] = (len(groups), len(fresh))
                fresh.append(answer)
        if fresh:
            groups.append(fresh)
        if not answered and not only:  # with --only, the others' sites are not judged
            result.unremedied.append(site)
    return groups


def names(remedy) -> tuple[str, ...]:
    """What a remedy's proposals may be named (tensor_list proposes tensor.hoist and
    tensor.pinned)."""
    return tuple(getattr(remedy, "NAMES", (remedy.NAME,)))


def _source(path: str, files: dict[str, Source]) -> Source | None:
    """The user's file, parsed once; None for what is not a Python file of theirs on disk."""
    if path not in files:
        try:
            files[path] = Source.read(path)
        except (OSError, SyntaxError, UnicodeDecodeError, ValueError):
            return None
    return files[path]


def patched(proposals: list[Proposal], files: dict[str, Source]) -> dict[str, str]:
    """{path: patched text} of every file the proposals edit (EditError: they conflict)."""
    edits: dict[str, list] = {}
    for p in proposals:
        for e in p.edits:
            edits.setdefault(e.path, []).append(e)
    out = {}
    for path, file_edits in edits.items():
        out[path] = apply(files[path].text, file_edits)
        check(path, out[path])
    return out


def _verify(proposals: list[Proposal], original: _Original, runner: Runner,
            files: dict[str, Source], plan: FixPlan) -> Check:
    try:
        texts = patched(proposals, files)
    except EditError as e:
        return Check(failure=str(e))
    run, failure = runner.run(texts)
    if run is None:
        return Check(failure=f"the patched script {failure}")
    maps = {path: sites.LineMap.of(files[path].text, text) for path, text in texts.items()}
    targets = [s for p in proposals if not p.keeps_syncs for s in (p.site, *p.also)]
    if any(p.keeps_syncs for p in proposals):
        why, removed = sites.gone(targets, run.sites, maps)
        moved: list[str] = []
        before = original.run.syncs_per_step
        if why is None and run.syncs_per_step > before + 1e-9:
            why = f"syncs per step rise from {before:g} to {run.syncs_per_step:g}"
    else:
        fewer = frozenset(s for p in proposals if p.fewer for s in (p.site, *p.also))
        why, removed, moved = sites.compare(targets, original.run.sites, run.sites, maps,
                                            fewer)
    if why is not None:
        return Check(run.syncs_per_step, failure=why)
    tolerance = compare.Tolerance(plan.rtol, plan.atol, any(p.rounds for p in proposals))
    changes = [p.printed_changes for p in proposals if p.printed_changes]
    if changes:
        why, compared = compare.parity(original.run.record, run.record, tolerance,
                                       output=False)
        compared.append("printed output not compared: " + "; ".join(changes))
        return Check(run.syncs_per_step, removed, moved, compared,
                     None if why is None else compare.differs(why, tolerance,
                                                                  original.run.record))
    output = any(p.output_matters for p in proposals)
    why, compared = _parity(original, run, tolerance, output)
    return Check(run.syncs_per_step, removed, moved, compared, why)


def _parity(original: _Original, run: FixRun, tolerance: compare.Tolerance, output: bool
            ) -> tuple[str | None, list[str]]:
    """Losses and final parameters (and what it printed) as the original's: the check tune
    makes too (runs/agree.py)."""
    def again():
        second = original.again()
        return None if second is None else second.record

    return compare.judge(original.run.record, run.record, again, tolerance, output)


def _combine(result: FixResult, original: _Original, runner: Runner,
             files: dict[str, Source], plan: FixPlan, progress: Progress) -> None:
    """Every verified patch at once, verified again; when together they fail, they are added
    one by one, each kept only if the whole still passes."""
    kept = result.patches
    if len(kept) > 1:
        progress.stage(f"verifying the {len(kept)} patches together")
        together = _verify([v.proposal for v in kept], original, runner, files, plan)
        if together.failure is not None:
            kept = _one_by_one(result, original, runner, files, plan, progress)
            together = _verify([v.proposal for v in kept], original, runner, files, plan) \
                if kept else together
        result.combined = together
    elif kept:
        result.combined = kept[0].check
    result.patches = kept
    if result.combined is not None and result.combined.failure is None:
        result.syncs_after = result.combined.syncs_per_step
    texts = patched([v.proposal for v in kept], files) if kept else {}
    result.texts = {path: (files[path].text, text) for path, text in texts.items()}


def _one_by_one(result: FixResult, original: _Original, runner: Runner,
                files: dict[str, Source], plan: FixPlan, progress: Progress) -> list[Verified]:
    kept: list[Verified] = []
    for v in result.patches:
        progress.stage(f"verifying {v.proposal.remedy} at {v.proposal.site.relative_where} "
                       "with the patches kept so far")
        outcome = _verify([*(k.proposal for k in kept), v.proposal], original, runner, files,
                          plan)
        if outcome.failure is None:
            kept.append(v)
        else:
            result.dropped.append(Dropped(v.proposal, f"{OVERLAP}{outcome.failure}"))
    return kept
