"""dataloader.pin_memory: pin_memory=True on the DataLoader whose yielded tensors a line copies
and non_blocking=True on those copies, from what the run observed; refused where unsafe."""
import re
import textwrap

import pytest
import torch

from gpusync.remedies import Facts, Proposal, Refusal, dataloader
from gpusync.remedies.helpers.source import Source, apply, check
from gpusync.report import Site
from tests.unit.remedy_runs import candidate_run

pytestmark = pytest.mark.usefixtures("in_process")

PATH = "/w/train.py"
TRAIN = '''import torch
from torch.utils.data import DataLoader
loader = DataLoader(ds, batch_size=8)  # the training set
for x, y in loader:
    x, y = x.to(device), y.to(device)
    loss = model(x, y)
for x, y in loader:
    x = x.cuda()
'''


def end(text: str, line: int, call: str) -> list[int]:
    """[line, column] (UTF-8 bytes) where `call` ends on `line` of `text`."""
    row = text.splitlines()[line - 1]
    return [line, len(row[:row.index(call) + len(call)].encode())]


def facts_for(text: str, copies: dict[int, list], build=(3, "DataLoader(ds, batch_size=8)"),
              pinned=False, odd=(), path=PATH) -> Facts:
    """The facts a run notes: the DataLoader built at build[0], the copies `{line: [(call,
    yielded, non_blocking, direct)]}` of that line."""
    facts = Facts()
    b_end = end(text, *build)
    built = [path, build[0], *b_end]
    facts.note(dataloader.BUILD, {"end": b_end, "pin_memory": pinned, "direct": True},
               where=(path, build[0]))
    facts.note(dataloader.BATCH, {"end": b_end, "odd": list(odd)}, where=(path, build[0]))
    for line, calls in copies.items():
        for call, yielded, given, direct in calls:
            facts.note(dataloader.COPY, {"end": end(text, line, call),
                                         "built": built if yielded else None,
                                         "non_blocking": given, "direct": direct},
                       where=(PATH, line))
    return facts


def site(line: int, op: str = "H2D copy") -> Site:
    return Site(op=op, file=PATH, line=line, per_step=2.0, count=8, phase="other")


BOTH = {5: [("x.to(device)", True, False, True), ("y.to(device)", True, False, True)],
        8: [("x.cuda()", True, False, True)]}


def test_the_loader_pins_and_every_copy_of_its_batches_is_non_blocking():
    source = Source(PATH, TRAIN)
    facts = facts_for(TRAIN, BOTH)
    first = dataloader.PIN_MEMORY.propose(site(5), source, facts)
    assert isinstance(first, Proposal) and first.remedy == "dataloader.pin_memory"
    out = apply(TRAIN, list(first.edits))
    check(PATH, out)
    assert out == TRAIN.replace("batch_size=8)", "batch_size=8, "
                                "pin_memory=torch.cuda.is_available())").replace(
        "x.to(device), y.to(device)", "x.to(device, non_blocking=True), "
        "y.to(device, non_blocking=True)").replace("x.cuda()", "x.cuda(non_blocking=True)")
    assert "pin_memory=torch.cuda.is_available() on the DataLoader at line 3" in first.summary
    assert "at lines 5, 8" in first.summary
    other = dataloader.PIN_MEMORY.propose(site(8), source, facts)  # the same edits: one proposal
    assert isinstance(other, Proposal) and other.edits == first.edits


def test_a_loader_that_pins_already_gets_only_non_blocking_copies():
    facts = facts_for(TRAIN, BOTH, pinned=True)
    proposal = dataloader.PIN_MEMORY.propose(site(8), Source(PATH, TRAIN), facts)
    out = apply(TRAIN, list(proposal.edits))
    assert "pin_memory" not in out and out.count("non_blocking=True") == 3
    assert "pins its batches already" in proposal.summary


def test_copies_of_no_yielded_tensor_and_other_ops_are_not_its_kind():
    source = Source(PATH, TRAIN)
    facts = facts_for(TRAIN, {5: [("x.to(device)", False, False, True)]})
    assert dataloader.PIN_MEMORY.propose(site(5), source, facts) is None
    assert dataloader.PIN_MEMORY.propose(site(8), source, facts) is None  # nothing observed there
    assert dataloader.PIN_MEMORY.propose(site(5, "item"), source, facts_for(TRAIN, BOTH)) is None


