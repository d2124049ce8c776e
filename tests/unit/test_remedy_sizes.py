"""gpusync fix's size remedies (gpusync/remedies/sizes.py): one_hot's num_classes,
repeat_interleave's output_size, nonzero -> nonzero_static, written only where a constant of
the program held the size the op read back, in every call."""
import runpy

import pytest
import torch

from gpusync.remedies import REMEDIES, Facts, Proposal, Refusal
from gpusync.remedies.helpers.source import Source, apply, check
from gpusync.remedies.sizes import NONZERO, ONE_HOT, REPEAT_INTERLEAVE
from gpusync.report import Site
from tests.unit.remedy_runs import recorded_run


def _site(op, line, file="t.py"):
    return Site(op=op, file=file, line=line, per_step=1.0, count=3, phase="forward")


def _facts(remedy, line, sizes, names, file="t.py"):
    facts = Facts()
    for n, held in zip(sizes, names, strict=True):
        facts.note(remedy.NAME, n, where=(file, line))
        facts.note(remedy.NAME + ":names", held, where=(file, line))
    return facts


def _patched(remedy, text, op, line, sizes, names):
    source = Source("t.py", text)
    out = remedy.propose(_site(op, line), source, _facts(remedy, line, sizes, names))
    assert isinstance(out, Proposal), out
    patched = apply(text, list(out.edits))
    check("t.py", patched)
    return patched, out


ONE_HOT_SRC = '''import torch.nn.functional as F
NUM_CLASSES = 10


def step(y, batch_size):
    return F.one_hot(y)  # the labels
'''


def test_one_hot_gets_the_constant_that_names_the_class_count():
    patched, out = _patched(ONE_HOT, ONE_HOT_SRC, "item", 6, [10] * 3,
                            [["NUM_CLASSES", "batch_size"]] * 3)
    # batch_size, an argument, ranks above a module constant, but only NUM_CLASSES says classes
    assert patched.splitlines()[5] == ("    return F.one_hot(y, num_classes=NUM_CLASSES)"
                                       "  # the labels")
    assert out.summary.startswith("one_hot: num_classes=NUM_CLASSES (the module constant, 10 "
                                  "in each of the 3 calls observed)")


def test_one_hot_prefers_an_argument_then_self_attributes_to_module_constants():
    text = ONE_HOT_SRC.replace("batch_size", "num_classes").replace("F.one_hot(y)",
                                                                     "F.one_hot(y, -1)")
    patched, out = _patched(ONE_HOT, text, "item", 6, [10, 10],
                            [["NUM_CLASSES", "num_classes"], ["NUM_CLASSES", "num_classes"]])
    assert "F.one_hot(y, num_classes)" in patched and "(the argument," in out.summary


def test_one_hot_refuses_a_varying_count_a_name_that_lost_it_and_a_loop_variable():
    source = Source("t.py", ONE_HOT_SRC)
    varied = ONE_HOT.propose(_site("item", 6), source,
                             _facts(ONE_HOT, 6, [9, 10], [[], ["NUM_CLASSES"]]))
    assert isinstance(varied, Refusal) and "varied between calls (9, 10)" in varied.reason
    lost = ONE_HOT.propose(_site("item", 6), source, _facts(
        ONE_HOT, 6, [10, 10], [["NUM_CLASSES"], []]))
    assert isinstance(lost, Refusal) and "no constant of the program" in lost.reason
    looped = Source("t.py", "import torch.nn.functional as F\nfor n in range(3):\n"
                    "    F.one_hot(y)\n")
    out = ONE_HOT.propose(_site("item", 3), looped, _facts(ONE_HOT, 3, [3, 3], [["n"], ["n"]]))
    assert isinstance(out, Refusal) and "names that did: n" in out.reason


def test_one_hot_leaves_item_sites_of_other_kinds_to_other_remedies():
    source = Source("t.py", "x = y.item()\nz = F.one_hot(y, num_classes=3)\n")
    assert ONE_HOT.propose(_site("item", 1), source, Facts()) is None
    assert ONE_HOT.propose(_site("nonzero", 2), source, Facts()) is None
    assert ONE_HOT.propose(_site("item", 2), source, Facts()) is None


REPEAT_SRC = '''import torch


class M(torch.nn.Module):
    def __init__(self, total):
        self.total = total

    def forward(self, x, r):
        return x.repeat_interleave(
            r,  # per row
        )
'''


