"""A named host class for `scan --gpu NAME --host FILE` (costmodel/host_class.py): the host
file `gpusync host-probe` writes and how it is refused, the user's Python scaled by the two
machines' framework probes, and the note a busy scanning machine earns.  No timing: the
probe's figures are made up, but for the command's own file, which is only checked to be
one."""
from __future__ import annotations

import dataclasses
import math
import os
from unittest import mock

import pytest
import yaml

from gpusync import yamlfile
from gpusync.costmodel.annotate import BUSY_SHARE, Calibration, annotate
from gpusync.costmodel.gpus import get_gpu
from gpusync.costmodel.host import HostModel
from gpusync.costmodel.host_class import HostClass, parse, read
from gpusync.costmodel.predict import predict_steps
from gpusync.costmodel.records import OpRecord, StepTrace, SyncPoint, TensorMeta
from gpusync.errors import BadInput
from tests.conftest import run_main

US = 1e-6
H100 = get_gpu("h100")
GOOD = {"kind": "gpusync-host", "schema_version": 1, "name": "a100-box", "probe_us": 150.0}


def test_a_number_yaml_reads_as_text_is_still_a_number():
    assert parse({**GOOD, "probe_us": "1e2"}, "f").probe_us == 100.0  # YAML 1.1: no dot, text
    figures = {"view_us": "4", "op_us": "1.18e1", "backward_op_us": 9}
    assert parse({**GOOD, **figures}, "f").op_us == 11.8


def test_a_host_file_round_trips_through_its_yaml():
    host = HostClass(name="a100-box", probe_us=151.5, cpu="x86_64", cores=64, python="3.12.3",
                     torch="2.11.0", measured="2026-11-27T13:00:00+00:00")
    assert parse(yamlfile.load(host.to_yaml(), "f"), "f") == host
    assert host.scale_from(101.0 * US) == pytest.approx(1.5)


def test_a_host_files_per_op_figures_round_trip_and_replace_the_published_ones():
    measured = HostClass(name="h200-box", probe_us=140.0, view_us=5.0, op_us=12.0,
                         backward_op_us=9.0, cudnn_call_us=50.0)
    text = measured.to_yaml()
    assert parse(yamlfile.load(text, "f"), "f") == measured
    # dispatch: an op without a kernel; launch: what a kernel adds; the engine: a backward op
    # less its launch; cuDNN's call as measured
    host = measured.host_model(HostModel(gap_overhead_s=2 * US, python_scale=1.5))
    assert (host.dispatch_s, host.launch_api_s, host.engine_op_s, host.library_call_s) == \
        pytest.approx((5 * US, 7 * US, 2 * US, 50 * US))
    assert (host.gap_overhead_s, host.python_scale) == (2 * US, 1.5)
    # no cuDNN there: its published figure stays; nothing measured (a CPU machine's probe):
    # the published figures stay, and the file does not name the figures at all
    no_cudnn = dataclasses.replace(measured, cudnn_call_us=None)
    assert no_cudnn.host_model(HostModel()).library_call_s == HostModel().library_call_s
    plain = HostClass(name="cpu-box", probe_us=100.0)
    assert plain.host_model(HostModel()) == HostModel() and not plain.measured_ops
    assert "op_us" not in plain.to_yaml() and "op_us" in text


def test_host_probe_keeps_the_per_op_figures_where_cuda_is_and_says_when_it_could_not(
        monkeypatch, capsys):
    import torch

    from gpusync.costmodel import host_class, op_probe

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(op_probe, "measure", lambda: op_probe.OpFigures(4.0, 11.0, 6.0, 39.0))
    host = host_class.measure("gpu-box")
    assert (host.view_us, host.op_us, host.backward_op_us, host.cudnn_call_us) == \
        (4.0, 11.0, 6.0, 39.0)

    def broken():
        raise RuntimeError("CUDA error: no kernel image is available\nmore")

    monkeypatch.setattr(op_probe, "measure", broken)
    host = host_class.measure("gpu-box")
    assert not host.measured_ops and host.probe_us > 0
    [line] = capsys.readouterr().err.strip().splitlines()
    assert line == ("gpusync: warning: the per-op figures were not measured here (CUDA error: "
                    "no kernel image is available); the host file has the probe only")


