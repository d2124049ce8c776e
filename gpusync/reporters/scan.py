"""A scan report's formats, registered in the order --help lists them (each renderer lives in
the module of its format: table.py, json.py, markdown.py, html.py)."""
from . import html, markdown, table
from . import json as json_format
from .common import library_view
from .registry import renderer, renders

renders("scan", "table")(table.scan_table)
renders("scan", "json")(json_format.scan_json)
renders("scan", "markdown")(markdown.scan_markdown)
renders("scan", "html")(html.render_scan)

VIEWS = ("user", "library")


def render(report, fmt: str, show: str = "user") -> str:
    """show="library" places sites at the library line that synced (tables only: JSON always
    carries both, the user's line in file/line and the library's in `library`)."""
    if show == "library" and fmt != "json":
        report = library_view(report)
    return renderer("scan", fmt)(report)