def test_repeat_interleave_gets_output_size_from_self():
    patched, out = _patched(REPEAT_INTERLEAVE, REPEAT_SRC, "repeat_interleave", 9, [6, 6],
                            [["self.total"], ["self.total"]])
    assert "        return x.repeat_interleave(\n            r, output_size=self.total,  " \
           "# per row\n        )\n" in patched
    assert "reads sum(repeats)" in out.summary


def test_repeat_interleave_refuses_two_equal_constants_it_cannot_tell_apart():
    text = "import torch\nA = 6\nB = 6\ny = torch.repeat_interleave(x, r)\n"
    out = REPEAT_INTERLEAVE.propose(_site("repeat_interleave", 4), Source("t.py", text),
                                    _facts(REPEAT_INTERLEAVE, 4, [6], [["A", "B"]]))
    assert isinstance(out, Refusal) and "ambiguous: A and B" in out.reason


def test_an_attribute_assigned_in_the_loop_is_no_constant():
    text = ("import torch\nclass C: pass\nc = C()\nfor i in range(3):\n    c.n = 6\n"
            "    y = torch.repeat_interleave(x, r)\n")
    out = REPEAT_INTERLEAVE.propose(_site("repeat_interleave", 6), Source("t.py", text),
                                    _facts(REPEAT_INTERLEAVE, 6, [6], [["c.n"]]))
    assert isinstance(out, Refusal) and "no constant" in out.reason


def test_nonzero_becomes_nonzero_static_of_the_constant_count():
    text = "import torch\nK = 5\na = torch.nonzero(m)\nb = m.nonzero(as_tuple=False)\n"
    patched, out = _patched(NONZERO, text, "nonzero", 3, [5], [["K"]])
    assert patched.splitlines()[2] == "a = torch.nonzero_static(m, size=K)"
    assert "padded with -1 rows" in out.summary
    patched, _ = _patched(NONZERO, text, "nonzero", 4, [5], [["K"]])
    assert patched.splitlines()[3] == "b = m.nonzero_static(size=K)"


def test_nonzero_refuses_as_tuple_and_a_bare_name():
    text = "import torch\nfrom torch import nonzero\nK = 5\na = m.nonzero(as_tuple=True)\n" \
           "b = nonzero(m)\nc = torch.argwhere(m)\n"
    source, facts = Source("t.py", text), _facts(NONZERO, 4, [5], [["K"]])
    for line in (4, 5):
        out = NONZERO.propose(_site("nonzero", line), source, facts)
        assert isinstance(out, Refusal) and "not one this remedy edits" in out.reason
    out = NONZERO.propose(_site("nonzero", 6), source, facts)
    assert isinstance(out, Refusal) and out.reason == "no nonzero call at line 6"


def test_the_size_remedies_are_registered():
    assert {ONE_HOT, REPEAT_INTERLEAVE, NONZERO} <= set(REMEDIES)
    assert [r.NAME for r in (ONE_HOT, REPEAT_INTERLEAVE, NONZERO)] == [
        "one_hot.num_classes", "repeat_interleave.output_size", "nonzero.static"]


OBSERVED = '''import torch
import torch.nn.functional as F
N = 4


class Cfg:
    LABELS = 4

    def __init__(self):
        self.classes = 4


cfg = Cfg()
for i in range(3):
    batch = Cfg()  # a new object each call: its attribute held 4 by chance
    y = torch.arange(N)
    a = F.one_hot(y)
    b = F.one_hot(y, num_classes=N)
    c = torch.repeat_interleave(y, torch.ones(4, dtype=torch.long) * 2)
    d = y.repeat_interleave(2)
    e = (y >= i).nonzero()
    f = torch.nonzero(y >= 0)
'''


def test_observe_notes_each_size_and_the_names_holding_it_at_the_users_line(tmp_path):
    path = tmp_path / "t.py"
    path.write_text(OBSERVED)
    facts = Facts()
    with ONE_HOT.observe(facts), REPEAT_INTERLEAVE.observe(facts), NONZERO.observe(facts):
        runpy.run_path(str(path))
    file = str(path)
    assert not hasattr(torch.Tensor.nonzero, "__wrapped__")  # the layers are gone
    seen = {(kind, line): (o.calls, o.values) for (kind, f, line), o in facts.data.items()
            if f == file}
    four, five = ["Cfg.LABELS", "N", "cfg.classes"], ["Cfg.LABELS", "N", "batch.classes",
                                                     "cfg.classes"]  # sorted, as noted
    assert seen == {
        ("one_hot.num_classes", 17): (3, [4]),
        ("one_hot.num_classes:names", 17): (3, [five, four]),
        ("repeat_interleave.output_size", 19): (3, [8]),
        ("repeat_interleave.output_size:names", 19): (3, [[]]),
        ("nonzero.static", 21): (3, [4, 3, 2]),
        ("nonzero.static:names", 21): (3, [five, []]),
        ("nonzero.static", 22): (3, [4]),
        ("nonzero.static:names", 22): (3, [five, four]),
    }