@pytest.mark.parametrize("text, copies, build, odd, reason", [
    (TRAIN.replace("batch_size=8)", "batch_size=8, pin_memory=False)"), BOTH,
     (3, "DataLoader(ds, batch_size=8, pin_memory=False)"), (),
     "passes pin_memory=False itself: the script chose it"),
    (TRAIN.replace("batch_size=8)", "**cfg)"), BOTH, (3, "DataLoader(ds, **cfg)"), (),
     "takes **cfg: pin_memory may be among them"),
    (TRAIN, BOTH, (3, "DataLoader(ds, batch_size=8)"), ("Batch",),
     "hold Batch objects (its collate_fn's): pin_memory=True pins only the tensors in tuples"),
    (TRAIN.replace("y.to(device)", "y.to(device, non_blocking=False)"),
     {5: [("x.to(device)", True, False, True), ("y.to(device, non_blocking=False)", True,
                                                True, True)]},
     (3, "DataLoader(ds, batch_size=8)"), (),
     "y.to(device, non_blocking=False) at line 5 passes non_blocking itself: the script chose"),
    (TRAIN.replace("y.to(device)", "(y * 2).to(device)"),
     {5: [("x.to(device)", True, False, True), ("(y * 2).to(device)", False, False, True)]},
     (3, "DataLoader(ds, batch_size=8)"), (),
     "line 5 also copies (y * 2).to(device), a tensor no DataLoader yielded as is"),
    (TRAIN.replace("x, y = x.to(device), y.to(device)",
                   "x, y = [t.to(device) for t in (x, y * 2)]"),
     {5: [("t.to(device)", True, False, True), ("t.to(device)", False, False, True)]},
     (3, "DataLoader(ds, batch_size=8)"), (),
     "t.to(device) at line 5 also copies tensors no DataLoader yielded as is"),
    (TRAIN, {5: [("x.to(device)", True, False, False)]}, (3, "DataLoader(ds, batch_size=8)"),
     (), "x.to(device) at line 5 copies by library code it calls"),
    (TRAIN.replace("    loss = model(x, y)", "    y_gpu = y.to(device)\n    y.mul_(2)").replace(
        "x, y = x.to(device), y.to(device)", "x = x.to(device)"),
     {6: [("y.to(device)", True, False, True)]}, (3, "DataLoader(ds, batch_size=8)"), (),
     "y is changed in place at line 7, after it is copied at line 6"),
])
def test_refusals_say_why(text, copies, build, odd, reason):
    line = next(iter(copies))
    answer = dataloader.PIN_MEMORY.propose(site(line), Source(PATH, text),
                                facts_for(text, copies, build, odd=odd))
    assert isinstance(answer, Refusal) and reason in answer.reason, answer


def test_a_loader_built_in_another_file_is_refused():
    facts = facts_for(TRAIN, BOTH, path="/w/data.py")
    answer = dataloader.PIN_MEMORY.propose(site(5), Source(PATH, TRAIN), facts)
    assert isinstance(answer, Refusal)
    assert answer.reason == "the DataLoader is built in another file (/w/data.py:3)"


SCRIPT = textwrap.dedent('''
    import torch
    from torch.utils.data import DataLoader, TensorDataset

    torch.manual_seed(0)
    device = "cuda"
    ds = TensorDataset(torch.randn(32, 4), torch.randint(0, 3, (32,)))
    loader = DataLoader(ds, batch_size=8, shuffle=True)
    model = torch.nn.Linear(4, 3).to(device)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    for x, y in loader:
        scaled = (x * 2).to(device)
        x, y = x.to(device), y.to(device)
        loss = torch.nn.functional.cross_entropy(model(x + scaled), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
        print(round(loss.item(), 4))
''').lstrip()


def _run(path, sources=None, record=None):
    return candidate_run(path, steps=2, record=record, sources=sources, observe=sources is None)


