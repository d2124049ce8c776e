"""tensor.hoist / tensor.pinned: a per-step torch.tensor(list, device=) built once before its loop
when every call saw the same data, else built in pinned memory and copied non_blocking."""
import textwrap

import pytest
import torch
from torch.utils.data import DataLoader

from gpusync import remedies
from gpusync.remedies import Facts, Proposal, Refusal, dataloader, tensor_list
from gpusync.remedies.helpers.source import Source, apply, check
from gpusync.report import Site
from tests.unit.remedy_runs import candidate_run

pytestmark = pytest.mark.usefixtures("in_process")

PATH = "/w/train.py"


def end(text: str, line: int, call: str) -> list[int]:
    row = text.splitlines()[line - 1]
    return [line, len(row[:row.index(call) + len(call)].encode())]


def facts_for(text: str, line: int, call: str | tuple[int, str], data: list,
              requires_grad=False) -> Facts:
    """`call`: its text on `line`, or (the line it ends on, its last part there)."""
    at = end(text, *call) if isinstance(call, tuple) else end(text, line, call)
    facts = Facts()
    for value in data:
        facts.note(tensor_list.KIND, {"end": at, "data": value,
                                      "dtype": "torch.float32",
                                      "requires_grad": requires_grad}, where=(PATH, line))
    return facts


def propose(text: str, line: int, call: str, data: list, **more):
    site = Site(op="H2D copy (torch.tensor)", file=PATH, line=line, per_step=1.0, count=4,
                phase="other")
    return tensor_list.HOIST_TENSOR.propose(site, Source(PATH, text),
                                            facts_for(text, line, call, data, **more))


def patched(text: str, line: int, call: str, data: list) -> tuple[str, Proposal]:
    proposal = propose(text, line, call, data)
    assert isinstance(proposal, Proposal), proposal
    out = apply(text, list(proposal.edits))
    check(PATH, out)
    return out, proposal


W = "torch.tensor([1.0, 2.0], device=device)"
LOOP = f'''import torch
model.train()
# the training loop
for x, y in batches:
    w = {W}  # class weights
    loss = model(x, y) * w.sum()
'''


def test_a_constant_assignment_moves_before_its_loop_and_its_comment():
    out, proposal = patched(LOOP, 5, W, ["[1.0, 2.0]"] * 4)
    assert out == f'''import torch
model.train()
w = {W}  # class weights
# the training loop
for x, y in batches:
    loss = model(x, y) * w.sum()
'''
    assert proposal.remedy == "tensor.hoist"
    assert proposal.summary == ("w = torch.tensor(...) moved before the loop at line 4: the same "
                                "data ([1.0, 2.0]) in all 4 calls, from names the loop does not "
                                "assign")


def test_a_name_the_loop_also_rebinds_gets_a_new_one_that_clashes_with_none():
    text = LOOP.replace("    loss =", "    w = w * 2\n    loss =") + "w_const = 0\n"
    out, proposal = patched(text, 5, W, ["[1.0, 2.0]"])
    assert out.splitlines()[2:6] == [f"w_const_2 = {W}", "# the training loop",
                                     "for x, y in batches:", "    w = w_const_2  # class weights"]
    assert "as w_const_2" in proposal.summary
    inline = "for x in xs:\n    while go:\n        f(x * torch.tensor([2.0],\n" \
             + " " * 27 + "device=d))\n"  # lined up with the list, as it stays
    out, _ = patched(inline, 3, (4, "device=d)"), ["[2.0]"])
    assert out == ("const_tensor = torch.tensor([2.0],\n" + " " * 28 + "device=d)\n"
                   "for x in xs:\n    while go:\n        f(x * const_tensor)\n")


def test_it_leaves_every_loop_it_is_a_constant_of_and_only_those():
    text = ("for epoch in range(2):\n    k = epoch / 2\n    for s in r:\n"
            "        w = torch.tensor([k], device=d)\n        f(w)\n")
    out, proposal = patched(text, 4, "torch.tensor([k], device=d)", ["[0.0]"])
    assert out == ("for epoch in range(2):\n    k = epoch / 2\n"
                   "    w = torch.tensor([k], device=d)\n    for s in r:\n        f(w)\n")
    assert "before the loop at line 3" in proposal.summary
    text = text.replace("[k]", "[1.0]")
    out, proposal = patched(text, 4, "torch.tensor([1.0], device=d)", ["[1.0]"])
    assert out.startswith("w = torch.tensor([1.0], device=d)\nfor epoch in range(2):\n")


