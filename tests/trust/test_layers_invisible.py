"""gpusync's call layers (detect/patches.py) are invisible to the code they wrap, and the
virtual device does not change what a script computes: each script here prints the same lines
run plainly (`python x.py`, a process: that is the point) and under `gpusync scan` (whose
stderr carries the script's own output), in this process (in_process) but where the script
must import a library first (in_child). Lines the scripts print start with "|"; the rest is
gpusync's."""
import os
import subprocess
import sys
import textwrap

import pytest

from tests.conftest import DETERMINISTIC, run_main

pytestmark = pytest.mark.usefixtures("in_process")


def outputs(tmp_path, capfd, source: str, name: str = "x.py",
            options: tuple[str, ...] = ()) -> tuple[list[str], list[str]]:
    """(plain run's lines, scanned run's lines) of the script `source`. The scanned script
    prints to run_main's stderr in this process, or from gpusync's child to this process's
    stderr (capfd)."""
    path = tmp_path / name
    path.write_text(textwrap.dedent(source))
    plain = subprocess.run([sys.executable, str(path)], capture_output=True, text=True,
                           timeout=300, cwd=tmp_path, env={**os.environ, **DETERMINISTIC})
    assert plain.returncode == 0, plain.stderr
    capfd.readouterr()
    scan = run_main("scan", path, *options, cwd=tmp_path)
    child = capfd.readouterr().err + scan.stderr  # from a child, or from this process
    assert "the scanned code raised" not in scan.stderr, scan.stderr + child
    mine = [ln for ln in plain.stdout.splitlines() if ln.startswith("|")]
    assert mine, "the script prints what it computed"
    return mine, [ln for ln in child.splitlines() if ln.startswith("|")]


def assert_same(tmp_path, capfd, source: str, options: tuple[str, ...] = ()) -> list[str]:
    plain, scanned = outputs(tmp_path, capfd, source, options=options)
    assert scanned == plain
    return plain


def test_torchscript_compiles_while_the_scan_runs(tmp_path, capfd, in_child):
    """In a child, whose script imports torchrec first (this process may have imported it).
    torchrec imports _apply_optimizer_in_backward, which scripts functions whose globals hold
    gpusync's wrappers; scripted code calling wrapped factories compiles to the same aten ops."""
    assert_same(tmp_path, capfd, """
        from typing import List

        import torch
        from torch.distributed.optim import _apply_optimizer_in_backward  # noqa: F401

        @torch.jit.script
        def f(x: torch.Tensor) -> torch.Tensor:
            return torch.zeros(3) + x.sum() + torch.tensor([1.0, 2.0, 3.0])

        class M(torch.nn.Module):
            def forward(self, x):
                y = torch.ones(2, dtype=torch.float64)
                return x.to(torch.float64) + y + torch.zeros(2)

        print("|", f(torch.ones(2)).tolist())
        print("|", torch.jit.script(M())(torch.ones(2)).tolist())
        print("|", torch.jit.trace(M(), torch.ones(2))(torch.full((2,), 3.0)).tolist())
        print("|", "aten::zeros" in str(f.graph))

        @torch.jit.script
        def g(x: torch.Tensor) -> List[float]:
            out: List[float] = x.tolist()
            return out

        print("|", g(torch.arange(3.)))
        """)


@pytest.mark.parametrize("options", [(), ("--gpu", "h100")], ids=["scan", "scan --gpu"])
def test_a_warning_from_a_wrapped_call_names_the_callers_line(tmp_path, capfd, options):
    """Also under --gpu, whose timer of gpusync's own work (costmodel/own_time.py) is one more
    frame between the line and torch's C++ (found on a public GCN script: sparse_coo_tensor's
    invariant warning, once per process, named own_time.py)."""
    assert_same(tmp_path, capfd, """
        import warnings
        import torch

        x = torch.ones(2)
        with warnings.catch_warnings(record=True) as ws:
            warnings.simplefilter("always")
            y = torch.tensor(x)
        print("|", [(w.filename.endswith("x.py"), w.lineno, w.category.__name__) for w in ws])
        print("|", y.tolist())
        """, options)


