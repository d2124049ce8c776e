"""`gpusync fix` for accelerate's batch copy in a user's own loop (remedies/dataloader.py,
accelerate.non_blocking): the prepared loader copies each batch with non_blocking=False unless
the Accelerator gets DataLoaderConfiguration(non_blocking=True), and the copy is free of the
host only from pinned memory. Run on the accelerate stand-in of fake_frameworks.py (CI has no
accelerate)."""
import dataclasses
import json
import textwrap

from gpusync.detect.events import FrameworkStep
from gpusync.detect.libraries.accelerate import BATCH_COPY_STEP
from gpusync.remedies import Facts, Proposal, Refusal
from gpusync.remedies.dataloader import ACCELERATOR_NON_BLOCKING, BUILD, COPY, PIN_MEMORY
from gpusync.remedies.helpers.source import Source, apply
from gpusync.report import Site
from tests.conftest import check_contract, run_main
from tests.unit import fake_frameworks as fake

LOOP = """
    import torch
    from torch.utils.data import DataLoader, TensorDataset
    from accelerate import Accelerator

    torch.manual_seed(0)
    accelerator = Accelerator()
    model = torch.nn.Linear(4, 1)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    data = TensorDataset(torch.randn(48, 4), torch.randn(48, 1))
    loader = DataLoader(data, batch_size=8)
    model, opt, loader = accelerator.prepare(model, opt, loader)
    for x, y in loader:
        loss = ((model(x) - y) ** 2).mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
    print(round(loss.item(), 4))
    """
FOR_LINE = fake.script("", LOOP).splitlines().index("for x, y in loader:") + 1


