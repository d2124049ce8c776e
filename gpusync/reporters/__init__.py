"""Renderers: each is `render(report) -> str`."""
from . import html as html_reporter
from . import json as json_reporter
from . import markdown, table
from .common import library_view

RENDERERS = {"table": table.render, "json": json_reporter.render, "markdown": markdown.render,
             "html": html_reporter.render_scan}
FORMATS = tuple(RENDERERS)
VIEWS = ("user", "library")


def render(report, fmt: str, show: str = "user") -> str:
    """show="library" places sites at the library line that synced (tables only: JSON always
    carries both, the user's line in file/line and the library's in `library`)."""
    if show == "library" and fmt != "json":
        report = library_view(report)
    return RENDERERS[fmt](report)
