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
