"""The virtual CUDA device on PyTorch's own op database (OpInfo), as a differential.

Each op with CUDA dtypes runs its sample inputs plainly on the CPU, then inside a scan Session
on the virtual CUDA device twice: with the sample's tensors moved there first (`.to("cuda")`,
as a user's code moves them), and (the function variant) with them left in host memory. What
the code can see must be the same (opdb_compare.py): output values, dtypes, shapes, strides,
requires_grad, input gradients, exceptions, and the device each output and gradient reports,
which is derived from PyTorch's own rule, not from gpusync: a call given a tensor or a device
on the GPU has its outputs there (cuda:0), a call given only host tensors keeps them all on
the host, and makes no sync. Every sync the scan recorded while an op ran
(forward) or while its gradient was taken (backward) is kept as the op's verdict.

The budget (Budget; CI is the test's, about 25 s of CPU for ~24,000 calls, and
scripts/op_table.py uses the same, so the table docs/rules.md carries is the one the test
checks): one dtype per op (float32 where both the CPU and CUDA support it, else the first dtype
both support), every sample of the function, method and in-place variants, gradients only for
float32 samples of ops that support autograd (in-place variants run without). Random ops are
compared by value too: both runs seed the generator before each call. All virtual runs share
one Session (each call's arguments are its own, so nothing carries from one op to the next).
"""
from __future__ import annotations

import concurrent.futures
import dataclasses
import functools
import itertools
import operator
import warnings
from typing import Any, Callable, Iterable

import torch
from torch.utils._pytree import tree_flatten, tree_map

from ..detect.session import Session
from .opdb_compare import Call, compare, error_of, leaf_record
from .opdb_known import HOST_OUTPUTS, SHAPE_ONLY

SEED = 0
Tensor = torch.Tensor


@dataclasses.dataclass(frozen=True)
class Budget:
    """How much of each op runs: `samples` of its function variant, `variant_samples` of its
    method and in-place variants (None: all)."""

    samples: int | None = None
    variant_samples: int | None = None


CI = Budget()  # the test's, and the committed table's: every sample
# The variants the host world runs (Host): residency does not depend on the variant's
# spelling, and the function's samples cover every op at half the cost.
HOST_VARIANTS = ("function",)


def op_db() -> list:
    """torch's OpInfo database (imported here only: it needs torch's internal test modules,
    and `expecttest`)."""
    from torch.testing._internal.common_methods_invocations import op_db

    return list(op_db)


def has_cuda(op) -> bool:
    return bool(op.supported_dtypes("cuda"))


def op_name(op) -> str:
    return op.name + (f".{op.variant_test_name}" if op.variant_test_name else "")


def _seed() -> None:
    """The CPU generator, which both worlds' kernels draw from. Not torch.manual_seed: on a
    CPU build it also queues a CUDA seeding call with a formatted stack each time (seconds
    under pytest's deep stacks, and a list that only grows)."""
    torch.default_generator.manual_seed(SEED)


def pick_dtype(op) -> torch.dtype | None:
    """float32 where both devices have it, else the first (by name) that both have."""
    both = set(op.supported_dtypes("cuda")) & set(op.supported_dtypes("cpu"))
    if torch.float32 in both:
        return torch.float32
    return min(both, key=str) if both else None


def _namespaces() -> tuple:
    import torch.nn.functional as F
    import torch.signal.windows as windows

    return (torch, torch.Tensor, F, torch.linalg, torch.special, torch.fft, torch.nn.init,
            torch.sparse, windows, torch._C._nn)


def late_bound(fn: Callable) -> Callable:
    """`fn`, looked up by name where it is called, as a user's `torch.ones(...)` or
    `x.to(...)` is: OpInfo holds the functions bound when it was imported, before a scan's
    call layers (detect/calls.py) were put on torch's attributes. Called outside a scan."""
    name = getattr(fn, "__name__", None)
    for owner in _namespaces():
        if name and getattr(owner, name, None) is fn:
            return lambda *args, **kwargs: getattr(owner, name)(*args, **kwargs)
    return fn


def _variants(op, budget: Budget) -> list[tuple[str, Callable, int | None]]:
    """(variant, function, samples) in the order they run."""
    out = [("function", late_bound(op.op), budget.samples)]
    if op.method_variant is not None:
        out.append(("method", late_bound(op.method_variant), budget.variant_samples))
    if op.inplace_variant is not None:
        out.append(("inplace", late_bound(op.inplace_variant), budget.variant_samples))
    return out


@dataclasses.dataclass
class OpPlan:
    """One op under the budget: its samples, made once (seeded) and copied into each world."""

    name: str
    op: Any
    dtype: torch.dtype | None
    grads: bool
    samples: list = dataclasses.field(default_factory=list)
    variants: list = dataclasses.field(default_factory=list)  # _variants(op, budget)
    setup_error: str = ""  # the samples could not be made