def test_the_per_op_probe_times_each_kind_of_op():
    from gpusync.costmodel import op_probe

    figures = op_probe.measure("cpu")  # the same code on host tensors: no cuDNN there
    assert figures.view_us > 0 and figures.op_us > 0 and figures.backward_op_us > 0
    assert figures.cudnn_call_us is None


@pytest.mark.parametrize("data, says", [
    ([1, 2], "not a gpusync host file"),
    ({**GOOD, "kind": "gpusync-scan"}, "not a gpusync host file"),
    ({k: v for k, v in GOOD.items() if k != "probe_us"}, "lacks probe_us"),
    ({**GOOD, "probe_ms": 1.0}, "has unknown key\\(s\\): probe_ms"),
    ({**GOOD, "schema_version": 2}, "schema_version 2"),
    ({**GOOD, "schema_version": True}, "schema_version True"),
    ({**GOOD, "schema_version": 1.0}, "schema_version 1.0"),
    ({**GOOD, "probe_us": 0}, "probe_us must be a number of microseconds from 1 to 100000"),
    ({**GOOD, "probe_us": -3.0}, "probe_us must be a number"),
    ({**GOOD, "probe_us": 1e300}, "probe_us must be a number"),
    ({**GOOD, "probe_us": "1e-300"}, "probe_us must be a number"),
    ({**GOOD, "probe_us": math.nan}, "probe_us must be a number"),
    ({**GOOD, "probe_us": True}, "probe_us must be a number"),
    ({**GOOD, "probe_us": "fast"}, "probe_us must be a number"),
    ({**GOOD, "name": " "}, "name must be one line of printable text"),
    ({**GOOD, "name": "two\nlines"}, "name must be one line of printable text"),
    ({**GOOD, "cores": 2.5}, "cores must be a whole number"),
    ({**GOOD, "op_us": -1.0}, "op_us must be a number of microseconds from 0 to 10000"),
    ({**GOOD, "op_us": 9.0}, "has per-op figures but lacks view_us, backward_op_us"),
    ({**GOOD, "view_us": 4.0, "op_us": 9.0, "cudnn_call_us": 40.0},
     "has per-op figures but lacks backward_op_us"),
    ({**GOOD, "cudnn_call_us": 40.0}, "lacks view_us, op_us, backward_op_us"),
    ({**GOOD, "view_us": 4.0, "op_us": None, "backward_op_us": 9.0},
     "op_us must be a number of microseconds from 0 to 10000, got None"),
    ({**GOOD, "view_us": 4.1, "op_us": 1.0, "backward_op_us": 9.0},
     "op_us \\(1, an op with a kernel\\) is below view_us \\(4.1, an op without one\\)"),
    ({**GOOD, "view_us": "fast"}, "view_us must be a number"),
    ({**GOOD, "cudnn_call_us": 1e9}, "cudnn_call_us must be a number"),
    ({**GOOD, "backward_op_us": True}, "backward_op_us must be a number"),
])
def test_a_bad_host_file_is_one_line_of_bad_input(data, says):
    with pytest.raises(BadInput, match=says) as raised:
        parse(data, "host file h.yaml")
    assert "\n" not in str(raised.value)


def _op(name: str, start: float, python: float, clean: bool = True) -> OpRecord:
    """A tiny op `python` seconds of the user's Python after the one before."""
    return OpRecord(name, (TensorMeta((4,)),), (TensorMeta((4,)),), host_start_s=start,
                    host_end_s=start + 5 * US, python_s=python, python_clean=clean)


def _step(clean_every: int = 1) -> StepTrace:
    ops = tuple(_op(f"aten.add.Tensor#{i}", i * 100 * US, 50 * US, clean=i % clean_every == 0)
                for i in range(10))
    read = SyncPoint("train.py:9", 1100 * US, op="item", nbytes=8, python_s=20 * US,
                     host_end_s=1101 * US)
    return StepTrace(ops=ops, syncs=(read,), start_s=0.0, end_s=1200 * US, tail_python_s=0.0)


