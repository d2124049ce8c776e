"""A stand-in for torch.cuda that runs the techniques' stream code on the CPU and reports the
stream races a CUDA run could have, in the spirit of PyTorch's CUDA sanitizer
(torch.cuda._sanitizer), which needs a GPU.

Model: each stream and the host is a timeline with a vector clock. Work runs at once on the CPU,
but every op is stamped with the timeline it would run on in a CUDA run: the current stream, or
the host for an op that touches only host buffers (`host_empty` and what host ops make from them).
An access races when an earlier conflicting access (one of the two a write) on another timeline
does not happen before it through wait_stream, wait_event, or a host-side event.synchronize /
query. Freeing device memory that another stream used, with no record_stream and no wait, is
reported too: the caching allocator would give it out again on the allocating stream.

Limits: all host threads share one timeline (ordering through queues is not seen, so host-host
races are missed); backward runs on the stream current at backward() (autograd runs each
backward op on its forward op's stream and syncs those itself, so frees inside backward are not
checked); same-device `.to()` copies
nothing on the CPU, so host-to-device copies are not seen.
"""
from __future__ import annotations

import contextlib
import threading
import weakref

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten

HOST = "host"


class _Clock(dict):
    def merge(self, other: dict) -> None:
        for k, v in other.items():
            if v > self.get(k, 0):
                self[k] = v


class FakeStream:
    def __init__(self, checker: "StreamChecker", name: str):
        self.checker, self.name = checker, name
        self.vc = _Clock()

    def _enqueue(self) -> None:
        self.vc.merge(self.checker.host)  # queued now: after all the host has seen

    def wait_stream(self, other: "FakeStream") -> None:
        with self.checker.lock:
            self._enqueue()
            self.vc.merge(other.vc)

    def wait_event(self, event: "FakeEvent") -> None:
        with self.checker.lock:
            self._enqueue()
            if event.vc is not None:
                self.vc.merge(event.vc)

    def synchronize(self) -> None:
        with self.checker.lock:
            self.checker.host.merge(self.vc)

    def __repr__(self):
        return f"<{self.name}>"


class FakeEvent:
    def __init__(self, checker: "StreamChecker"):
        self.checker = checker
        self.vc = None  # never recorded: complete, as in CUDA

    def record(self, stream: FakeStream | None = None) -> None:
        stream = stream if stream is not None else self.checker.current_stream()
        with self.checker.lock:
            stream._enqueue()
            self.vc = _Clock(stream.vc)

    def synchronize(self) -> None:
        with self.checker.lock:
            if self.vc is not None:
                self.checker.host.merge(self.vc)

    def query(self) -> bool:
        if not self.checker.events_complete:
            return False
        self.synchronize()
        return True


class _Entry:
    def __init__(self, alloc: str):
        self.alloc = alloc  # the timeline whose allocations may reuse this memory
        self.host = alloc == HOST
        self.last_write = None  # (timeline, clock, op)
        self.reads = {}  # timeline -> (clock, op), since the last write
        self.last_use = {}  # timeline -> clock
        self.recorded = set()  # streams named by record_stream


def _tensors(value):
    return [t for t in tree_flatten(value)[0] if isinstance(t, torch.Tensor)]


class _Accesses(TorchDispatchMode):
    def __init__(self, checker: "StreamChecker"):
        super().__init__()
        self.checker = checker

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        out = func(*args, **kwargs)
        self.checker._on_op(func, args, kwargs, out)
        return out