def test_wrapped_torch_functions_look_like_the_originals(tmp_path, capfd):
    """inspect, pickle and copy see torch's own callables; a C function stored on a class
    does not bind; Tensor methods have no __module__."""
    assert_same(tmp_path, capfd, """
        import copy, functools, inspect, pickle
        import torch
        import torch.nn.functional as F

        def show(*a):
            print("|", *a)

        def probe(what, fn, f):
            try:
                show(" ", what, fn(f))
            except Exception as e:
                show(" ", what, type(e).__name__)

        fns = {"zeros": torch.zeros, "tensor": torch.tensor, "one_hot": F.one_hot,
               "Tensor.to": torch.Tensor.to, "Tensor.__getitem__": torch.Tensor.__getitem__,
               "Tensor.tolist": torch.Tensor.tolist, "Tensor.__repr__": torch.Tensor.__repr__,
               "cuda.is_available": torch.cuda.is_available, "compile": torch.compile}
        for name, f in fns.items():
            show(name, type(f).__name__, inspect.isbuiltin(f), inspect.ismethoddescriptor(f),
                 inspect.isroutine(f), inspect.isfunction(f), repr(f).split(" at 0x")[0])
            show(" ", getattr(f, "__module__", "NO"), f.__qualname__, f.__name__,
                 (f.__doc__ or "")[:30].replace("\\n", " "), getattr(f, "__self__", "NO"))
            probe("signature", inspect.signature, f)
            probe("file", inspect.getfile, f)
            probe("source", lambda f: inspect.getsource(f)[:20], f)
            probe("unwrap", lambda f: inspect.unwrap(f) is inspect.unwrap(inspect.unwrap(f)), f)
            show(" copies", pickle.loads(pickle.dumps(f)) is f, copy.deepcopy(f) is f,
                 copy.copy(f) is f)

        class Config:
            make = torch.zeros
            hot = F.one_hot
        show("class attribute", Config().make(2), Config.hot(torch.tensor([0, 1])).tolist())
        show("partial", pickle.loads(pickle.dumps(functools.partial(torch.zeros, 3)))())
        show(F.one_hot is torch._C._nn.one_hot)
        x = torch.arange(4.)
        show(x.to.__name__, x.to.__module__, type(x).__name__, x.to(torch.float64).dtype)
        cpu = torch.device("cpu")
        show(isinstance(x, torch.Tensor), type(x) is torch.Tensor,
             type(cpu) is torch.device, isinstance(cpu, torch.device))
        show(type(torch.Tensor.data).__name__, torch.Tensor.data.__name__,
             inspect.isdatadescriptor(torch.Tensor.device), torch.Tensor.device.__objclass__)
        """)


def test_tensors_modules_optimizers_save_and_copy_as_plainly(tmp_path, capfd):
    assert_same(tmp_path, capfd, """
        import copy, io, pickle
        import torch

        def show(*a):
            print("|", *a)

        torch.manual_seed(0)
        m = torch.nn.Linear(2, 2)
        opt = torch.optim.Adam(m.parameters(), lr=0.1)
        m(torch.ones(1, 2)).sum().backward()
        opt.step()
        x = torch.arange(4.)
        buf = io.BytesIO()
        torch.save({"m": m.state_dict(), "o": opt.state_dict(), "x": x, "fn": torch.zeros,
                    "mod": m}, buf)
        buf.seek(0)
        loaded = torch.load(buf, weights_only=False)
        show(sorted(loaded), loaded["fn"] is torch.zeros, loaded["x"].tolist(),
             type(loaded["mod"]).__name__, sorted(loaded["m"]), loaded["o"]["state"][0]["step"])
        show(pickle.loads(pickle.dumps(m)).weight.tolist() == m.weight.tolist(),
             copy.deepcopy(opt).state_dict()["param_groups"][0]["lr"])
        show(copy.deepcopy(x).tolist(), pickle.loads(pickle.dumps(x)).tolist(),
             copy.deepcopy(m).weight.tolist() == m.weight.tolist())
        """)


FACTORIES_OF_0D = """
    import torch

    w = torch.arange(10.)
    dev = "cuda" if torch.cuda.is_available() else "cpu"
    a = torch.Tensor([w[:k].sum() for k in (2, 5)])
    t0, t1 = torch.tensor(1.5, device=dev), torch.tensor(2.5, device=dev)
    b = torch.tensor([t0, t1], device=dev)
    c = torch.tensor([w[1], w[2]])
    d = torch.as_tensor([w[3], 4.0], device=dev)
    print("|", a.tolist(), b.tolist(), c.tolist(), d.tolist())
    print("|", torch.Tensor([w[0], w[1]]).tolist())
    """


def test_factories_take_lists_of_0d_tensors(tmp_path, capfd):
    """Tensor.__getitem__'s layer must not make a 0-d tensor a sequence (len() of a 0-d
    tensor), during the scan or after it."""
    assert_same(tmp_path, capfd, FACTORIES_OF_0D)


