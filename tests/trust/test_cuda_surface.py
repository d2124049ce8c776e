"""torch.cuda's whole public surface on the virtual CUDA device, generated from the installed
torch: every public callable of torch.cuda and its submodules is reachable under each of its
names, has torch's own signature, runs with torch's arguments given positionally and by
keyword (answered, or torch's own Python on the answers), or stops with gpusync's one-line
message naming the call (refused). A name of a newer torch that gpusync does not classify
fails here (gpusync/detect/virtual_surface.py)."""
import importlib
import inspect
import pkgutil
import types

import pytest
import torch

from gpusync.detect import virtual_answers, virtual_surface, virtual_typed
from gpusync.detect.session import Session
from gpusync.detect.virtual_device import DEVICE
from gpusync.errors import VirtualDeviceUnsupported

pytestmark = pytest.mark.skipif(torch.cuda.is_available(), reason="checks the CPU-only build")

# documented, though outside the module's __all__ (torch/cuda/jiterator.py: `__all__ = []`)
DOCUMENTED = {"torch.cuda.jiterator": ("_create_jit_fn", "_create_multi_output_jit_fn")}


def _walk() -> dict[str, list[tuple[str, str]]]:
    """{where a callable is defined (torch. left off): every (module, name) it is public as}."""
    modules = ["torch.cuda"] + [
        m.name for m in pkgutil.walk_packages(torch.cuda.__path__, "torch.cuda.")
        if not any(part.startswith("_") for part in m.name.split(".")[2:])]
    out: dict[str, list[tuple[str, str]]] = {}
    for module_name in modules:
        module = importlib.import_module(module_name)
        names = getattr(module, "__all__", None)
        if names is None:
            names = [n for n in vars(module) if not n.startswith("_")]
        for name in [*names, *DOCUMENTED.get(module_name, ())]:
            value = getattr(module, name)
            if callable(value) and not isinstance(value, types.ModuleType):
                key = f"{value.__module__}.{value.__qualname__}".removeprefix("torch.")
                out.setdefault(key, []).append((module_name, name))
    return out


SURFACE = _walk()
STORAGES = {k for k in SURFACE if k.startswith("cuda.") and k.endswith("Storage")}
TYPED = set(virtual_typed.stand_ins())
CLASSES = {
    "answered": set(virtual_answers.CUDA),
    "native": set(virtual_surface.NATIVE),
    "refused": set(virtual_surface.REFUSED) | STORAGES | {k for k in TYPED if ".sparse." in k},
    "swapped": set(virtual_surface.SWAPPED) | {k for k in TYPED if ".sparse." not in k},
}


def _kind(key: str) -> str:
    kinds = [kind for kind, keys in CLASSES.items() if key in keys]
    assert len(kinds) == 1, f"{key} is classified as {kinds or 'nothing'}"
    return kinds[0]


def scan():
    return Session(mode="simulate", virtual_cuda=True)


def test_every_public_callable_is_classified_once():
    missing = sorted(k for k in SURFACE if not any(k in keys for keys in CLASSES.values()))
    assert not missing, f"torch.cuda callables gpusync does not classify: {missing}"
    for key in SURFACE:
        _kind(key)


def test_every_classified_name_is_in_the_installed_torch():
    """Stale entries are not kept: each table's key names a callable of this torch (the
    answered ones may be private: _lazy_init, _exchange_device)."""
    public = set(SURFACE)
    for kind, keys in CLASSES.items():
        for key in keys:
            owner, name = virtual_surface._resolve(key)
            assert callable(getattr(owner, name, None)), key
            if kind != "answered":
                assert key in public, f"{key} ({kind}) is not public in this torch"


def _object(module: str, name: str):
    return getattr(importlib.import_module(module), name)


# An argument for each required parameter of the surface (by its name), made inside a scan.
ARGS = {
    "device": lambda: 0, "peer_device": lambda: 0, "stream": lambda: torch.cuda.Stream(),
    "stream_ptr": lambda: 0, "data_ptr": lambda: 0, "seed": lambda: 1,
    "new_state": lambda: torch.cuda.get_rng_state(),
    "new_states": lambda: torch.cuda.get_rng_state_all(), "debug_mode": lambda: "default",
    "fraction": lambda: 0.5, "msg": lambda: "step", "range_id": lambda: 1, "res": lambda: 0,
    "code": lambda: 1, "obj": lambda: torch.ones(1, device="cuda"), "bwd": lambda: _identity,
    "filename": lambda: "tunableop_results.csv", "duration": lambda: 10,
    "iterations": lambda: 10, "buffer_size": lambda: 0, "enable": lambda: False,
    "tensor": lambda: torch.ones(4, device="cuda"),
    "tensors": lambda: [torch.ones(4, device="cuda")],
    "code_string": lambda: "template <typename T> T neg(T x) { return -x; }",
    "num_outputs": lambda: 1,
}


