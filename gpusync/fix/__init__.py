"""`gpusync fix`: a verified patch for every sync that has a mechanical remedy. engine.py
proposes (the remedies, gpusync/remedies/) and verifies (runner.py: the patched copy scanned
and run with the original's seeds; sites.py and compare.py judge it); diff.py writes the patch,
write.py applies it."""
from .engine import fix_script
from .result import FixResult
from .runner import FixPlan

__all__ = ["FixResult", "FixPlan", "fix_script"]
