"""What users install: the built wheel, in a fresh venv with only the core dependencies (no
torchrec, no fbgemm), run from a folder outside the checkout. An editable install hides
packaging mistakes (a missing subpackage, a data folder shadowing a module); this does not.
Subprocesses: the installed CLI, in a venv of its own, is what is tested.

The clean venv is kept in .venv-wheel/ (git-ignored) keyed by the core requirements, so a
second run only reinstalls the wheel; a fresh clone (CI) builds it from scratch.
"""
import hashlib
import os
import pathlib
import subprocess
import sys
import textwrap
import venv

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[2]
CORE = ["torch==2.13.0", "click", "pyyaml", "tabulate", "jsonschema", "numpy", "tqdm"]
pytestmark = pytest.mark.wheel


def run(cmd, cwd=None, env=None, timeout=900):
    proc = subprocess.run([str(c) for c in cmd], capture_output=True, text=True, cwd=cwd,
                          env=env, timeout=timeout)
    assert proc.returncode == 0, f"{cmd} failed:\n{proc.stdout}\n{proc.stderr}"
    return proc


@pytest.fixture(scope="module")
def clean_venv(tmp_path_factory):
    folder = ROOT / ".venv-wheel"
    stamp = hashlib.sha256(" ".join(CORE).encode()).hexdigest()[:16]
    python = folder / "bin" / "python"
    if not (python.exists() and (folder / ".stamp").exists()
            and (folder / ".stamp").read_text() == stamp):
        venv.create(folder, with_pip=True, clear=True)
        # --no-compile: torch's thousands of modules are not byte-compiled now (about 35 s of
        # the setup on 2 cores) but by the test's first import of them, those it imports only
        run([python, "-m", "pip", "install", "--quiet", "--disable-pip-version-check",
             "--no-compile", *CORE])
        (folder / ".stamp").write_text(stamp)
    wheels = tmp_path_factory.mktemp("wheel")
    run([sys.executable, "-m", "pip", "wheel", "--quiet", "--no-deps", "--no-build-isolation",
         "-w", wheels, ROOT])
    wheel = next(wheels.glob("gpusync-*.whl"))
    run([python, "-m", "pip", "install", "--quiet", "--disable-pip-version-check",
         "--force-reinstall", "--no-deps", wheel])
    return folder


def test_the_installed_cli_works_outside_the_checkout(clean_venv, tmp_path):
    gpusync = clean_venv / "bin" / "gpusync"
    # a user's environment; bytecode written (the venv's torch is byte-compiled by the first
    # command, not at its install: clean_venv)
    env = {k: v for k, v in os.environ.items()
           if k not in ("PYTHONPATH", "VIRTUAL_ENV", "PYTHONDONTWRITEBYTECODE")}
    env.update(OMP_NUM_THREADS="1", MKL_NUM_THREADS="1")
    from gpusync import __version__

    assert run([gpusync, "--version"], cwd=tmp_path, env=env).stdout.strip().endswith(__version__)
    profiles = run([gpusync, "profiles"], cwd=tmp_path, env=env).stdout
    assert "sparsenn " in profiles and "writeback" in profiles
    (tmp_path / "train.py").write_text(textwrap.dedent('''
        import torch
        m = torch.nn.Linear(3, 1).to('cuda' if torch.cuda.is_available() else 'cpu')
        opt = torch.optim.SGD(m.parameters(), lr=0.1)
        for _ in range(3):
            loss = m(torch.randn(4, 3, device=m.weight.device)).sum()
            opt.zero_grad(); loss.backward(); opt.step()
            print(loss.item())
    '''))
    scan = run([gpusync, "scan", "train.py", "--format", "json"], cwd=tmp_path, env=env)
    assert '"op": "item"' in scan.stdout
    run([gpusync, "scan", "sparsenn", "--steps", "1"], cwd=tmp_path, env=env)
    # what the package holds, in one fresh interpreter: every subpackage of the checkout, each
    # importing with the core only (first, in pkgutil's order), and the profiles under their
    # own name
    python = clean_venv / "bin" / "python"
    check = run([python, "-c", textwrap.dedent('''
        import importlib, importlib.resources as r, pathlib, pkgutil, gpusync
        names = ["gpusync"] + [m.name for m in pkgutil.walk_packages(gpusync.__path__, "gpusync.")
                               if m.ispkg and m.name != "gpusync.builtin_profiles"]
        for name in names:
            importlib.import_module(name)
        print(" ".join(sorted(names)))
        import gpusync.integrations.torchrec, gpusync.knobs, gpusync.profiles
        root = pathlib.Path(gpusync.__file__).parent
        print(sorted(p.name for p in r.files("gpusync.builtin_profiles").iterdir()
                     if p.name.endswith(".yaml")))
        print((root / "profiles").exists(), "site-packages" in str(root))
    ''')], cwd=tmp_path, env=env).stdout.splitlines()
    source = sorted(".".join(p.parent.relative_to(ROOT).parts)
                    for p in (ROOT / "gpusync").rglob("__init__.py"))
    assert check[0].split() == source
    assert "'sparsenn.yaml'" in check[1] and check[2] == "False True"
    # without torchrec, its profile is a one-line error, not a traceback
    proc = subprocess.run([str(gpusync), "scan", "torchrec_dlrm"], capture_output=True,
                          text=True, cwd=tmp_path, env=env, timeout=300)
    assert proc.returncode == 2 and "needs torchrec, which is not installed" in proc.stderr
    assert "Traceback" not in proc.stderr
