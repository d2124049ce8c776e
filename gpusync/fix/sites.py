"""Which of the original's sync sites a patched copy still has: lines mapped through the edit
(difflib's matching of the two texts), and the sites at lines the edit wrote told apart from
new ones."""
from __future__ import annotations

import dataclasses
import difflib
from dataclasses import dataclass

from ..report import Site, SiteKey


@dataclass
class LineMap:
    """Original line -> patched line of one file, and the patched lines the edit wrote."""

    old_to_new: dict[int, int]
    written: set[int]

    @classmethod
    def of(cls, before: str, after: str) -> LineMap:
        old, new = before.splitlines(), after.splitlines()
        matcher = difflib.SequenceMatcher(None, old, new, autojunk=False)
        mapping: dict[int, int] = {}
        written: set[int] = set()
        for tag, i1, i2, j1, j2 in matcher.get_opcodes():
            for k in range(i2 - i1):
                # equal: line for line; replaced or deleted lines: where their text went
                mapping[i1 + k + 1] = j1 + (k if tag == "equal" else min(k, max(j2 - j1 - 1,
                                                                                 0))) + 1
            if tag in ("replace", "insert"):
                written.update(range(j1 + 1, j2 + 1))
            if tag == "delete":  # deleted, or moved: its site is then at a line the edit wrote
                mapping.update(dict.fromkeys(range(i1 + 1, i2 + 1), 0))
        return cls(mapping, written)


def per_step(sites: list[Site]) -> list[Site]:
    return [s for s in sites if s.per_step > 0 and not s.setup]


def label(site: Site, per_step: float | None = None) -> str:
    value = site.per_step if per_step is None else per_step
    return f"{site.op} at {site.relative_where} ({value:g}/step)"


def key(site: Site, maps: dict[str, LineMap] | None = None) -> SiteKey:
    """A site's place (SiteKey.place: its op, its line and the library line that synced under
    it, one user line leading to several), its line mapped into the patched text when `maps`
    has its file."""
    lines = (maps or {}).get(site.file)
    place = site.key.place
    return dataclasses.replace(place, line=lines.old_to_new.get(site.line, -1)) if lines \
        else place


def at_places(sites: list[Site], maps: dict[str, LineMap] | None = None) -> dict[SiteKey, float]:
    """Syncs per step at each place (key): the sites one place has in several phases (a
    framework's read after every batch and at each validation's end) add up."""
    totals: dict[SiteKey, float] = {}
    for s in per_step(sites):
        place = key(s, maps)
        totals[place] = totals.get(place, 0.0) + s.per_step
    return totals


def gone(targets: list[Site], after: list[Site], maps: dict[str, LineMap],
         fewer: frozenset[Site] = frozenset()) -> tuple[str | None, list[str]]:
    """(why a target is still there, or None; the targets removed). A target in `fewer` may
    stay at fewer syncs per step (a framework's lever: remedies/framework_args.py), all the
    targets at its place together."""
    now = at_places(after)
    was = at_places(targets, maps)
    removed: list[str] = []
    for target in targets:
        place = key(target, maps)
        left = now.get(place)
        if left is not None and (target not in fewer or left >= was[place]):
            return f"{label(target)} is still there ({left:g}/step at its line)", []
        removed.append(label(target) if left is None else
                       f"{label(target)} down to {left:g}/step at its line")
    return None, removed


def compare(targets: list[Site], before: list[Site], after: list[Site],
            maps: dict[str, LineMap], fewer: frozenset[Site] = frozenset()
            ) -> tuple[str | None, list[str], list[str]]:
    """(why the patch fails, the targets removed, the sites moved). A target must be gone from
    its mapped line (or, in `fewer`, sync less often there); a site of the patched copy at a
    line the edit wrote is the target moved (kept only if it now syncs less often per step);
    any other site the original did not have at that line, or has more often now, is new: the
    patch fails."""
    why, removed = gone(targets, after, maps, fewer)
    if why is not None:
        return why, [], []
    now = at_places(after)
    old = at_places(before, maps)
    sites = {key(s): s for s in per_step(after)}
    budget = sum(t.per_step for t in targets)
    moved: list[str] = []
    for identity, total in now.items():
        was, site = old.get(identity), sites[identity]
        if was is not None and total <= was:
            continue
        if site.file in maps and site.line in maps[site.file].written:
            moved.append(label(site, total))
            budget -= total
            continue
        return f"a new sync: {label(site, total)}" if was is None else \
            f"{label(site, total)} syncs more often than before ({was:g}/step)", [], []
    if budget <= 0:
        return "the syncs it moves happen as often as those it removes", [], []
    return None, removed, moved