def test_changing_data_is_built_pinned_and_copied_non_blocking():
    text = "for step in range(9):\n    s = torch.tensor([step, 1.0], device=dev, dtype=half)\n"
    out, proposal = patched(text, 2, "torch.tensor([step, 1.0], device=dev, dtype=half)",
                            ["[0, 1.0]", "[1, 1.0]"])
    assert out == ("for step in range(9):\n    s = torch.tensor([step, 1.0], pin_memory=torch."
                   "cuda.is_available(), dtype=half).to(dev, non_blocking=True)\n")
    assert proposal.remedy == "tensor.pinned"
    assert proposal.summary.endswith("its data changes between calls (2 distinct in 2 calls)")


K = "torch.tensor([2.0], device=d)"


@pytest.mark.parametrize("text, line, call, why", [
    ("for s in range(3):\n    k = 2.0\n    w = torch.tensor([k], device=d)\n", 3,
     "torch.tensor([k], device=d)", "it reads k, which the loop at line 1 assigns"),
    (f"def weights(d):\n    w = {K}\n    return w\n", 2, K,
     "not in a loop of its own function"),
    (f"for s in range(3):\n    w = {K}\n    w.mul_(s)\n", 2, K,
     "w is changed in place at line 3"),
    (f"for s in range(3):\n    w = {K}\n    w[0] += s\n", 2, K,
     "w is changed in place at line 3"),
    ("for s in range(3):\n    w = torch.tensor([read()], device=d)\n", 2,
     "torch.tensor([read()], device=d)", "it calls read(...) each time"),
    (f"for s in range(3):\n    ws = [{K} for _ in r]\n", 2, K,
     "one tensor per element of a comprehension"),
    (f"for s in range(3):\n    with torch.cuda.device(s % 2):\n        w = {K}\n", 3, K,
     "it is built inside `with torch.cuda.device(s % 2):`, which may choose the device"),
    ("for s in range(3):\n    sched.step()\n    w = torch.tensor([sched.lr], device=d)\n", 3,
     "torch.tensor([sched.lr], device=d)",
     "it reads sched, which the loop hands to sched.step(...) at line 2"),
])
def test_the_same_data_that_is_no_constant_of_the_loop_is_built_pinned(text, line, call, why):
    proposal = propose(text, line, call, ["[2.0]"])
    assert isinstance(proposal, Proposal) and proposal.remedy == "tensor.pinned", proposal
    assert why in proposal.summary
    assert "pin_memory=torch.cuda.is_available()).to(d, non_blocking=True)" in apply(
        text, list(proposal.edits))


def test_torch_goes_by_the_name_the_file_gives_it():
    text = "import torch as th\nfrom torch import tensor\nfor s in r:\n" \
           "    w = tensor([s], device=d)\n"
    out, _ = patched(text, 4, "tensor([s], device=d)", ["[0]", "[1]"])
    assert out.endswith("w = tensor([s], pin_memory=th.cuda.is_available()).to(d, "
                        "non_blocking=True)\n")
    answer = propose(text.replace("import torch as th\n", ""), 3, "tensor([s], device=d)",
                     ["[0]", "[1]"])
    assert isinstance(answer, Refusal) and "the file imports no torch" in answer.reason


@pytest.mark.parametrize("call, more, why", [
    ("torch.tensor([2.0], device=d, requires_grad=True)", {},
     "built once it would gather gradients across steps"),
    ("torch.tensor([2.0], device=d, **kw)", {}, "takes its arguments from * or **"),
    ("torch.tensor([2.0], device=d, pin_memory=False)", {}, "passes pin_memory itself"),
    ("torch.tensor([2.0], device=d)", {"requires_grad": True}, "gather gradients"),
])
def test_refusals_say_why(call, more, why):
    answer = propose(f"for s in range(3):\n    w = {call}\n", 2, call, ["[2.0]"], **more)
    assert isinstance(answer, Refusal) and why in answer.reason, answer


def test_other_sites_and_unobserved_lines_are_not_its_kind():
    text = f"for s in r:\n    w = {W}\n"
    facts = facts_for(text, 2, W, ["[1.0, 2.0]"])
    source = Source(PATH, text)
    assert tensor_list.HOIST_TENSOR.propose(Site(op="H2D copy", file=PATH, line=2, per_step=1.0,
                                                 count=3, phase="other"), source, facts) is None
    assert tensor_list.HOIST_TENSOR.propose(Site(op="H2D copy (torch.tensor)", file=PATH, line=1,
                                                 per_step=1.0, count=3, phase="other"),
                                            source, facts) is None


