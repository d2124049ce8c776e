"""The output layer: every command's result is rendered here, by (kind, format) (registry.py).
Importing the package registers every renderer; a command's --format choices are
`formats(kind)`: scan, gate, bench, overhead, tune (a profile's), tune-script, tune-emit."""
from . import bench, fix, gate, scan, script_tune, tune
from .registry import formats, render_as, renderer
from .scan import VIEWS, render

__all__ = ["bench", "fix", "gate", "scan", "script_tune", "tune", "formats", "render_as",
           "renderer", "render", "VIEWS"]