# Optional arguments without which torch's own function fails on a GPU too
VALID = {"nn.parallel.comm.scatter": {"devices": [0]}}


def _identity(*args):
    return args


def _required(signature: inspect.Signature) -> list[inspect.Parameter]:
    return [p for p in signature.parameters.values() if p.default is p.empty
            and p.kind not in (p.VAR_POSITIONAL, p.VAR_KEYWORD)]


def _calls(fn) -> list[tuple[tuple, dict]]:
    """(args, kwargs): the required arguments positionally, then by keyword where a
    parameter may be given so (each a fresh value)."""
    signature = _signature(fn)
    if signature is None:  # a C type (an exception class): torch's own, called plainly
        return [((), {})]
    required = _required(signature)
    unknown = [p.name for p in required if p.name not in ARGS]
    assert not unknown, f"no test argument for {unknown}: add them to ARGS"
    positional = tuple(ARGS[p.name]() for p in required if p.kind != p.KEYWORD_ONLY)
    keyword_only = {p.name: ARGS[p.name]() for p in required if p.kind == p.KEYWORD_ONLY}
    by_keyword = {p.name: ARGS[p.name]() for p in required if p.kind != p.POSITIONAL_ONLY}
    by_position_only = tuple(ARGS[p.name]() for p in required if p.kind == p.POSITIONAL_ONLY)
    return [(positional, keyword_only), (by_position_only, by_keyword)]


def _params(signature: inspect.Signature) -> list[tuple]:
    return [(p.name, p.kind, p.default) for p in signature.parameters.values()]


def _signature(fn):
    try:
        return inspect.signature(fn)
    except (TypeError, ValueError):  # a C type without one (torch.cuda.FloatTensor)
        return None


@pytest.mark.parametrize("key", sorted(SURFACE))
def test_reachable_under_every_name_with_torchs_signature(key):
    places = SURFACE[key]
    originals = {place: _object(*place) for place in places}
    signature = _signature(originals[places[0]])
    kind = _kind(key)
    with scan():
        objects = {place: _object(*place) for place in places}
        first = objects[places[0]]
        assert all(obj is first for obj in objects.values()), "one object under every name"
        module, name = places[-1]
        scope: dict = {}
        exec(f"from {module} import {name} as imported", scope)
        assert scope["imported"] is first
        if kind == "native" or (kind == "refused" and key not in TYPED
                                 and isinstance(originals[places[0]], type)):
            assert first is originals[places[0]], "torch's own (a refused class refuses in __new__)"
        else:
            assert first is not originals[places[0]], "the virtual device's"
        if signature is not None and kind != "swapped":
            assert inspect.signature(first) == signature
        elif signature is not None:  # a stand-in class: torch's parameters
            assert _params(inspect.signature(first)) == _params(signature)
    assert {place: _object(*place) for place in places} == originals, "all put back"


@pytest.mark.parametrize("key", sorted(k for k in SURFACE if _kind(k) in ("answered", "native",
                                                                           "swapped")))
def test_runs_with_torchs_arguments_positionally_and_by_keyword(key):
    with scan():
        fn = _object(*SURFACE[key][0])
        if key in TYPED:  # a typed tensor class: torch's legacy forms
            assert fn(2, 3).shape == (2, 3)
            assert fn([1, 0]).tolist() == torch.tensor([1, 0], dtype=fn.dtype).tolist()
            return
        for args, kwargs in _calls(fn):
            fn(*args, **{**kwargs, **VALID.get(key, {})})


@pytest.mark.parametrize("key", sorted(k for k in SURFACE if _kind(k) == "refused"))
def test_refused_with_gpusyncs_message_naming_the_call(key):
    module, name = SURFACE[key][0]
    with scan():
        fn = _object(module, name)
        with pytest.raises(VirtualDeviceUnsupported) as raised:
            fn()
    message = str(raised.value)
    assert message.startswith("gpusync: torch.cuda.") and name in message.split(" ")[1]
    assert "cannot run on the virtual CUDA device (no GPU): " in message


