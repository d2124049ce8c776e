"""gpusync: find the host<-device synchronizations in a PyTorch training step, and remove them.

The names that need torch (`watch`, `assert_no_syncs`, `Workload`) are imported on first use:
the `gpusync` command's own process then never imports torch (the scan runs in a child that
does), which was about a second of CPU per command (docs/benchmarks/cost-model-overhead.md).
"""
from typing import TYPE_CHECKING, Any

from ._version import __version__
from .errors import GpusyncError, SyncsFound
from .report import Report, Site

if TYPE_CHECKING:
    from .api import assert_no_syncs, watch
    from .workload import Workload

_LAZY = {"watch": "api", "assert_no_syncs": "api", "Workload": "workload"}

__all__ = ["__version__", "watch", "assert_no_syncs", "Workload", "Report", "Site",
           "GpusyncError", "SyncsFound"]


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'gpusync' has no attribute {name!r}")
    from importlib import import_module

    value = getattr(import_module(f".{module}", __name__), name)
    globals()[name] = value  # the next lookup is a plain attribute
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_LAZY))