def test_a_list_of_device_scalars_is_read_element_by_element(tmp_path):
    """tensor_new.cpp stores each element of `data` with float(t): one read per device tensor,
    then one blocking copy of the result up."""
    from gpusync.scan import run_scan

    path = tmp_path / "x.py"
    path.write_text(textwrap.dedent(FACTORIES_OF_0D))
    result = run_scan(str(path), mode="simulate", warmup=0)
    assert result.error is None, result.traceback
    sites = {(s.line, s.op): s.count for s in result.report.sites}
    assert sites[(8, "float()")] == 2 and sites[(8, "H2D copy (torch.tensor)")] == 1
    assert (10, "float()") not in sites  # host scalars: read on the host
    assert sites[(10, "H2D copy (torch.tensor)")] == 1


def test_len_of_a_0d_tensor_still_fails_after_a_watch_block():
    import pytest
    import torch

    import gpusync

    w = torch.arange(3.)
    with gpusync.watch(mode="simulate"):
        assert torch.Tensor([w[0], w[1]]).tolist() == [0.0, 1.0]
    assert torch.Tensor([w[0], w[1]]).tolist() == [0.0, 1.0]
    with pytest.raises(TypeError, match="0-d"):
        len(w[0])


def test_a_background_thread_gets_the_virtual_device(tmp_path, capfd):
    """Placement and residency in another thread are the scanned thread's: its tensors are on
    the device the script chose (on a CPU build, real torch would refuse "cuda")."""
    assert_same(tmp_path, capfd, """
        import queue, threading
        import torch

        dev = "cuda" if torch.cuda.is_available() else "cpu"
        out = queue.Queue()

        def work():
            x = torch.arange(4.).to(dev)
            z = torch.zeros(2, device=dev)
            with torch.device(dev):
                y = torch.ones(2)
            out.put((x, z, y, x.device.type == dev, z.is_cuda == (dev == "cuda"),
                     y.device.type == dev, x.sum().item()))

        t = threading.Thread(target=work)
        t.start()
        t.join()
        x, z, y, *facts = out.get()
        print("|", facts, x.device.type == dev, (x * 2).tolist(), z.tolist(), y.tolist())
        """)


def test_another_threads_syncs_are_not_the_steps(tmp_path):
    from gpusync.scan import run_scan

    path = tmp_path / "x.py"
    path.write_text(textwrap.dedent("""
        import threading
        import torch

        def work():
            x = torch.arange(4.).to("cuda")
            x.sum().item()
            torch.cuda.synchronize()

        t = threading.Thread(target=work)
        t.start()
        t.join()
        y = torch.arange(4.).to("cuda")
        print(y.sum().item())
        """))
    result = run_scan(str(path), mode="simulate", warmup=0)
    assert result.error is None, result.traceback
    assert {(s.line, s.op) for s in result.report.sites} == {(13, "H2D copy"), (14, "item")}


def test_a_torch_function_subclass_sees_what_it_sees_plainly(tmp_path, capfd):
    """The subclass sees `to` with the arguments given (no clone, no getter gpusync reads)."""
    assert_same(tmp_path, capfd, """
        import torch
        from torch.overrides import TorchFunctionMode

        seen = []

        class Logged(torch.Tensor):
            @classmethod
            def __torch_function__(cls, func, types, args=(), kwargs=None):
                seen.append((func.__name__, [str(a) for a in args[1:]]))
                return super().__torch_function__(func, types, args, kwargs or {})

        class Mode(TorchFunctionMode):
            def __torch_function__(self, func, types, args=(), kwargs=None):
                seen.append(("mode " + func.__name__, sorted(kwargs or {})))
                return func(*args, **(kwargs or {}))

        dev = "cuda" if torch.cuda.is_available() else "cpu"
        x = torch.arange(4.).as_subclass(Logged)
        seen.clear()
        y = x.to(dev)
        z = y.to(dev)
        w = x.to(torch.float64)
        print("|", [s for s in seen if s[0] != "to"], type(y).__name__, z is y,
              type(w).__name__, (y is x) == (dev == "cpu"))
        seen.clear()
        c = y.cpu()
        print("|", seen, (c is y) == (dev == "cpu"), c.tolist())
        seen.clear()
        with Mode():
            a = torch.zeros(2, device=dev)
            b = a.to(torch.float64)
        print("|", [(n, [k for k in ks if k != "device"]) for n, ks in seen], b.tolist())
        """)


