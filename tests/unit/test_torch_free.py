"""The `gpusync` command's own process never imports torch for scan, baseline and gate: the
scan runs in a child that does, and a second torch import in the parent was about a second of
CPU per command (docs/benchmarks/cost-model-overhead.md)."""
import json
import os
import subprocess
import sys
import textwrap

import pytest

# The commands in one process, then whether torch was imported: rc per command, and the flag.
_DRIVER = textwrap.dedent("""
    import json, sys
    from gpusync.cli import main
    rcs = [main(argv) for argv in json.loads(sys.argv[1])]
    print(json.dumps({"rcs": rcs, "torch": "torch" in sys.modules}))
""")

_SCRIPT = textwrap.dedent("""
    import torch
    x = torch.ones(4, device="cuda" if torch.cuda.is_available() else "cpu")
    for i in range(3):
        print((x * i).sum().item())
""")


def test_scan_baseline_gate_and_help_never_import_torch(tmp_path):
    """scan --gpu --host included: the host file is read in the parent too."""
    from gpusync.costmodel.host_class import HostClass

    script, base, host = tmp_path / "train.py", tmp_path / "base.json", tmp_path / "host.yaml"
    script.write_text(_SCRIPT)
    host.write_text(HostClass(name="gpu-box", probe_us=150.0).to_yaml())
    commands = [["--help"], ["bench", "--help"],
                ["scan", str(script), "--gpu", "h100", "--host", str(host), "--format", "json",
                 "-o", str(tmp_path / "r.json")],
                ["baseline", str(script), "-o", str(base)],
                ["gate", str(script), "--baseline", str(base)]]
    env = {k: v for k, v in os.environ.items() if k != "GPUSYNC_IN_PROCESS"}
    proc = subprocess.run([sys.executable, "-c", _DRIVER, json.dumps(commands)], cwd=tmp_path,
                          capture_output=True, text=True, env=env, timeout=600)
    assert proc.returncode == 0, proc.stderr
    result = json.loads(proc.stdout.strip().splitlines()[-1])
    assert result == {"rcs": [0, 0, 0, 0, 0], "torch": False}, proc.stderr
    report = json.loads((tmp_path / "r.json").read_text())
    assert report["gpu"] == "h100" and report["torch_version"]  # the child's torch
    assert [s["op"] for s in report["sites"]] == ["item"]
    cost = report["cost"]  # --host: the user's Python at gpu-box's pace
    assert cost["host_name"] == "gpu-box" and cost["host_probe_us"] == 150.0
    assert cost["python_scale"] == pytest.approx(150.0 / cost["probe_us"], rel=1e-3)


def test_bench_subcommands_name_every_technique():
    from gpusync.bench.techniques import TECHNIQUES
    from gpusync.commands.bench import TECHNIQUE_NAMES

    assert TECHNIQUE_NAMES == tuple(TECHNIQUES)
