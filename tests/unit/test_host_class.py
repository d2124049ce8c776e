"""A named host class for `scan --gpu NAME --host FILE` (costmodel/host_class.py): the host
file `gpusync host-probe` writes and how it is refused, the user's Python scaled by the two
machines' framework probes, and the note a busy scanning machine earns.  No timing: the
probe's figures are made up, but for the command's own file, which is only checked to be
one."""
from __future__ import annotations

import dataclasses
import math

import pytest
import yaml

from gpusync import yamlfile
from gpusync.costmodel.annotate import BUSY_RATE, BUSY_SHARE, HostPace, annotate
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


def test_a_host_file_round_trips_through_its_yaml():
    host = HostClass(name="a100-box", probe_us=151.5, cpu="x86_64", cores=64, python="3.12.3",
                     torch="2.11.0", measured="2026-11-27T13:00:00+00:00")
    assert parse(yamlfile.load(host.to_yaml(), "f"), "f") == host
    assert host.scale_from(101.0 * US) == pytest.approx(1.5)


@pytest.mark.parametrize("data, says", [
    ([1, 2], "not a gpusync host file"),
    ({**GOOD, "kind": "gpusync-scan"}, "not a gpusync host file"),
    ({k: v for k, v in GOOD.items() if k != "probe_us"}, "lacks probe_us"),
    ({**GOOD, "probe_ms": 1.0}, "has unknown probe_ms"),
    ({**GOOD, "schema_version": 2}, "schema_version 2"),
    ({**GOOD, "probe_us": 0}, "probe_us must be a positive number"),
    ({**GOOD, "probe_us": -3.0}, "probe_us must be a positive number"),
    ({**GOOD, "probe_us": math.nan}, "probe_us must be a positive number"),
    ({**GOOD, "probe_us": True}, "probe_us must be a positive number"),
    ({**GOOD, "probe_us": "fast"}, "probe_us must be a positive number"),
    ({**GOOD, "name": " "}, "name must be a non-empty string"),
    ({**GOOD, "cores": 2.5}, "cores must be a whole number"),
])
def test_a_bad_host_file_is_one_line_of_bad_input(data, says):
    with pytest.raises(BadInput, match=says) as raised:
        parse(data, "host file h.yaml")
    assert "\n" not in str(raised.value)


def _op(name: str, start: float, python: float, clean: bool = True,
        switches: int | None = None) -> OpRecord:
    """A tiny op `python` seconds of the user's Python after the one before; its CPU clock
    reads as its wall clock, with `switches` involuntary context switches so far."""
    return OpRecord(name, (TensorMeta((4,)),), (TensorMeta((4,)),), host_start_s=start,
                    host_end_s=start + 5 * US, python_s=python, python_clean=clean,
                    cpu_start_s=start, cpu_end_s=start + 5 * US, switches_start=switches,
                    switches_end=switches)


def _step(clean_every: int = 1, switches_per_op: int = 0) -> StepTrace:
    ops = tuple(_op(f"aten.add.Tensor#{i}", i * 100 * US, 50 * US,
                    clean=i % clean_every == 0, switches=i * switches_per_op)
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
    """Busy: a fifth of the Python timed soon after a lost core AND the core lost over 100
    times per CPU second; many lost-core gaps alone (a few long kernels) are not busy."""
    host = HostClass(name="a100-box", probe_us=200.0)
    scaled = dataclasses.replace(HostModel(), python_scale=2.0)
    quiet = predict_steps([_step()], H100, host=scaled)
    # half the Python taken after a loss, but the core lost 9 times in 905 us: 9945 per s
    busy = predict_steps([_step(clean_every=2, switches_per_op=1)], H100, host=scaled)
    rare = predict_steps([_step(clean_every=2)], H100, host=scaled)  # no switch at all
    assert (quiet.lost_core_share, quiet.lost_cores_per_s) == (0.0, 0.0)
    assert busy.lost_core_share == pytest.approx(5 / 11) and 5 / 11 > BUSY_SHARE
    assert busy.lost_cores_per_s == pytest.approx(9 / (905 * US)) and 9 / (905 * US) > BUSY_RATE
    assert rare.lost_core_share == busy.lost_core_share and rare.lost_cores_per_s == 0.0
    notes = {name: annotate(_report(), p, H100, scaled, HostPace(host, 100 * US)).notes
             for name, p in (("quiet", quiet), ("busy", busy), ("rare", rare))}
    assert [n for n in notes["busy"] if n.startswith("the scanning machine was busy: it took "
                                                     "the scan's CPU core 9945 times per CPU "
                                                     "second, and 45% ")]
    assert not any("busy" in n for n in (*notes["quiet"], *notes["rare"]))
    cost = annotate(_report(), quiet, H100, scaled, HostPace(host, 100 * US)).to_dict()["cost"]
    assert (cost["host_name"], cost["host_probe_us"], cost["probe_us"],
            cost["python_scale"]) == ("a100-box", 200.0, 100.0, 2.0)
    mine = annotate(_report(), quiet, H100, HostModel(), HostPace(None, 100 * US))
    assert mine.to_dict()["cost"]["host_name"] is None


def test_host_probe_writes_a_host_file_that_scan_reads(tmp_path):
    out = tmp_path / "host.yaml"
    proc = run_main("host-probe", "--name", "gpu-box", "-o", str(out))
    assert proc.returncode == 0, proc.stderr
    host = read(str(out))
    assert host.name == "gpu-box" and host.probe_us > 0 and host.torch and host.measured
    assert yaml.safe_load(out.read_text())["kind"] == "gpusync-host"


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