def test_a_host_class_scales_the_users_python_and_nothing_else():
    """10 ops with 50 us of Python before each and a read with 20: 520 us of Python; the
    host issues each op for dispatch + launch and the read for dispatch + launch."""
    plain = HostModel()
    twice = dataclasses.replace(plain, python_scale=2.0)
    issue = 10 * (plain.dispatch_s + plain.launch_api_s) + plain.dispatch_s + plain.launch_api_s
    for host, python in ((plain, 520 * US), (twice, 1040 * US)):
        step = predict_steps([_step()], H100, host=host).steps[0]
        assert step.python_ms == pytest.approx(python * 1e3)
        assert step.host_ms == pytest.approx((python + issue) * 1e3)
        assert step.bound == "host"


def _report():
    from gpusync.report import Report

    return Report(mode="simulate", device="cpu", steps=1, warmup=0, measured_steps=1,
                  syncs_per_step=1.0, max_syncs_per_step=1, syncs_by_phase={}, sites=())


def test_a_busy_scanning_machine_is_said_and_a_named_host_is_reported():
    host = HostClass(name="a100-box", probe_us=200.0)
    scaled = dataclasses.replace(HostModel(), python_scale=2.0)
    quiet = predict_steps([_step()], H100, host=scaled)
    lost = predict_steps([_step(clean_every=2)], H100, host=scaled)  # half after a lost core
    assert quiet.lost_core_share == 0.0 and lost.lost_core_share == pytest.approx(5 / 11)
    notes = {share: annotate(_report(), lost, H100, scaled,
                             Calibration(host, 100 * US, share)).notes
             for share in (None, 0.02, BUSY_SHARE, 0.65)}
    said = [n for n in notes[0.65] if n.startswith("the scanning machine was busy")]
    assert said == [notes[0.65][-1]] and "other processes used 65% of its CPU time" in said[0]
    assert "held within 2%" in said[0]  # one intra-op thread (Calibration's default)
    threaded = annotate(_report(), lost, H100, scaled,
                        Calibration(host, 100 * US, 0.65, threads=2)).notes[-1]
    assert "reads high" in threaded and "OMP_NUM_THREADS=1" in threaded
    assert not any("busy" in n for s in (None, 0.02, BUSY_SHARE) for n in notes[s])
    with mock.patch.dict(os.environ, {"LOCAL_WORLD_SIZE": "2"}):  # under torchrun
        ranked = annotate(_report(), lost, H100, scaled, Calibration(host, 100 * US, 0.65))
    assert ("other processes (this torchrun job's 1 other rank(s) among them) used 65%"
            in ranked.notes[-1])
    cost = annotate(_report(), quiet, H100, scaled,
                    Calibration(host, 100 * US, 0.02)).to_dict()["cost"]
    assert (cost["host_name"], cost["host_probe_us"], cost["probe_us"], cost["python_scale"],
            cost["others_cpu_share"]) == ("a100-box", 200.0, 100.0, 2.0, 0.02)
    mine = annotate(_report(), quiet, H100, HostModel(), Calibration(None, 100 * US))
    assert mine.to_dict()["cost"]["host_name"] is None
    assert mine.to_dict()["cost"]["others_cpu_share"] is None


def test_other_processes_share_is_read_off_proc_stat(tmp_path):
    from gpusync.costmodel import machine_load

    stat = tmp_path / "stat"
    # user nice system idle iowait irq softirq steal guest guest_nice, in clock ticks
    stat.write_text("cpu  100 0 50 900 10 0 0 20 30 0\ncpu0 1 2 3\n")
    usage = machine_load.now(str(stat))
    assert usage is not None
    assert usage.machine_s == pytest.approx(170 / machine_load.os.sysconf("SC_CLK_TCK"))
    start = machine_load.Usage(machine_s=10.0, own_s=1.0, wall_s=100.0)
    end = machine_load.Usage(machine_s=14.0, own_s=2.0, wall_s=102.0)
    assert machine_load.others_share(start, end, cpus=2) == pytest.approx(3.0 / 4.0)
    assert machine_load.others_share(start, start, cpus=2) is None
    assert machine_load.others_share(None, end) is None
    assert machine_load.now(str(tmp_path / "absent")) is None
    stat.write_text("intr 1 2\n")
    assert machine_load.now(str(stat)) is None


