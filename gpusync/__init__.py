"""gpusync: find the host<-device synchronizations in a PyTorch training step, and remove them."""
from ._version import __version__
from .api import assert_no_syncs, watch
from .errors import GpusyncError, SyncsFound
from .report import Report, Site
from .workload import Workload

__all__ = ["__version__", "watch", "assert_no_syncs", "Workload", "Report", "Site",
           "GpusyncError", "SyncsFound"]