def test_torch_compile_returns_what_it_returns_on_a_gpu(tmp_path, capfd):
    """An OptimizedModule (state_dict keys `_orig_mod.`), a function wrapper: run eagerly."""
    assert_same(tmp_path, capfd, """
        import io
        import torch

        torch.manual_seed(0)
        dev = "cuda" if torch.cuda.is_available() else "cpu"
        m = torch.nn.Sequential(torch.nn.Linear(2, 3), torch.nn.ReLU()).to(dev)
        cm = torch.compile(m)
        print("|", type(cm).__name__, cm._orig_mod is m, cm._orig_mod[0] is m[0], cm.training,
              isinstance(cm, torch._dynamo.eval_frame.OptimizedModule))
        print("|", list(cm.state_dict()))
        x = torch.ones(1, 2, device=dev)
        print("|", cm(x).tolist() == m(x).tolist())

        def f(a):
            return a * 2

        g = torch.compile(f)
        h = torch.compile(mode="max-autotune")(f)
        print("|", g.__name__, g is f, g._torchdynamo_orig_callable is f, g(x).tolist(),
              h(x).tolist())
        buf = io.BytesIO()
        torch.save(cm.state_dict(), buf)
        buf.seek(0)
        print("|", sorted(torch.load(buf)))
        m.compile()
        print("|", m(x).shape)
        """)


def test_jit_load_onto_the_device(tmp_path, capfd):
    assert_same(tmp_path, capfd, """
        import io
        import torch

        torch.manual_seed(0)
        dev = "cuda" if torch.cuda.is_available() else "cpu"
        m = torch.jit.script(torch.nn.Linear(2, 3))
        buf = io.BytesIO()
        torch.jit.save(m, buf)
        buf.seek(0)
        n = torch.jit.load(buf, map_location=dev)
        x = torch.ones(1, 2, device=dev)
        print("|", type(n).__name__, n.weight.device.type == dev,
              n(x).tolist() == m.to(dev)(x).tolist(), sorted(n.state_dict()))
        """)


def test_jit_load_counts_one_copy_per_storage(tmp_path):
    from gpusync.scan import run_scan

    path = tmp_path / "x.py"
    path.write_text(textwrap.dedent("""
        import io
        import torch

        buf = io.BytesIO()
        torch.jit.save(torch.jit.script(torch.nn.Linear(2, 3)), buf)
        buf.seek(0)
        n = torch.jit.load(buf, map_location="cuda")
        print(n.weight.is_cuda)
        """))
    result = run_scan(str(path), mode="simulate", warmup=0)
    assert result.error is None, result.traceback
    assert {(s.line, s.op): s.count for s in result.report.sites} == {(8, "H2D copy"): 2}


NESTED = """
    import sys
    import torch
    import gpusync

    x = torch.ones(3)

    def work():
        y = x.to("cuda")
        torch.cuda.synchronize()
        return y.sum().item(), y.tolist()

    work()
    if sys.argv[1:] == ["nested"]:
        with gpusync.watch() as w:
            work()
        print(sorted((s.line, s.op, s.count) for s in w.report().sites))
    else:
        work()
    """


def test_a_scripts_own_watch_block_changes_nothing_in_the_scan(tmp_path):
    """A scanned script that uses `with gpusync.watch():` itself: the scan reports what it
    reports without it (the block runs on the same virtual device and sees the same syncs)."""
    from gpusync.scan import run_scan

    path = tmp_path / "x.py"
    path.write_text(textwrap.dedent(NESTED))
    plain = run_scan(str(path), mode="simulate", warmup=0)
    nested = run_scan(str(path), mode="simulate", warmup=0, script_args=("nested",))
    assert plain.error is None and nested.error is None, nested.traceback
    sites = {(s.line, s.op, s.count) for s in plain.report.sites}
    assert sites == {(9, "H2D copy", 2), (10, "cuda.synchronize", 2), (11, "item", 2),
                     (11, "tolist", 2)}
    assert {(s.line, s.op, s.count) for s in nested.report.sites} == sites
    assert plain.report.steps == nested.report.steps


def test_nested_watch_blocks_count_their_own_steps_and_share_syncs():
    import torch

    import gpusync
    from tests.unit.test_cleanup import global_state

    model = torch.nn.Linear(3, 1)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)

    def step():
        model(torch.randn(4, 3)).sum().backward()
        opt.step()
        opt.zero_grad()
        return model.weight.sum().item()

    before = global_state()
    with gpusync.watch(mode="simulate") as outer:
        step()
        with gpusync.watch(mode="simulate") as inner:
            step()
            torch.ones(2).tolist()
        step()
    assert global_state() == before
    assert outer.report().steps == 3 and inner.report().steps == 1
    assert [e.op for e in inner.events] == ["item"]
    assert [e.op for e in outer.events] == ["item"] * 3