def test_host_probe_writes_a_host_file_that_scan_reads(tmp_path):
    out = tmp_path / "host.yaml"
    proc = run_main("host-probe", "--name", "gpu-box", "-o", str(out))
    assert proc.returncode == 0, proc.stderr
    host = read(str(out))
    assert host.name == "gpu-box" and host.probe_us > 0 and host.torch and host.measured
    assert yaml.safe_load(out.read_text())["kind"] == "gpusync-host"
    import torch

    assert host.measured_ops == torch.cuda.is_available()  # per-op figures need CUDA


def test_a_scan_with_a_hosts_measured_figures_issues_ops_at_them(tmp_path):
    import json

    (tmp_path / "host.yaml").write_text(HostClass(
        name="h200-box", probe_us=140.0, view_us=5.0, op_us=12.0, backward_op_us=9.0,
        cudnn_call_us=50.0).to_yaml())
    (tmp_path / "train.py").write_text(
        "import torch\n"
        "w = torch.ones(4, device='cuda', requires_grad=True)\n"
        "for step in range(3):\n"
        "    loss = (w * 2).sum()\n"
        "    loss.backward()\n"
        "    print(loss.item())\n")
    proc = run_main("scan", "train.py", "--gpu", "h200", "--host", "host.yaml", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert ("host: 5 us per op called from Python, 2 us per op of backward, + 7 us per kernel "
            "launch, + 50 us per cuDNN call of a convolution (measured on h200-box by "
            "`gpusync host-probe`)") in proc.stdout
    proc = run_main("scan", "train.py", "--gpu", "h200", "--host", "host.yaml", "--format",
                    "json", cwd=tmp_path)
    cost = json.loads(proc.stdout)["cost"]
    assert (cost["host_dispatch_us"], cost["launch_api_us"], cost["engine_op_us"],
            cost["cudnn_call_us"], cost["per_op_from"]) == (5.0, 7.0, 2.0, 50.0, "h200-box")


@pytest.mark.parametrize("args, says", [
    (("--host", "h.yaml"), "--host needs --gpu"),
    (("--gpu", "h100", "--host", "missing.yaml"), "cannot read host file missing.yaml"),
    (("--gpu", "h100", "--host", "bad.yaml"), "host file bad.yaml lacks probe_us"),
])
def test_scan_refuses_a_bad_host_before_it_runs(tmp_path, args, says):
    (tmp_path / "h.yaml").write_text(HostClass("x", 100.0).to_yaml())
    (tmp_path / "bad.yaml").write_text("kind: gpusync-host\nschema_version: 1\nname: x\n")
    (tmp_path / "train.py").write_text("raise SystemExit('never run')\n")
    proc = run_main("scan", "train.py", *args, cwd=tmp_path)
    assert proc.returncode == 2 and proc.stdout == ""
    [line] = proc.stderr.strip().splitlines()
    assert line.startswith(f"gpusync: error: {says}")


def test_a_slow_moment_at_the_scans_probe_does_not_set_the_scale(monkeypatch):
    """The probe is taken again after the run and the least kept: on the GPU machine one
    scan's probe read 283 us where the others read 140-150, which halved its Python at the
    host's pace."""
    from gpusync.costmodel import probe
    from gpusync.costmodel.scan import CostScan

    readings = iter([283.4e-6, 141.0e-6])
    monkeypatch.setattr(probe, "warm_s", lambda samples=20: next(readings))
    named = HostClass(name="gpu-host", probe_us=141.8, cpu="x86_64", cores=16, python="3.12.3",
                      torch="2.11.0", measured="2026-11-27T14:58:30+00:00")
    scan = CostScan(get_gpu("h200"), HostModel(), host_class=named)
    scan.probe_s = probe.warm_s()  # as _calibrate takes it, before the run
    assert named.scale_from(scan.probe_s) == pytest.approx(0.5, abs=0.01)  # alone: halved
    scan._probe_again()
    assert scan.probe_s == pytest.approx(141.0e-6)
    assert scan.host.python_scale == pytest.approx(141.8 / 141.0)