def test_observed_and_proved_on_a_training_script(tmp_path):
    path = tmp_path / "train.py"
    path.write_text(SCRIPT)
    result = _run(path, record=str(tmp_path / "before.pt"))
    facts = Facts.from_json(result.facts)
    file = str(path)
    at = end(SCRIPT, 7, "DataLoader(ds, batch_size=8, shuffle=True)")
    build = facts.at(dataloader.BUILD, file, 7)
    assert build.values == [{"end": at, "pin_memory": False, "direct": True}]
    built = [file, 7, *at]
    assert facts.at(dataloader.COPY, file, 12).values == [
        {"end": end(SCRIPT, 12, "x.to(device)"), "built": built, "non_blocking": False,
         "direct": True},
        {"end": end(SCRIPT, 12, "y.to(device)"), "built": built, "non_blocking": False,
         "direct": True}]
    # a computed tensor's copy: no loader's; the model's parameters: no loader's either
    assert [v["built"] for v in facts.at(dataloader.COPY, file, 11).values] == [None]
    assert {k[2] for k in facts.data if k[0] == dataloader.COPY} <= {8, 11, 12}

    sites = list(result.report.sites)
    copy = next(s for s in sites if s.line == 12)
    proposal = dataloader.PIN_MEMORY.propose(copy, Source.read(path), facts)
    assert isinstance(proposal, Proposal)
    assert dataloader.PIN_MEMORY.propose(next(s for s in sites if s.line == 11), Source.read(path),
                              facts) is None
    patched = apply(SCRIPT, list(proposal.edits))
    assert "shuffle=True, pin_memory=torch.cuda.is_available())" in patched
    after = _run(path, {file: patched}, record=str(tmp_path / "after.pt"))
    assert not [s for s in after.report.sites if s.line == 12 and s.per_step]
    assert {s.line for s in after.report.sites if s.per_step} == {11, 17}
    before, now = torch.load(tmp_path / "before.pt"), torch.load(tmp_path / "after.pt")
    assert before["losses"] and before["losses"] == now["losses"]
    assert all(torch.equal(a, b) for a, b in zip(before["parameters"], now["parameters"],
                                                 strict=True))
    assert before["printed"] == now["printed"]


def test_without_code_positions_a_line_of_one_copy_is_still_edited():
    """Python 3.10 has no code positions: a copy is then known by its line alone."""
    def positionless(text: str) -> Facts:
        facts = facts_for(text, {5: [("x.to(device)", True, False, True)]})
        for v in facts.at(dataloader.COPY, PATH, 5).values:
            v["end"] = None
        return facts

    text = TRAIN.replace("x, y = x.to(device), y.to(device)", "x = x.to(device)")
    proposal = dataloader.PIN_MEMORY.propose(site(5), Source(PATH, text), positionless(text))
    assert "x = x.to(device, non_blocking=True)" in apply(text, list(proposal.edits))
    answer = dataloader.PIN_MEMORY.propose(site(5), Source(PATH, TRAIN), positionless(TRAIN))
    assert isinstance(answer, Refusal) and "that can be told apart on the line" in answer.reason


NON_BLOCKING = {5: [("x.to(device, non_blocking=True)", True, True, True),
                    ("y.to(device, non_blocking=True)", True, True, True)]}
TRAIN_NB = TRAIN.replace("x.to(device), y.to(device)", "x.to(device, non_blocking=True), "
                         "y.to(device, non_blocking=True)")


def test_copies_that_pass_non_blocking_from_a_loader_that_does_not_pin_get_the_pinning():
    """The most common loader mistake: non_blocking=True from pageable memory still waits."""
    proposal = dataloader.PIN_MEMORY.propose(site(5, dataloader.PAGEABLE), Source(PATH, TRAIN_NB),
                                  facts_for(TRAIN_NB, NON_BLOCKING))
    assert isinstance(proposal, Proposal)
    out = apply(TRAIN_NB, list(proposal.edits))
    assert out == TRAIN_NB.replace("batch_size=8)", "batch_size=8, pin_memory=torch.cuda."
                                   "is_available())")  # the copies are left as they are
    assert "pass non_blocking=True already" in proposal.summary
    # a loader that pins already: the pageable source is something else, not this remedy's
    assert dataloader.PIN_MEMORY.propose(site(5, dataloader.PAGEABLE), Source(PATH, TRAIN_NB),
                              facts_for(TRAIN_NB, NON_BLOCKING, pinned=True)) is None
    # a line whose copies do not all pass non_blocking: refused, with why
    mixed = {5: [("x.to(device, non_blocking=True)", True, True, True),
                 ("y.to(device, non_blocking=True)", True, False, True)]}
    answer = dataloader.PIN_MEMORY.propose(site(5, dataloader.PAGEABLE), Source(PATH, TRAIN_NB),
                                facts_for(TRAIN_NB, mixed))
    assert isinstance(answer, Refusal) and "does not pass non_blocking=True" in answer.reason