E2E = '''import torch
import torch.nn as nn
import torch.nn.functional as F

NUM_CLASSES = 4


class Net(nn.Module):
    def __init__(self, n_classes):
        super().__init__()
        self.n_classes = n_classes
        self.fc = nn.Linear(n_classes, n_classes)

    def forward(self, y):
        return self.fc(F.one_hot(y).float())


model = Net(NUM_CLASSES).cuda()
opt = torch.optim.SGD(model.parameters(), lr=0.1)
reps = torch.tensor([1, 2, 3]).cuda()
total = 6
for step in range(4):
    y = torch.arange(NUM_CLASSES).cuda()
    r = torch.repeat_interleave(torch.randn(3).cuda(), reps)
    keep = torch.nonzero(y < NUM_CLASSES)
    loss = model(y).sum() + r.sum() + keep.sum()
    opt.zero_grad()
    loss.backward()
    opt.step()
'''


@pytest.mark.usefixtures("in_process")
def test_the_patched_script_loses_its_sites_and_computes_the_same(tmp_path):
    path = tmp_path / "train.py"
    path.write_text(E2E)

    before, original = recorded_run(path, tmp_path / "a.pt", steps=3, observe=True)
    facts, source = Facts.from_json(before.facts), Source.read(path)
    ours = {(s.op, s.line) for s in before.report.sites}
    assert {("item", 15), ("repeat_interleave", 24), ("nonzero", 25)} <= ours
    edits = []
    for site in before.report.sites:
        for remedy in (ONE_HOT, REPEAT_INTERLEAVE, NONZERO):
            out = remedy.propose(site, source, facts)
            if out is not None:
                assert isinstance(out, Proposal), out
                edits += out.edits
    text = apply(source.text, edits)
    assert "F.one_hot(y, num_classes=self.n_classes)" in text
    assert "torch.repeat_interleave(torch.randn(3).cuda(), reps, output_size=total)" in text
    # NUM_CLASSES, read in the loop, rather than model.n_classes, which holds it too
    assert "torch.nonzero_static(y < NUM_CLASSES, size=NUM_CLASSES)" in text
    after, patched = recorded_run(path, tmp_path / "b.pt", steps=3, sources={str(path): text})
    left = {(s.op, s.line) for s in after.report.sites}
    assert not left & {("item", 15), ("repeat_interleave", 24), ("nonzero", 25)}
    assert all(op == "H2D copy" for op, _ in left)
    assert patched["losses"] == original["losses"] and len(original["losses"]) == 4
    assert all(torch.equal(a, b) for a, b in zip(original["parameters"],
                                                 patched["parameters"], strict=True))


SCOPES = '''import config
N, M = 10, 20
G = 10
if (W := 10):
    pass


class Net:
    K = 10

    def __init__(self, classes):
        self.classes = classes
        self.steps = 0

    def forward(self, y, n, m):
        local = 10
        m = m + 0
        self.steps = 10
        out = f(y)
        after = 10
        return out


def bump():
    global G
    G += 1
'''


@pytest.mark.parametrize("expr, kind", [
    ("n", "the argument"), ("local", "the local constant"), ("self.classes", "the attribute"),
    ("N", "the module constant"), ("M", "the module constant"), ("config.CLASSES",
                                                                 "the attribute"),
    ("Net.K", "the attribute"),
    ("m", None),  # an argument rebound
    ("after", None),  # bound after the call: in a loop, the value a previous pass left
    ("self.steps", None),  # assigned outside __init__
    ("G", None),  # rebound by a function (global G)
    ("W", None),  # bound by a walrus
    ("undefined", None),
])
def test_what_counts_as_a_constant_at_the_call(expr, kind):
    from gpusync.remedies.helpers import constants

    source = Source("t.py", SCOPES)
    call = source.calls_at(19, "f")[0]
    found = constants.constant(source, call, expr)
    assert (found.kind if found else None) == kind