def test_fix_makes_accelerates_copies_non_blocking_from_pinned_batches(tmp_path):
    site = fake.write(tmp_path, fake.ACCELERATE)
    (tmp_path / "train.py").write_text(fake.script(site, LOOP))
    proc = run_main("fix", "train.py", "--format", "json", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    data = check_contract(json.loads(proc.stdout))
    [patch] = data["patches"]
    assert patch["remedy"] == ACCELERATOR_NON_BLOCKING.NAME
    assert patch["verification"]["removed"] == [f"H2D copy at train.py:{FOR_LINE} (2/step)"]
    assert "losses identical" in " ".join(patch["verification"]["parity"])
    hunks = json.dumps(data["hunks"])
    assert "+from accelerate.utils import DataLoaderConfiguration" in hunks
    assert "Accelerator(dataloader_config=DataLoaderConfiguration(non_blocking=True))" in hunks
    assert "DataLoader(data, batch_size=8, pin_memory=torch.cuda.is_available())" in hunks
    # the pin_memory remedy leaves accelerate's copy to this one: no refusal of its own there
    assert not [r for r in data["refused"] if r["remedy"] == PIN_MEMORY.NAME]


def _site(line=9):
    return Site(op="H2D copy", phase="other", file="t.py", line=line, per_step=2.0, count=6,
                framework=FrameworkStep(BATCH_COPY_STEP, "/v/site-packages/x.py", 1, "f"))


def _facts(text, prepare_line, loader_line, pinned=False):
    """What the run notes: the copy at the loop's line of a loader built at `prepare_line`
    (inside accelerate), and the user's DataLoader(...) built at `loader_line`."""
    call = next(c for c in Source("t.py", text).calls_at(loader_line, "DataLoader"))
    facts = Facts()
    facts.note(COPY, {"end": None, "built": ["t.py", prepare_line, prepare_line, 40],
                      "non_blocking": False, "direct": False}, where=("t.py", 9))
    facts.note(BUILD, {"end": [call.end_lineno, call.end_col_offset], "pin_memory": pinned,
                       "direct": True}, where=("t.py", loader_line))
    return facts


def test_the_config_takes_the_name_the_file_has_for_it():
    text = textwrap.dedent("""\
        import accelerate
        import torch
        acc = accelerate.Accelerator(cpu=False)
        loader = torch.utils.data.DataLoader(range(8), batch_size=2, pin_memory=True)
        loader = acc.prepare(loader)
        """)
    out = ACCELERATOR_NON_BLOCKING.propose(_site(), Source("t.py", text),
                                           _facts(text, 5, 4, pinned=True))
    assert isinstance(out, Proposal), out
    assert apply(text, list(out.edits)).splitlines()[2] == (
        "acc = accelerate.Accelerator(cpu=False, "
        "dataloader_config=accelerate.utils.DataLoaderConfiguration(non_blocking=True))")
    assert "the DataLoader at line 4 pins its batches already" in out.summary


def test_refusals_say_what_the_script_decides():
    base = textwrap.dedent("""\
        from accelerate import Accelerator, DataLoaderConfiguration
        from torch.utils.data import DataLoader
        acc = Accelerator({})
        loader = DataLoader(range(8), batch_size=2)
        loader = acc.prepare(loader)
        """)

    def answer(args):
        text = base.format(args)
        return ACCELERATOR_NON_BLOCKING.propose(_site(), Source("t.py", text),
                                                _facts(text, 5, 4))

    ok = answer("")
    assert isinstance(ok, Proposal)
    assert apply(base.format(""), list(ok.edits)).splitlines()[2:4] == [
        "acc = Accelerator(dataloader_config=DataLoaderConfiguration(non_blocking=True))",
        "loader = DataLoader(range(8), batch_size=2, pin_memory=True)"]
    given = answer("dataloader_config=cfg")
    assert isinstance(given, Refusal) and "set non_blocking=True in it" in given.reason
    spread = answer("**options")
    assert isinstance(spread, Refusal) and "may pass dataloader_config" in spread.reason
    two = base.format("") + "other = Accelerator()\n"
    refused = ACCELERATOR_NON_BLOCKING.propose(_site(), Source("t.py", two), _facts(two, 5, 4))
    assert isinstance(refused, Refusal) and "2 Accelerator(...) calls" in refused.reason
    elsewhere = ACCELERATOR_NON_BLOCKING.propose(_site(), Source("t.py", base.format("")),
                                                 Facts())
    assert isinstance(elsewhere, Refusal) and "no DataLoader's batch" in elsewhere.reason


def test_only_accelerates_copy_is_its_kind():
    text = "x = 1\n"
    other = dataclasses.replace(_site(), framework=None)
    assert ACCELERATOR_NON_BLOCKING.propose(other, Source("t.py", text), Facts()) is None
    assert PIN_MEMORY.propose(_site(), Source("t.py", text), Facts()) is None


def test_the_config_is_imported_after_the_files_accelerate_import_or_before_its_use():
    top = textwrap.dedent("""\
        from accelerate import Accelerator
        from torch.utils.data import DataLoader
        acc = Accelerator()
        loader = DataLoader(range(8), batch_size=2)
        loader = acc.prepare(loader)
        """)
    out = ACCELERATOR_NON_BLOCKING.propose(_site(), Source("t.py", top), _facts(top, 5, 4))
    assert isinstance(out, Proposal), out
    assert apply(top, list(out.edits)).splitlines()[:2] == [
        "from accelerate import Accelerator",
        "from accelerate.utils import DataLoaderConfiguration"]
    inside = textwrap.dedent("""\
        from torch.utils.data import DataLoader
        def main():
            import accelerate as acc_lib
            acc = acc_lib.Accelerator()
            loader = acc.prepare(DataLoader(range(8), batch_size=2))
        """)
    out = ACCELERATOR_NON_BLOCKING.propose(_site(), Source("t.py", inside),
                                           _facts(inside, 5, 5))
    assert isinstance(out, Proposal), out
    assert apply(inside, list(out.edits)).splitlines()[3] == (
        "    acc = acc_lib.Accelerator("
        "dataloader_config=acc_lib.utils.DataLoaderConfiguration(non_blocking=True))")
