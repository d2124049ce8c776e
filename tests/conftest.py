import pathlib
import re
import subprocess
import sys

import pytest
import torch

CORPUS = pathlib.Path(__file__).parent / "corpus"
_EXPECT = re.compile(r"#\s*expect:\s*(.+)$")


def expected_sites(path: pathlib.Path) -> set[tuple[int, str, str]]:
    """{(line, op, phase)} from `# expect: op@phase, op@phase` comments."""
    out = set()
    for lineno, text in enumerate(path.read_text().splitlines(), 1):
        m = _EXPECT.search(text)
        if m:
            for item in m.group(1).split(","):
                op, _, phase = item.strip().rpartition("@")
                out.add((lineno, op, phase))
    return out


def run_cli(*args, cwd=None):
    """`python -m gpusync ARGS` in a subprocess, as a user runs it."""
    return subprocess.run([sys.executable, "-m", "gpusync", *args], capture_output=True,
                          text=True, cwd=cwd, timeout=300)


def pytest_collection_modifyitems(config, items):
    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="needs a CUDA device")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)