def test_the_observers_leave_nothing_behind():
    def now():
        return (torch.tensor, torch.Tensor.to, torch.Tensor.cuda, vars(DataLoader)["__init__"],
                vars(DataLoader)["__iter__"], "to" in vars(torch.Tensor))

    before = now()
    with remedies.observing(Facts()):
        assert all(a is not b for a, b in zip(now()[:5], before[:5], strict=True))
    assert now() == before


def test_a_device_context_still_places_torch_tensor_while_observed_and_after():
    from torch.utils import _device

    _device._device_constructors.cache_clear()  # as in a fresh process: observers come first
    with remedies.observing(Facts()):
        with torch.device("meta"):
            assert torch.tensor([1.0]).device.type == "meta"
    with torch.device("meta"):
        assert torch.tensor([1.0]).device.type == "meta"


SCRIPT = textwrap.dedent('''
    import torch
    from torch.utils.data import DataLoader, TensorDataset

    torch.manual_seed(0)
    device = "cuda"
    ds = TensorDataset(torch.randn(32, 4), torch.randint(0, 3, (32,)))
    loader = DataLoader(ds, batch_size=8)
    model = torch.nn.Linear(4, 3).to(device)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    for step, (x, y) in enumerate(loader):
        x, y = x.to(device), y.to(device)
        weight = torch.tensor([1.0, 2.0, 0.5], device=device)
        scale = torch.tensor([1.0 + step / 10], device=device)
        plain = torch.tensor([3.0])
        loss = torch.nn.functional.cross_entropy(model(x), y, weight=weight) * scale.sum()
        opt.zero_grad()
        loss.backward()
        opt.step()
''').lstrip()


def _run(path, sources=None, record=None):
    return candidate_run(path, steps=2, record=record, sources=sources, observe=sources is None)


def test_observed_and_proved_on_a_training_script(tmp_path):
    path, file = tmp_path / "train.py", str(tmp_path / "train.py")
    path.write_text(SCRIPT)
    result = _run(path, record=str(tmp_path / "before.pt"))
    facts = Facts.from_json(result.facts)
    constant = facts.at(tensor_list.KIND, file, 12)
    assert constant.constant and constant.value == {
        "end": end(SCRIPT, 12, "torch.tensor([1.0, 2.0, 0.5], device=device)"),
        "data": "[1.0, 2.0, 0.5]", "dtype": "torch.float32", "requires_grad": False}
    varying = facts.at(tensor_list.KIND, file, 13)
    assert [v["data"] for v in varying.values] == ["[1.0]", "[1.1]", "[1.2]", "[1.3]"]
    assert {k[2] for k in facts.data if k[0] == tensor_list.KIND} == {12, 13}  # not 14's

    source = Source.read(path)
    proposals = []
    for site in result.report.sites:
        for remedy in (dataloader.PIN_MEMORY, tensor_list.HOIST_TENSOR):
            answer = remedy.propose(site, source, facts) if site.per_step else None
            assert not isinstance(answer, Refusal), answer
            if answer is not None:
                proposals.append(answer)
    assert sorted(p.remedy for p in proposals) == ["dataloader.pin_memory", "tensor.hoist",
                                                   "tensor.pinned"]
    text = apply(SCRIPT, [e for p in proposals for e in p.edits])
    assert "weight = torch.tensor([1.0, 2.0, 0.5], device=device)\nfor step," in text
    assert "torch.tensor([1.0 + step / 10], pin_memory=torch.cuda.is_available()).to(device, " \
        "non_blocking=True)" in text
    after = _run(path, {file: text}, record=str(tmp_path / "after.pt"))
    assert [(s.op, s.line) for s in after.report.sites if s.per_step] == []
    before, now = torch.load(tmp_path / "before.pt"), torch.load(tmp_path / "after.pt")
    assert len(before["losses"]) == 4 and before["losses"] == now["losses"]
    assert all(torch.equal(a, b) for a, b in zip(before["parameters"], now["parameters"],
                                                 strict=True))
    assert before["printed"] == now["printed"]


def test_under_no_grad_it_is_still_a_constant_and_gets_a_name_outside():
    text = f"for s in r:\n    with torch.no_grad():\n        keep = {W}\n        f(keep)\n"
    out, _ = patched(text, 3, W, ["[1.0, 2.0]"])
    assert out == (f"keep_const = {W}\nfor s in r:\n    with torch.no_grad():\n"
                   "        keep = keep_const\n        f(keep)\n")
