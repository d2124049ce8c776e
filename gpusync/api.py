"""The Python API: watch() and assert_no_syncs()."""
from __future__ import annotations

import contextlib

from .detect.session import Session
from .errors import SyncsFound
from .report import Report, report_of


class Watch(Session):
    """A session as the API hands it out: `w.report()` is its report so far."""

    def report(self) -> Report:
        return report_of(self)


def watch(model=None, mode: str = "auto", warmup: int = 0) -> Watch:
    """`with gpusync.watch() as w: ...train steps...` then `w.report()`.

    A step is a round of optimizer steps with what follows it (the logging after
    `optimizer.step()`, and after the last one, whatever runs until the block ends); see
    docs/commands/scan.md#steps. Tensors that exist before the block are taken to be on the
    device, except optimizer step counters; pass `model` for module paths rooted at it.
    Blocks may overlap, end in any order, or run in several threads (each counts its own
    thread's steps); nested on one thread, the outermost judges each call for all. A block is
    entered once.
    """
    return Watch(model=model, mode=mode, warmup=warmup, target="watch")


def format_sites(report, limit: int = 20) -> str:
    lines = []
    for s in report.sites[:limit]:
        where = f"{s.where} ({s.function})" if s.function else s.where
        phase = f"{s.phase}:{s.hook}" if s.hook else s.phase
        mod = f" in {s.module}" if s.module else ""
        lines.append(f"  {s.op} x{s.count} [{phase}{mod}] at {where}\n      fix: {s.advice}")
    if len(report.sites) > limit:
        lines.append(f"  ... and {len(report.sites) - limit} more sites")
    return "\n".join(lines)


@contextlib.contextmanager
def assert_no_syncs(model=None, mode: str = "auto", allow: int = 0):
    """Raise SyncsFound (an AssertionError listing every site) if the block syncs more than
    `allow` times."""
    with watch(model=model, mode=mode) as w:
        yield w
    report = w.report()
    total = sum(s.count for s in report.sites)
    if total > allow:
        raise SyncsFound(f"{total} host<-device sync(s) where at most {allow} allowed:\n"
                         + format_sites(report), report)
