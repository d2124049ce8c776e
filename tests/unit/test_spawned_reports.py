"""What spawned children wrote, read back typed (gpusync/_spawned.py): each child's sites join
the report marked with its Process, a child killed before its report is named by its pid."""
import json

from gpusync import _spawned
from gpusync.detect.events import Frame, SyncEvent
from gpusync.detect.session import NOTHING_ON_GPU
from gpusync.report import Process, build_report


def _child_report(*lines):
    events = [SyncEvent(op="item", frames=(Frame("/w/train.py", line, "work"),), step=0)
              for line in lines]
    return build_report(events, steps=1, warmup=0, mode="simulate", virtual_cuda=True)


def test_children_are_read_typed_and_their_sites_marked_with_their_process(tmp_path):
    synced = _child_report(7, 7, 9)
    (tmp_path / "41.json").write_text(json.dumps(
        {"pid": 41, "name": "SpawnProcess-2", "report": synced.encode()}))
    (tmp_path / "40.json").write_text(json.dumps({"pid": 40, "name": None, "report": None}))
    (tmp_path / "42.json").write_text("{not json")  # unreadable: left out
    children = _spawned.read(str(tmp_path))
    assert [c.process for c in children] == [Process(40), Process(41, "SpawnProcess-2")]
    assert children[1].report == synced
    sites = _spawned.sites(children)
    assert [(s.line, s.count, s.process) for s in sites] == [
        (7, 2, Process(41, "SpawnProcess-2")), (9, 1, Process(41, "SpawnProcess-2"))]
    assert sites[0].key.process == "SpawnProcess-2"  # its key has the name, not the pid
    notes = _spawned.notes(children)
    assert notes[0].startswith("spawned process pid 41 (SpawnProcess-2) ran on the virtual "
                               "CUDA device: 3 syncs/step over 1 step(s) of its own (max 3): "
                               "item at /w/train.py:7 x2, item at /w/train.py:9 x1;")
    assert notes[1] == ("spawned process(es) pid 40 ran on the virtual CUDA device and ended "
                        "before saying what they synced")
    assert _spawned.placed(children)


def test_a_child_that_placed_nothing_on_the_device_keeps_the_note():
    quiet = build_report([], steps=1, warmup=0, mode="simulate", notes=[NOTHING_ON_GPU])
    child = _spawned.Spawned(Process(5, "SpawnProcess-1"), quiet)
    assert not _spawned.placed([child])
    assert _spawned.notes([child]) == ["spawned process(es) pid 5 (SpawnProcess-1) ran on the "
                                       "virtual CUDA device and made no syncs"]


def test_a_device_tensor_handed_to_a_child_arrives_on_the_device(tmp_path):
    """A model moved to the GPU and handed to mp.Process (pytorch/examples' mnist_hogwild)
    reaches the child through CUDA IPC, on the device; a shared host tensor stays on the host.
    Pickled here as multiprocessing pickles for a child, and rebuilt in this process's
    session as the child's would be; torch's reducers are back after."""
    from multiprocessing.reduction import ForkingPickler

    import torch

    from gpusync.detect.session import Session

    reducer = ForkingPickler._extra_reducers[torch.Tensor]
    with Session(mode="simulate", virtual_cuda=True):
        handle = _spawned.redirect(str(tmp_path))
        try:
            model = torch.nn.Linear(3, 2).to("cuda")
            back, host = ForkingPickler.loads(ForkingPickler.dumps((model, torch.ones(2))))
            assert back.weight.is_cuda and back.bias.is_cuda and not host.is_cuda
            assert back(torch.ones(1, 3, device="cuda")).is_cuda  # no device mismatch
        finally:
            handle.remove()
    assert ForkingPickler._extra_reducers[torch.Tensor] is reducer
    assert ForkingPickler._extra_reducers[torch.nn.Parameter] is reducer