def test_swapped_classes_have_torchs_public_methods():
    for key, stand_in in virtual_surface.SWAPPED.items():
        original = _object(*SURFACE[key][0])
        wanted = {n for n in dir(original) if not n.startswith("_")}
        assert wanted <= set(dir(stand_in)), f"{key} lacks {wanted - set(dir(stand_in))}"
        for name in wanted:
            theirs, ours = _signature(getattr(original, name)), _signature(getattr(stand_in, name))
            if theirs is not None and callable(getattr(original, name)):
                assert [p.name for p in ours.parameters.values()] == [
                    p.name for p in theirs.parameters.values()], f"{key}.{name}"


def _raised(call) -> str:
    """What calling `call` raises here, as "Type: message" ("" if nothing)."""
    try:
        call()
    except Exception as e:
        return f"{type(e).__name__}: {e}"
    return ""


def test_what_the_answers_are_as_on_a_one_gpu_cuda_build():
    # a CPU build: "Torch not compiled with CUDA enabled"; a CUDA one without a GPU: no driver
    seed_before = _raised(torch.cuda.initial_seed)
    assert seed_before
    with scan():
        state = torch.cuda.random.get_rng_state()
        assert (state.dtype, state.device, state.shape) == (torch.uint8, torch.device("cpu"),
                                                            (16,))
        torch.manual_seed(7)  # torch.random.manual_seed seeds every CUDA generator too
        assert torch.cuda.initial_seed() == 7
        assert [s.tolist() for s in torch.cuda.random.get_rng_state_all()] == [
            torch.cuda.get_rng_state().tolist()]
        torch.cuda.random.set_rng_state(state)
        assert torch.cuda.initial_seed() == DEVICE.seed
        with pytest.raises(TypeError, match="ByteTensor"):
            torch.cuda.set_rng_state(torch.zeros(16))
        stats = torch.cuda.memory_stats()
        assert stats["allocated_bytes.all.current"] == 0 and "num_ooms" in stats
        assert torch.cuda.memory_allocated() == 0 and torch.cuda.max_memory_reserved(0) == 0
        assert isinstance(torch.cuda.current_stream(), torch.cuda.Stream)
        assert isinstance(torch.cuda.Event(enable_timing=True), torch.cuda.streams.Event)
        with torch.cuda.device(0):
            assert torch.cuda.current_device() == 0
        legacy = torch.cuda.LongTensor([1, 2])
        assert legacy.is_cuda and isinstance(legacy, torch.cuda.LongTensor)
        assert not isinstance(torch.ones(1), torch.cuda.FloatTensor)
        assert torch.cuda.nvtx.range_push("a") == 0 and torch.cuda.nvtx.range_pop() == 0
        props = torch.cuda.get_device_properties(0)
        assert repr(props).startswith("_CudaDeviceProperties(name=")
        assert (props.major, props.minor) == torch.cuda.get_device_capability()
        assert torch.cuda.mem_get_info() == (props.total_memory, props.total_memory)
    assert torch.cuda.initial_seed  # torch's again: raises when called, as before the scan
    assert _raised(torch.cuda.initial_seed) == seed_before


def test_the_memory_history_guides_use_runs(tmp_path):
    """torch.cuda.memory._record_memory_history / _dump_snapshot (private, but what PyTorch's
    memory-profiling guide uses): torch's own Python, an empty snapshot written."""
    import pickle

    with scan():
        torch.cuda.memory._record_memory_history(max_entries=1000)
        torch.cuda.memory._dump_snapshot(str(tmp_path / "snapshot.pickle"))
        torch.cuda.memory._record_memory_history(enabled=None)
    snapshot = pickle.loads((tmp_path / "snapshot.pickle").read_bytes())
    assert snapshot["segments"] == []