def plan(op, budget: Budget = CI) -> OpPlan:
    dtype = pick_dtype(op)
    grads = dtype == torch.float32 and bool(op.supports_autograd)
    p = OpPlan(op_name(op), op, dtype, grads, variants=_variants(op, budget))
    if dtype is None:
        p.setup_error = "no dtype both the CPU and CUDA support"
        return p
    _seed()  # once per op; OpInfo's own per-sample seeding goes through torch.manual_seed
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            p.samples = list(itertools.islice(op.sample_inputs(
                "cpu", dtype, requires_grad=grads, set_seed=False), budget.samples))
    except Exception as e:
        p.setup_error = "sample_inputs raised " + ": ".join(error_of(e))
    return p


class Plain:
    """The CPU as it is."""

    def tensor(self, t: Tensor, grad: bool) -> Tensor:
        c = t.detach().clone()
        return c.requires_grad_() if grad and t.requires_grad else c

    def device(self, d: torch.device) -> torch.device:
        return d

    def mark(self) -> int:
        return 0

    def since(self, mark: int) -> tuple[str, ...]:
        return ()


class Virtual:
    """The virtual CUDA device of a scan Session: a sample's tensor is made on the host and
    moved with .to("cuda"); the device the sample names ("cpu") reads "cuda", as in a CUDA
    run's samples."""

    def __init__(self, session: Session):
        self.session = session
        assert session.detector is not None
        self.host = session.detector.host

    def tensor(self, t: Tensor, grad: bool) -> Tensor:
        host = t.detach().clone()
        self.host.mark_host(host)  # made in host memory, as the sample's tensors are
        dev = host.to("cuda")
        return dev.requires_grad_() if grad and t.requires_grad else dev

    def device(self, d: torch.device) -> torch.device:
        return torch.device("cuda", 0) if d.type == "cpu" else d

    def mark(self) -> int:
        return len(self.session.events)

    def since(self, mark: int) -> tuple[str, ...]:
        return tuple(e.op for e in self.session.events[mark:])


class Host(Virtual):
    """The same Session with the sample left where it was made, in host memory: a CUDA build
    keeps every output and gradient of a call given nothing on the device on the host, so
    each must read cpu, and no host read is a sync (the residency half of the differential:
    the virtual world checks the device side)."""

    def tensor(self, t: Tensor, grad: bool) -> Tensor:
        host = t.detach().clone()
        return host.requires_grad_() if grad and t.requires_grad else host

    def device(self, d: torch.device) -> torch.device:
        return d


def _arguments(sample, world, grad: bool):
    """The sample's arguments in `world`; a device it names ("cpu" for the CPU samples)
    becomes the world's, as a CUDA run's samples name "cuda"."""
    def copy(x):
        if isinstance(x, Tensor):
            return world.tensor(x, grad)
        if isinstance(x, torch.device):
            return world.device(x)
        return x

    def named(x):  # a device named by a string ("cpu"), as `to` and the factories take it
        return world.device(torch.device(x)) if x in ("cpu", "cpu:0") else x

    inp, args, kwargs = tree_map(copy, (sample.input, sample.args, sample.kwargs))
    args = tuple(named(a) if isinstance(a, str) else a for a in args)
    if isinstance(kwargs.get("device"), str):
        kwargs["device"] = named(kwargs["device"])
    return inp, args, kwargs


def run_call(fn: Callable, sample, world, grad: bool) -> Call:
    """One call in one world: its outputs as the code reads them, its gradient, its syncs."""
    inp, args, kwargs = _arguments(sample, world, grad)
    flat = tree_flatten((inp, args, kwargs))[0]
    leaves_in = [t for t in flat if isinstance(t, Tensor) and t.requires_grad]
    placed = any(isinstance(x, (Tensor, torch.device)) for x in flat)
    _seed()
    mark = world.mark()
    try:
        out = fn(inp, *args, **kwargs)
    except Exception as e:
        return Call(error=error_of(e), forward=world.since(mark), placed=placed)
    call = Call(forward=world.since(mark), placed=placed)
    leaves, spec = tree_flatten(out)
    call.spec = str(spec)
    call.leaves = [leaf_record(x) for x in leaves]
    if grad and leaves_in:
        _gradient(call, sample, out, leaves_in, world)
    return call


def _gradient(call: Call, sample, out, leaves_in: list, world) -> None:
    """Backward of the sum of the float outputs (after the sample's own output processing):
    the input gradients, and the syncs backward made."""
    mark = world.mark()
    try:
        processed = sample.output_process_fn_grad(out)
        floats = [t for t in tree_flatten(processed)[0] if isinstance(t, Tensor)
                  and t.requires_grad and (t.is_floating_point() or t.is_complex())]
        if not floats:
            return
        sums = [torch.view_as_real(t).sum() if t.is_complex() else t.sum() for t in floats]
        grads = torch.autograd.grad(functools.reduce(operator.add, sums), leaves_in,
                                    allow_unused=True)
        call.grads = [None if g is None else leaf_record(g) for g in grads]
    except Exception as e:
        call.grad_error = error_of(e)
    call.backward = world.since(mark)


