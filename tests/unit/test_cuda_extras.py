"""CudaExtras' patching, on stand-in objects (no GPU needed): every patch is undone exactly,
inherited attributes included, and other host threads are not reported."""
import threading
import types

from gpusync.detect.cuda import CudaExtras
from gpusync.detect.phases import PhaseTracker
from gpusync.detect.recorder import Recorder


class Base:
    def synchronize(self):
        return "base"


class Child(Base):
    pass


def test_patches_are_undone_exactly_and_record_only_the_owner_thread():
    module = types.SimpleNamespace(synchronize=lambda: "module")
    rec = Recorder(PhaseTracker())
    extras = CudaExtras(rec, detector=None)
    extras._owner = threading.get_ident()
    extras._handles = [extras._patch(module, "synchronize", "cuda.synchronize"),
                       extras._patch(Child, "synchronize", "Event.synchronize")]
    assert "synchronize" in vars(Child)
    assert module.synchronize() == "module" and Child().synchronize() == "base"
    assert [e.op for e in rec.events] == ["cuda.synchronize", "Event.synchronize"]
    assert rec.events[0].stall_ms is not None
    other = threading.Thread(target=Child().synchronize)
    other.start()
    other.join()
    assert len(rec.events) == 2  # a helper thread waiting does not stall the training loop
    extras.uninstall()
    assert "synchronize" not in vars(Child) and module.synchronize() == "module"


class _SyncingStream:
    """A stand-in for torch.cuda.Stream under sync-debug mode "warn": its synchronize warns
    from inside the C++ call, as c10/cuda's stream_synchronize does (warn_or_error_on_sync)."""

    def synchronize(self):
        import warnings

        warnings.warn("called a synchronizing CUDA operation", UserWarning, stacklevel=1)


class _Detector:
    in_backward = False

    def __init__(self, rec):
        self.rec = rec

    def record(self, label):
        self.rec.record(label)


def test_an_explicit_wait_caught_by_sync_debug_mode_too_is_reported_once():
    """--mode cuda: Stream.synchronize is patched (sync-debug mode's net is only for syncs no
    rule explains) and sync-debug mode warns for it as well: one sync, one event."""
    import warnings

    from gpusync.detect import patches

    rec = Recorder(PhaseTracker())
    extras = CudaExtras(rec, detector=_Detector(rec))
    extras._owner = threading.get_ident()
    with warnings.catch_warnings():
        warnings.simplefilter("always")
        extras._handles = [patches.add_layer(warnings, "showwarning", extras._showwarning),
                           extras._patch(_SyncingStream, "synchronize", "Stream.synchronize")]
        try:
            _SyncingStream().synchronize()
            assert [e.op for e in rec.events] == ["Stream.synchronize"]
            warnings.warn("called a synchronizing CUDA operation", UserWarning, stacklevel=1)
            assert [e.op for e in rec.events] == ["Stream.synchronize", "sync"]  # unexplained
        finally:
            extras.uninstall()
    assert "synchronize" in vars(_SyncingStream)  # its own method, put back


SYNC_WARNING = "called a synchronizing CUDA operation"


def test_a_sync_an_op_rule_recorded_is_not_reported_again_by_its_warning():
    """Torch hands an op's sync-debug warning to Python when the op's binding returns, after
    the op's rule recorded it at the same user line (`.item()`, then its D2H copy's warning):
    one sync, one event. Seen on an H200: every rule-recorded site came twice before, once as
    its op, once as "sync"."""
    import functools
    import warnings

    from gpusync.detect import patches

    rec = Recorder(PhaseTracker())
    extras = CudaExtras(rec, detector=_Detector(rec))
    extras._owner = threading.get_ident()
    item = functools.partial(rec.record, "item")  # the op's rule, from C++ (no frame of its own)
    warn = functools.partial(warnings.warn, SYNC_WARNING, UserWarning, 1)
    with warnings.catch_warnings():
        warnings.simplefilter("always")
        extras._handles = [patches.add_layer(warnings, "showwarning", extras._showwarning)]
        try:
            for call in (item, warn, item, warn):
                call()  # one line: the rule's and the warning's user frames are the same
            assert [e.op for e in rec.events] == ["item", "item"]
            warn()  # a sync no rule explains, on another line: the net catches it
            assert [e.op for e in rec.events] == ["item", "item", "sync"]
            warn()  # the same again: a "sync" explains nothing
            assert [e.op for e in rec.events] == ["item", "item", "sync", "sync"]
        finally:
            extras.uninstall()


def test_the_stall_timers_own_drain_is_not_a_sync_of_its_own():
    """--mode cuda times a sync's stall by draining the stream (StallTimer) just before the op
    runs; that drain calls the patched Stream.synchronize, which must not record itself."""
    from gpusync.detect.ops import OpDetector
    from gpusync.detect.residency_strategy import strategy_for

    rec = Recorder(PhaseTracker())
    extras = CudaExtras(rec, detector=None)
    extras._owner = threading.get_ident()
    extras._handles = [extras._patch(Child, "synchronize", "Stream.synchronize")]
    try:
        detector = OpDetector(rec, strategy_for(True, False),
                              stall_timer=lambda: float(Child().synchronize() == "base"))
        assert detector.record("item")
        assert [(e.op, e.stall_ms) for e in rec.events] == [("item", 1.0)]
    finally:
        extras.uninstall()
