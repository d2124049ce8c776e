"""A named host class: how fast the GPU machine's CPU runs framework code, for `scan --gpu
NAME --host FILE` (docs/cost-model.md, "The GPU machine's host").

`gpusync host-probe` runs the framework probe (probe.py: a tiny training step on CPU tensors)
on the machine it is run on, which needs no GPU, and writes a host file.  A scan given that
file measures the same probe on the scanning machine before the run and counts the scanned
code's Python at the GPU machine's pace: times `python_scale` = the host's probe / this
machine's.  Where `host-probe` ran with CUDA, the file also holds the per-op figures measured
there (op_probe.py), which then replace the published ones (host.py); the device side is the
GPU's.
"""

from __future__ import annotations

import dataclasses
import datetime as _dt
import math
import os
import platform
from dataclasses import asdict, dataclass
from typing import Any

from gpusync.costmodel.host import HostModel
from gpusync.errors import BadInput

KIND = "gpusync-host"
SCHEMA_VERSION = 1
# Fields a host file must give, and those it may; anything else is a misspelling.
_REQUIRED = ("kind", "schema_version", "name", "probe_us")
# The per-op figures (op_probe.py), each optional: measured only where CUDA was.
_PER_OP = ("view_us", "op_us", "backward_op_us", "cudnn_call_us")
_OPTIONAL = ("cpu", "cores", "python", "torch", "measured", *_PER_OP)


@dataclass(frozen=True)
class HostClass:
    """The GPU machine's host: its name, and the framework probe's least CPU time on it
    (microseconds, warm); where it was measured, for the reader."""

    name: str
    probe_us: float
    cpu: str = ""
    cores: int = 0
    python: str = ""
    torch: str = ""
    measured: str = ""
    # host us per kind of op measured there with CUDA (op_probe.py); None: not measured
    view_us: float | None = None
    op_us: float | None = None
    backward_op_us: float | None = None
    cudnn_call_us: float | None = None

    def to_yaml(self) -> str:
        import yaml

        body = {"kind": KIND, "schema_version": SCHEMA_VERSION,
                **{k: v for k, v in asdict(self).items() if v is not None}}
        header = ("# gpusync host file: the framework probe's least CPU time on this machine\n"
                  "# (gpusync host-probe), and with CUDA its per-op figures; scan --gpu NAME\n"
                  "# --host FILE scales the scanned code's Python to it and issues ops at\n"
                  "# them (docs/cost-model.md)\n")
        return header + yaml.safe_dump(body, sort_keys=False)

    @property
    def measured_ops(self) -> bool:
        """Whether the per-op figures were measured there (all but cuDNN's go together)."""
        return None not in (self.view_us, self.op_us, self.backward_op_us)

    def host_model(self, host: HostModel) -> HostModel:
        """`host` with this machine's measured per-op figures in place of the published ones:
        dispatch an op without a kernel, the launch what an op with one adds, autograd's
        engine what a backward op costs less its launch; unchanged where none were measured."""
        if not self.measured_ops:
            return host
        view, op, backward = (float(v or 0.0) * 1e-6
                              for v in (self.view_us, self.op_us, self.backward_op_us))
        launch = max(0.0, op - view)
        cudnn = host.library_call_s if self.cudnn_call_us is None else self.cudnn_call_us * 1e-6
        return dataclasses.replace(host, dispatch_s=view, launch_api_s=launch,
                                   engine_op_s=max(0.0, backward - launch),
                                   library_call_s=cudnn)

    def scale_from(self, scanned_probe_s: float) -> float:
        """The factor from the scanning machine's Python to this host's: the probes' ratio."""
        return (self.probe_us * 1e-6) / scanned_probe_s if scanned_probe_s > 0 else 1.0


def measure(name: str | None = None) -> HostClass:
    """This machine's HostClass (the probe timed here; named after the machine by default),
    with the per-op figures where CUDA is here."""
    import torch

    from gpusync.costmodel import op_probe, probe

    figures = None
    if torch.cuda.is_available():
        try:
            figures = op_probe.measure()
        except Exception as error:  # a CUDA error, say: the file without them, in one line
            from gpusync import verbosity

            why = str(error).splitlines()[0] if str(error) else type(error).__name__
            verbosity.info(f"gpusync: warning: the per-op figures were not measured here "
                           f"({why}); the host file has the probe only")
    return HostClass(name=name or platform.node() or "this machine",
                     probe_us=round(probe.warm_s(samples=50) * 1e6, 2),
                     cpu=platform.processor() or platform.machine(),
                     cores=os.cpu_count() or 0, python=platform.python_version(),
                     torch=str(torch.__version__),
                     measured=_dt.datetime.now(_dt.timezone.utc).replace(
                         microsecond=0).isoformat(),
                     **(asdict(figures) if figures is not None else {}))