def test_a_jiterator_function_is_made_as_on_a_gpu_and_refused_when_called():
    made_without_a_gpu = torch.cuda.jiterator._create_jit_fn(ARGS["code_string"]())
    with scan():
        with pytest.raises(AssertionError, match="Jiterator is only supported on CUDA"):
            made_without_a_gpu(torch.ones(2))  # torch's own verdict, given when it was made
        fn = torch.cuda.jiterator._create_jit_fn(ARGS["code_string"]())
        with pytest.raises(VirtualDeviceUnsupported, match=(
                r"^gpusync: a function made by torch.cuda.jiterator._create_jit_fn cannot run "
                r"on the virtual CUDA device \(no GPU\)")):
            fn(torch.ones(2, device="cuda"))


@pytest.mark.parametrize("key", sorted({**virtual_answers.CUDA, **virtual_answers.ACCELERATOR}))
def test_each_answer_takes_torchs_parameter_names(key):
    """An answer is called with torch's bound arguments by name: it must take exactly those
    (a parameter torch adds or renames fails here before a script meets it)."""
    owner, name = virtual_surface._resolve(key)
    answer = {**virtual_answers.CUDA, **virtual_answers.ACCELERATOR}[key]
    try:
        torchs = [p.name for p in inspect.signature(getattr(owner, name)).parameters.values()]
    except ValueError:  # a CUDA build's C function: the answer's own parameters bind
        pytest.skip(f"torch.{key} is a C function without a signature here")
    params = list(inspect.signature(answer).parameters.values())
    if [p.kind for p in params] == [inspect.Parameter.VAR_KEYWORD]:
        return  # an answer that is the same whatever the arguments (torch's bind checks them)
    assert [p.name for p in params] == torchs


def test_a_c_function_without_a_signature_is_bound_by_its_answers(monkeypatch):
    """A CUDA build binds torch.cuda._exchange_device to torch._C._cuda_exchangeDevice, which
    has no signature: the scan crashed at its start on an H200 (torch 2.11) and on any CUDA
    build without a GPU. Its answer's parameters bind instead."""
    builtin = torch._C._set_grad_enabled  # any C function without a signature stands in
    with pytest.raises(ValueError):
        inspect.signature(builtin)
    monkeypatch.setattr(torch.cuda, "_exchange_device", builtin)
    with scan():
        assert torch.cuda._exchange_device(0) == 0
        assert torch.cuda._exchange_device(device=-1) == -1
        with torch.cuda.device(0):
            assert torch.cuda.current_device() == 0
    assert torch.cuda._exchange_device is builtin


def test_a_callable_a_newer_torch_dropped_is_skipped_by_the_scan_not_fatal(monkeypatch):
    """This test file fails on a stale entry; a user's scan on that torch still runs."""
    for key in ("cuda.no_such_module.no_such_function", "cuda.random.no_such_function"):
        with pytest.raises((KeyError, AttributeError)):
            virtual_surface._resolve(key)
    monkeypatch.setitem(virtual_surface.REFUSED, "cuda.random.no_such_function", "gone")
    monkeypatch.setitem(virtual_answers.CUDA, "cuda.no_such_function", lambda: 0)
    with scan():
        assert torch.cuda.is_available()


def test_legacy_typed_casts_name_and_copy_as_on_cuda():
    """PyTorch-GAN's `imgs.type(torch.cuda.FloatTensor)`: a blocking copy up on CUDA, and the
    tensor then names its type torch.cuda.FloatTensor; a cast to a CPU type copies back."""
    with scan() as session:
        host = torch.ones(2)
        moved = host.type(torch.cuda.FloatTensor)
        assert moved.is_cuda and moved.type() == "torch.cuda.FloatTensor"
        assert moved.type(torch.cuda.FloatTensor) is moved  # already that type: no copy
        back = moved.type("torch.DoubleTensor")
        assert not back.is_cuda and back.dtype == torch.float64
        assert host.type() == "torch.FloatTensor" and moved.type(torch.float64).is_cuda
        assert [e.op for e in session.events] == ["H2D copy", "D2H copy"]


def test_a_cuda_default_tensor_type_makes_factories_place_on_the_device():
    """Old scripts' torch.set_default_tensor_type("torch.cuda.FloatTensor")."""
    try:
        with scan():
            torch.set_default_tensor_type("torch.cuda.FloatTensor")
            made = torch.zeros(2)
            assert made.is_cuda and made.type() == "torch.cuda.FloatTensor"
            torch.set_default_tensor_type(torch.FloatTensor)
            assert not torch.zeros(2).is_cuda
    finally:
        torch.set_default_device(None)
        torch.set_default_dtype(torch.float32)
