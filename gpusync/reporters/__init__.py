"""Renderers: each is `render(report) -> str`."""
from . import json as json_reporter
from . import markdown, table

RENDERERS = {"table": table.render, "json": json_reporter.render, "markdown": markdown.render}
FORMATS = tuple(RENDERERS)


def render(report, fmt: str) -> str:
    return RENDERERS[fmt](report)
