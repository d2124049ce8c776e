"""What a remedy is: for one kind of sync site, the source edit that removes it, proposed from
the site (where the scan saw it), the user's source and the facts the run observed there.
`gpusync fix` (gpusync/fix/) then verifies each proposal by running it, or drops it."""
from __future__ import annotations

import contextlib
from dataclasses import dataclass, field

from ..report import Site
from .helpers.observe import Facts
from .helpers.source import Edit, Source
from .helpers.syntax import keyword


@dataclass(frozen=True)
class Proposal:
    """Edits that remove the sync at `site`. `summary`: one line for the diff's header
    ("one_hot(y) -> one_hot(y, num_classes=NUM_CLASSES): 10, the module constant").
    `output_matters`: the run's printed output must stay identical (a remedy that moves a
    print's value), not only its losses and parameters."""

    remedy: str
    site: Site
    edits: tuple[Edit, ...]
    summary: str
    output_matters: bool = False
    also: tuple[Site, ...] = field(default=())  # other sites the same edits remove
    # a setting `gpusync tune` chose for its speed (a train pipeline that overlaps its syncs
    # with compute): its sites may stay or move; verified by parity and by the syncs per step
    # not rising, not by a site gone
    keeps_syncs: bool = False
    # a framework's lever that makes its loop read less often, not never (Lightning's
    # progress bar still reads what validation logs at the epoch's end): verified by the
    # site's syncs per step falling, with none new or more frequent elsewhere
    fewer: bool = False
    # what the edit changes in what the script prints, by design (the values a progress bar
    # that writes to stdout no longer shows): its printed output is then not compared, and
    # the verification says why; losses and parameters still are
    printed_changes: str = ""
    # it rounds differently by design (a fused optimizer): parity within the dtype's rounding
    # (runs/agree.py), as tune judges the same change
    rounds: bool = False


def library(site: Site) -> tuple[str, str]:
    """(file, function) of the library line that synced under the user's, ("", "") if none."""
    lib = site.library
    return (lib.file.replace("\\", "/"), lib.function) if lib is not None else ("", "")


@dataclass(frozen=True)
class Refusal:
    """Why `remedy` offers nothing for `site` (listed in the report, never silent)."""

    remedy: str
    site: Site
    reason: str


class Remedy:
    """One kind of fix. Every remedy is an instance of a subclass of this, listed in its
    module's REMEDIES (in the order their proposals are tried); remedies/__init__.py lists
    the modules, and a test checks that each module of remedies/ is among them."""

    NAME: str = ""  # "one_hot.num_classes": in the diff's header, the JSON, --only/--skip
    # NAMES, where a remedy's proposals carry other names than NAME (tensor_list's two):
    # all of them (fix/engine.py names)

    def observe(self, facts: Facts) -> contextlib.AbstractContextManager:
        """Layers (detect/patches.py add_layer) that note in `facts`, while the script runs,
        what this remedy needs to know at the user's lines (facts.note); removed on exit.
        Observing must not change what the code computes, nor sync. By default none: the
        site and the source say all the remedy needs."""
        return contextlib.nullcontext(facts)

    def propose(self, site: Site, source: Source, facts: Facts) -> Proposal | Refusal | None:
        """The edit for `site` in `source` (the file the site is in), a Refusal saying why
        none is safe, or None when the site is not this remedy's kind."""
        raise NotImplementedError


def already_given(name: str, site: Site, source: Source, call, field: str,
                  why: str = "the script asks for it") -> Refusal | None:
    """The script's call passes `field` itself (`why` it is left as it is), or may, through
    **kwargs: its choice."""
    given = keyword(call, field)
    if given is not None:
        return Refusal(name, site, f"{field}={source.segment(given.value)} is given at line "
                       f"{call.lineno}: {why}")
    if any(k.arg is None for k in call.keywords):
        return Refusal(name, site, f"{source.segment(call.func)}(..., **...) at line "
                       f"{call.lineno} may pass {field} already")
    return None