class StreamChecker:
    """The torch.cuda surface that gpusync.techniques.streams.Streams uses; a context manager
    that watches every op (also in threads started inside it) and collects `races`."""

    def __init__(self, events_complete: bool = True):
        self.lock = threading.RLock()
        self.events_complete = events_complete  # False: query() says "not yet"
        self.host = _Clock()
        self.default = FakeStream(self, "default stream")
        self._streams = {self.default.name: self.default}
        self._current = threading.local()
        self._entries: dict[int, _Entry] = {}
        self.races: list[str] = []
        self._exit = contextlib.ExitStack()

    # --- the torch.cuda surface -------------------------------------------------------------
    def Stream(self, device=None) -> FakeStream:  # noqa: N802 (torch.cuda's name)
        with self.lock:
            stream = FakeStream(self, f"stream {len(self._streams)}")
            self._streams[stream.name] = stream
            return stream

    def Event(self, enable_timing=False, blocking=False) -> FakeEvent:  # noqa: N802
        return FakeEvent(self)

    def current_stream(self, device=None) -> FakeStream:
        return getattr(self._current, "stream", self.default)

    @contextlib.contextmanager
    def stream(self, stream: FakeStream):
        previous = self.current_stream()
        self._current.stream = stream
        try:
            yield
        finally:
            self._current.stream = previous

    def record_stream(self, tensor: torch.Tensor, stream: FakeStream) -> None:
        with self.lock:
            self._entry(tensor, self.current_stream().name).recorded.add(stream.name)

    def host_empty(self, *size, dtype: torch.dtype) -> torch.Tensor:
        t = torch.empty(*size, dtype=dtype)
        with self.lock:
            self._fresh_entry(t.untyped_storage(), HOST)
        return t

    # --- watching ------------------------------------------------------------------------
    def __enter__(self) -> "StreamChecker":
        checker = self
        original_run = threading.Thread.run

        def run(thread):
            with _Accesses(checker):
                original_run(thread)

        threading.Thread.run = run
        self._exit.callback(setattr, threading.Thread, "run", original_run)
        self._exit.enter_context(_Accesses(self))
        return self

    def __exit__(self, *exc) -> None:
        self._exit.close()

    def _fresh_entry(self, storage, alloc: str) -> _Entry:
        ptr = storage.data_ptr()
        entry = _Entry(alloc)
        self._entries[ptr] = entry
        weakref.finalize(storage, self._freed, ptr, entry)
        return entry

    def _entry(self, tensor: torch.Tensor, timeline: str) -> _Entry | None:
        storage = tensor.untyped_storage()
        if storage.nbytes() == 0:
            return None
        entry = self._entries.get(storage.data_ptr())
        return entry if entry is not None else self._fresh_entry(storage, timeline)

    def _on_op(self, func, args, kwargs, out) -> None:
        schema = func._schema
        if any(r.alias_info is not None and not r.alias_info.is_write for r in schema.returns):
            return  # a view: metadata only
        named = dict(zip((a.name for a in schema.arguments), args, strict=False))
        named.update(kwargs)
        reads, writes = [], []
        for arg in schema.arguments:
            is_write = arg.alias_info is not None and arg.alias_info.is_write
            (writes if is_write else reads).extend(_tensors(named.get(arg.name)))
        inputs = reads + writes
        outs = out if isinstance(out, (tuple, list)) else (out,)
        for ret, value in zip(schema.returns, outs, strict=False):
            if ret.alias_info is None:
                writes.extend(_tensors(value))
        with self.lock:
            entries = [self._entries.get(t.untyped_storage().data_ptr()) for t in inputs]
            on_host = bool(inputs) and all(e is not None and e.host for e in entries)
            if on_host:
                timeline, vc = HOST, self.host
            else:
                stream = self.current_stream()
                stream._enqueue()
                timeline, vc = stream.name, stream.vc
            vc[timeline] = vc.get(timeline, 0) + 1
            name = str(func.overloadpacket.__name__)
            for t in reads:
                self._access(t, timeline, vc, False, name)
            for t in writes:
                self._access(t, timeline, vc, True, name)

    def _access(self, tensor, timeline, vc, write, op) -> None:
        entry = self._entry(tensor, timeline)
        if entry is None:
            return
        clock = vc[timeline]
        earlier = [entry.last_write] if entry.last_write else []
        if write:
            earlier += [(tl, c, o) for tl, (c, o) in entry.reads.items()]
        for tl, c, o in earlier:
            if tl != timeline and vc.get(tl, 0) < c:
                self.races.append(f"{op} on {timeline} {'writes' if write else 'reads'} memory "
                                  f"that {o} on {tl} may still be using")
        if timeline == HOST and write:
            entry.host = True
        if write:
            entry.last_write, entry.reads = (timeline, clock, op), {}
        else:
            entry.reads[timeline] = (clock, op)
        entry.last_use[timeline] = clock

    def _freed(self, ptr: int, entry: _Entry) -> None:
        with self.lock:
            if self._entries.get(ptr) is entry:
                del self._entries[ptr]
            if entry.host or torch._C._current_graph_task_id() != -1:
                # pinned host blocks are reused only after their copies' events; autograd
                # frees what backward used on each op's own stream (not modelled here)
                return
            reuse = _Clock(self._streams[entry.alloc].vc)
            reuse.merge(self.host)  # the next allocation on that stream is queued after now
            for tl, c in entry.last_use.items():
                if tl not in (entry.alloc, HOST) and tl not in entry.recorded \
                        and reuse.get(tl, 0) < c:
                    self.races.append(f"memory from {entry.alloc} freed while {tl} may still "
                                      f"use it (no record_stream)")