def test_fix_pins_the_loader_of_non_blocking_copies_verified(tmp_path):
    """End to end: the site is gone and the losses, parameters and printed output are the
    original's (gpusync fix's verification)."""
    import json

    from tests.conftest import run_main

    (tmp_path / "train.py").write_text(SCRIPT.replace(
        "x, y = x.to(device), y.to(device)",
        "x, y = x.to(device, non_blocking=True), y.to(device, non_blocking=True)"))
    proc = run_main("fix", "train.py", "--only", dataloader.NAME, "--steps", "2", "--format",
                    "json", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    data = json.loads(proc.stdout)
    [patch] = data["patches"]
    assert patch["remedy"] == dataloader.NAME
    verification = patch["verification"]
    assert verification["failure"] is None
    assert verification["removed"] == ["pageable non_blocking copy at train.py:12 (2/step)"]
    assert any(re.fullmatch(r"\d+ losses identical, over \d+ steps", p)
               for p in verification["parity"])
    assert "printed output identical" in verification["parity"]


def test_the_scans_advice_for_a_pageable_non_blocking_copy_is_the_loaders_pinning():
    """Not tensor.pin_memory() on the main thread, which is itself a copy the step waits for."""
    from gpusync.detect.rules import ADVICE

    advice = ADVICE[dataloader.PAGEABLE]
    assert "DataLoader(..., pin_memory=True)" in advice
    assert "tensor.pin_memory()" not in advice


def test_a_frameworks_own_non_blocking_copy_gets_the_loader_pinned():
    """Fabric's loader (and Lightning's batch transfer) copies each batch with
    non_blocking=True from library code: pinning the loader is the whole edit. It was refused
    as "copies by library code it calls"; a copy the framework makes blocking still is."""
    text = TRAIN.replace("    x, y = x.to(device), y.to(device)\n", "    step(x, y)\n")
    framework = {5: [("step(x, y)", True, True, False)]}
    answer = dataloader.PIN_MEMORY.propose(site(5, dataloader.PAGEABLE), Source(PATH, text),
                                           facts_for(text, framework))
    assert isinstance(answer, Proposal)
    assert apply(text, list(answer.edits)) == text.replace(
        "batch_size=8)", "batch_size=8, pin_memory=torch.cuda.is_available())")
    blocking = {5: [("step(x, y)", True, False, False)]}
    answer = dataloader.PIN_MEMORY.propose(site(5), Source(PATH, text), facts_for(text, blocking))
    assert isinstance(answer, Refusal) and "copies by library code it calls" in answer.reason


def test_a_batch_written_in_place_after_its_copy_by_a_function_is_refused(tmp_path):
    """A non_blocking copy from pinned memory reads the host batch when the device gets to it:
    a write after the copy, here inside a function the loop calls (no name on the copy's line
    shows it), could reach the device. The run sees the batch's version counter move."""
    text = '''
import torch
from torch.utils.data import DataLoader, TensorDataset

device = "cuda"
loader = DataLoader(TensorDataset(torch.randn(32, 4)), batch_size=8)
model = torch.nn.Linear(4, 1).to(device)


def update_stats(batch):
    batch.mul_(0.5)


for (inputs,) in loader:
    x = inputs.to(device)
    update_stats(inputs)
    model(x).sum().backward()
'''.lstrip()
    path = tmp_path / "train.py"
    path.write_text(text)
    result = _run(path)
    facts = Facts.from_json(result.facts)
    assert facts.at(dataloader.WRITTEN, str(path), 14) is not None
    copy = next(s for s in result.report.sites if s.line == 14)
    refused = dataloader.PIN_MEMORY.propose(copy, Source.read(path), facts)
    assert isinstance(refused, Refusal)
    assert "changed in place after the copy" in refused.reason
    clean = text.replace("    update_stats(inputs)\n", "    update_stats(inputs.clone())\n")
    path.write_text(clean)
    facts = Facts.from_json(_run(path).facts)
    assert facts.at(dataloader.WRITTEN, str(path), 14) is None
