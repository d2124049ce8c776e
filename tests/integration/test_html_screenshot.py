"""The HTML reports in a real browser: a headless Chromium / Chrome renders a scan page and a
tune page from file:// (no network) to a PNG (a subprocess: the browser). Skipped where no
such browser is installed.
With GPUSYNC_SCREENSHOTS=DIR the PNGs are kept there: README's images come from this test
(`GPUSYNC_SCREENSHOTS=docs/img pytest tests/integration/test_html_screenshot.py`)."""
import os
import shutil
import subprocess
import textwrap

import pytest

from gpusync.reporters.html import render_scan, render_tune
from gpusync.scan import run_scan
from tests.unit.test_html_report import SCRIPT, TUNE

BROWSERS = ("chromium", "chromium-browser", "google-chrome")


def browser():
    found = next((b for b in map(shutil.which, BROWSERS) if b), None)
    if found is None:
        pytest.skip(f"no headless browser ({', '.join(BROWSERS)})")
    return found


def screenshot(exe, html_path, png_path, profile_dir):
    # its own profile directory: a shared one is locked by any browser already running
    proc = subprocess.run([exe, "--headless", "--no-sandbox", "--disable-gpu",
                           "--hide-scrollbars", f"--user-data-dir={profile_dir}",
                           f"--screenshot={png_path}", "--window-size=1200,1400",
                           f"file://{html_path}"], capture_output=True, text=True, timeout=120)
    assert png_path.exists(), proc.stderr[-2000:]
    data = png_path.read_bytes()
    assert data.startswith(b"\x89PNG\r\n\x1a\n")
    # a blank 1200x1400 page compresses to a few KB; text, tables and plots do not
    assert len(data) > 20_000, len(data)


def test_scan_and_tune_pages_render_in_a_headless_browser(tmp_path):
    exe = browser()
    script = tmp_path / "train.py"
    script.write_text(textwrap.dedent(SCRIPT))
    result = run_scan(str(script), mode="simulate")
    assert result.error is None, result.traceback
    pages = {"scan": render_scan(result.report), "tune": render_tune(TUNE)}
    for name, page in pages.items():
        html_path = tmp_path / f"{name}.html"
        html_path.write_text(page, encoding="utf-8")
        png = tmp_path / f"{name}.png"
        screenshot(exe, html_path, png, tmp_path / f"profile-{name}")
        keep = os.environ.get("GPUSYNC_SCREENSHOTS")
        if keep:
            shutil.copyfile(png, os.path.join(keep, f"{name}-report.png"))