@dataclasses.dataclass
class OpResult:
    """One op's differential: what differed (empty: identical), and the syncs the scan
    recorded, as (variant, sample index, phase, label)."""

    name: str
    cuda: bool  # CUDA has a kernel for some dtype (an op without one is not run)
    dtype: str = ""
    samples: list[str] = dataclasses.field(default_factory=list)  # describe_sample of each
    calls: int = 0
    variant_calls: list[tuple[str, int]] = dataclasses.field(default_factory=list)
    raised: int = 0  # calls that raised the same on both sides
    differences: list[str] = dataclasses.field(default_factory=list)
    syncs: list[tuple[str, int, str, str]] = dataclasses.field(default_factory=list)


def describe_sample(sample, dtype: torch.dtype | None) -> str:
    """A sample's arguments in a few words: `f32[5, 5], 2, dim=1` (a tensor of the op's
    dtype shows its shape only)."""
    def word(x) -> str:
        if isinstance(x, Tensor):
            shape = ", ".join(map(str, x.shape))
            kind = "" if x.dtype == dtype else str(x.dtype).replace("torch.", "") + " "
            return f"{kind}[{shape}]" + (" sparse" if x.layout != torch.strided else "")
        if isinstance(x, (list, tuple)) and any(isinstance(e, Tensor) for e in x):
            return "(" + ", ".join(word(e) for e in x) + ")"
        return repr(x).replace("torch.", "")

    words = [word(sample.input), *map(word, sample.args)]
    words += [f"{k}={word(v)}" for k, v in sample.kwargs.items()]
    # as the virtual run saw them (_arguments): the device a CPU sample names is the GPU
    text = ", ".join(words).replace("|", "/").replace("'cpu'", "'cuda'").replace(
        "device(type='cuda')", "device('cuda')")
    return text if len(text) <= 60 else text[:57] + "..."


def _run_world(plans: list[OpPlan], world, variants: tuple[str, ...] = ()) -> list[list[Call]]:
    """Each plan's calls in `world`, of the `variants` named (all when none is)."""
    out = []
    for p in plans:
        calls = []
        for variant, fn, n in p.variants:
            if variants and variant not in variants:
                continue
            for sample in p.samples[:n]:
                calls.append(run_call(fn, sample, world,
                                      grad=p.grads and variant != "inplace"))
        out.append(calls)
    return out


def run(ops: Iterable | None = None, budget: Budget = CI) -> list[OpResult]:
    """The differential over `ops` (all of op_db by default): the plain runs, then every
    virtual run inside one Session, then the comparison. An op without a CUDA kernel is
    listed, not run."""
    ops = op_db() if ops is None else list(ops)
    # Samples are made in a thread of their own: OpInfo.sample_inputs looks for the running
    # unittest by walking the caller's stack with inspect.stack(), which reads the source of
    # every frame: under pytest's deep stacks that cost more than the ops themselves
    with concurrent.futures.ThreadPoolExecutor(1) as shallow:
        plans = list(shallow.map(functools.partial(plan, budget=budget),
                                 [op for op in ops if has_cuda(op)]))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        plain = _run_world(plans, Plain())
        with Session(mode="simulate", virtual_cuda=True, auto_steps=False) as session:
            virtual = _run_world(plans, Virtual(session))
            host = _run_world(plans, Host(session), HOST_VARIANTS)
    results = {p.name: _result(p, ps, vs, hs)
               for p, ps, vs, hs in zip(plans, plain, virtual, host, strict=True)}
    return [results.get(op_name(op)) or OpResult(op_name(op), cuda=False) for op in ops]


def _host_differences(p: OpPlan, plain: list[Call], host: list[Call]) -> list[str]:
    """The host world against the plain run: the same calls (the function variant's samples
    come first in each), every output and gradient on the host, no sync."""
    out = []
    for i, (a, b) in enumerate(zip(plain, host, strict=False)):
        for d in compare(a, b, host_outputs=True, values=p.name not in SHAPE_ONLY,
                         host_grads=True):
            out.append(f"on the host, sample {i}: {d}")
        if b.forward or b.backward:
            out.append(f"on the host, sample {i}: recorded {', '.join(b.forward + b.backward)}")
    return out


def _result(p: OpPlan, plain: list[Call], virtual: list[Call], host: list[Call]) -> OpResult:
    r = OpResult(p.name, cuda=True, dtype=str(p.dtype).replace("torch.", ""),
                 samples=[describe_sample(s, p.dtype) for s in p.samples])
    if p.setup_error:
        r.differences.append(p.setup_error)
    r.variant_calls = [(variant, len(p.samples[:n])) for variant, _, n in p.variants]
    keys = [(variant, i) for variant, n in r.variant_calls for i in range(n)]
    r.calls = len(keys)
    for (variant, i), a, b in zip(keys, plain, virtual, strict=True):
        r.raised += bool(a.error and b.error)
        for d in compare(a, b, host_outputs=p.name in HOST_OUTPUTS,
                         values=p.name not in SHAPE_ONLY):
            r.differences.append(f"{variant} sample {i}: {d}")
        r.syncs += [(variant, i, "forward", label) for label in b.forward]
        r.syncs += [(variant, i, "backward", label) for label in b.backward]
    r.differences += _host_differences(p, plain, host)
    return r