# The probe takes about 100 us on the 2-core VM; a host file outside these bounds is a mistake,
# and one with no bound would scale the user's Python by anything (1e300 was accepted).
PROBE_US_RANGE = (1.0, 100_000.0)
# A per-op figure above this is no op's host cost (a cuDNN call reads 40-80 us).
PER_OP_US_MAX = 10_000.0


def parse(data: Any, what: str) -> HostClass:
    """A host file's data as a HostClass; BadInput (one line, naming `what`) when it is not
    one."""
    if not isinstance(data, dict) or data.get("kind") != KIND:
        raise BadInput(f"{what} is not a gpusync host file (kind: {KIND}; write one with "
                       "`gpusync host-probe -o FILE` on the GPU machine)")
    missing = [k for k in _REQUIRED if k not in data]
    unknown = sorted(str(k) for k in set(data) - set(_REQUIRED) - set(_OPTIONAL))
    if missing or unknown:
        why = (f"lacks {', '.join(missing)}" if missing
               else f"has unknown key(s): {', '.join(unknown)}")
        raise BadInput(f"{what} {why}")
    version = data["schema_version"]
    if type(version) is not int or version != SCHEMA_VERSION:  # not True, not 1.0
        raise BadInput(f"{what}: schema_version {version!r} is not one this gpusync reads "
                       f"({SCHEMA_VERSION})")
    cores = data.get("cores", 0)
    if type(cores) is not int or cores < 0:
        raise BadInput(f"{what}: cores must be a whole number, got {cores!r}")
    fields: dict[str, Any] = {k: str(data[k]) for k in ("cpu", "python", "torch", "measured")
                              if k in data}
    fields.update({k: _per_op_us(data[k], k, what) for k in _PER_OP if k in data})
    missing_ops = [k for k in _PER_OP[:3] if k not in fields]
    if missing_ops and (len(missing_ops) < 3 or "cudnn_call_us" in fields):
        raise BadInput(f"{what} has per-op figures but lacks {', '.join(missing_ops)} "
                       "(gpusync host-probe writes view_us, op_us and backward_op_us together)")
    if not missing_ops and fields["op_us"] < fields["view_us"]:
        raise BadInput(f"{what}: op_us ({fields['op_us']:g}, an op with a kernel) is below "
                       f"view_us ({fields['view_us']:g}, an op without one)")
    return HostClass(name=checked_name(data["name"], f"{what}: name"),
                     probe_us=_probe_us(data["probe_us"], what), cores=cores, **fields)


def _per_op_us(value: Any, key: str, what: str) -> float:
    """A per-op figure: a number of microseconds from 0 to PER_OP_US_MAX."""
    number = _number(value)
    if number is None or not 0 <= number <= PER_OP_US_MAX:
        raise BadInput(f"{what}: {key} must be a number of microseconds from 0 to "
                       f"{PER_OP_US_MAX:g}, got {value!r}")
    return number


def _probe_us(value: Any, what: str) -> float:
    """probe_us as a number within PROBE_US_RANGE."""
    number = _number(value)
    low, high = PROBE_US_RANGE
    if number is None or not low <= number <= high:
        raise BadInput(f"{what}: probe_us must be a number of microseconds from {low:g} to "
                       f"{high:g} (the probe takes about 100 on a current CPU), got {value!r}")
    return number


def _number(value: Any) -> float | None:
    """A finite number, written as one or as text (YAML 1.1 reads 1e300, without a dot, as
    text); None for anything else (a boolean, null, a list)."""
    if not isinstance(value, (int, float, str)) or isinstance(value, bool):
        return None
    try:
        number = float(value)
    except ValueError:
        return None
    return number if math.isfinite(number) else None


def checked_name(name: Any, what: str) -> str:
    """A host class's name: one line of printable text, not blank."""
    if not isinstance(name, str) or not name.strip() or not name.isprintable():
        raise BadInput(f"{what} must be one line of printable text, not empty")
    return name


def read(path: str) -> HostClass:
    """The host file at `path`; BadInput (one line) when it cannot be read or is not one."""
    from gpusync import yamlfile
    from gpusync.fileio import read_user_file

    what = f"host file {path}"
    return parse(yamlfile.load(read_user_file(path, "host file", yamlfile.MAX_BYTES), what),
                 what)