def test_a_watch_block_entered_twice_says_so_and_leaves_torch_clean():
    import pytest

    import gpusync
    from gpusync.errors import GpusyncError
    from tests.unit.test_cleanup import global_state, train_step

    before = global_state()
    w = gpusync.watch(mode="simulate")
    with w:
        with pytest.raises(GpusyncError, match="entered already"):
            with w:
                pass
        train_step()
    assert global_state() == before
    with pytest.raises(GpusyncError, match="entered already"):
        with w:
            pass
    assert global_state() == before
    assert w.report().steps == 1


def test_wrappers_are_torchscript_builtins_only_while_installed():
    import torch
    from torch.jit._builtins import _find_builtin

    import gpusync

    with gpusync.watch(mode="simulate"):
        wrapper = torch.zeros
        assert wrapper is not torch._C._VariableFunctions.zeros
        assert _find_builtin(wrapper) == "aten::zeros"

        @torch.jit.script
        def f(n: int) -> torch.Tensor:
            return torch.zeros(n) + torch.tensor([1.0]).sum()

        assert f(2).tolist() == [1.0, 1.0]
    assert torch.zeros is torch._C._VariableFunctions.zeros
    assert _find_builtin(wrapper) is None
    assert _find_builtin(torch.zeros) == "aten::zeros"


def test_a_bare_device_index_is_the_virtual_gpu(tmp_path, capfd):
    """torch.device(0) reads as cuda:0 under the scan, as on a one-GPU build (a CPU build has no
    accelerator to resolve it against); a lone int only: other spellings are torch's own."""
    plain = assert_same(tmp_path, capfd, """
        import torch

        dev = torch.device(0) if torch.cuda.is_available() else torch.device("cpu")
        x = torch.arange(4.0).to(dev)
        print("|", (x * 2).sum().item(), type(dev) is torch.device, dev.type in ("cpu", "cuda"))
        print("|", torch.device("cpu"), torch.device("cuda", 1), torch.device(type="cuda"))
        for bad in (-1, "bogus"):
            try:
                torch.device(bad)
            except RuntimeError as e:
                print("|", bad, str(e).split(",")[0][:40])
        """)
    assert plain[0] == "| 12.0 True True"


def test_a_bare_device_index_fails_again_after_the_scan(tmp_path):
    import pytest
    import torch

    from gpusync.detect.session import Session

    def bare() -> str:
        try:
            return repr(torch.device(0))
        except RuntimeError as e:  # a CPU build: no accelerator to give the index to
            return f"RuntimeError: {e}"

    before = bare()
    with Session(mode="simulate", virtual_cuda=True, auto_steps=False):
        assert torch.device(1) == torch.device("cuda", 1)
    assert bare() == before
    if torch.version.cuda is None:
        with pytest.raises(RuntimeError):
            torch.device(0)


def test_activation_checkpointing_recomputes_where_forward_saved(tmp_path, capfd):
    """Non-reentrant checkpointing compares the device of each tensor autograd saved in forward
    with the recomputed one's (a mismatch raises CheckpointError): a saved-tensor hook is handed
    tensors of the op in flight that the C++ observer places only when the op ends, or never
    inside an opaque op like scaled_dot_product_attention (observer.cpp place_packed). A
    Parameter moved to the device leaves its host alias on the host, as on CUDA."""
    assert_same(tmp_path, capfd, """
        import torch
        from torch.utils.checkpoint import checkpoint

        dev = "cuda" if torch.cuda.is_available() else "cpu"
        torch.manual_seed(0)
        block = torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.LayerNorm(8),
                                    torch.nn.GELU())
        w = torch.randn(8, 8)
        block[0].weight = torch.nn.Parameter(w)
        block.to(dev)
        opt = torch.optim.SGD(block.parameters(), lr=0.1)
        attention = torch.nn.functional.scaled_dot_product_attention
        seen = []

        def pack(t):
            seen.append(t.device.type == torch.device(dev).type)
            return t

        for step in range(3):
            x = torch.randn(4, 8, device=dev, requires_grad=True)
            y = checkpoint(block, x, use_reentrant=False)
            q = torch.randn(2, 2, 4, 8, device=dev, requires_grad=True)
            z = checkpoint(attention, q, q, q, use_reentrant=False)
            (y.sum() + z.sum()).backward()
            opt.step()
            opt.zero_grad()
            with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
                torch.nn.functional.layer_norm(x, (8,), block[1].weight).sum()
            print("|", step, round(y.sum().item(), 4), all(seen), w.device.type,
                  round(w.sum().item(), 4))
        """)
