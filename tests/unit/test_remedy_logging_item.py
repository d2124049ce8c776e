"""item.log_every (gpusync fix, #24): a logging read made every step is kept on the device and
read only under the script's own interval, printing exactly what it printed before."""
import textwrap

import pytest
import torch

from gpusync.remedies import Facts, Proposal, Refusal, logging_item
from gpusync.remedies.helpers.source import Source, apply, check
from gpusync.report import CodeLine, Site
from tests.unit.remedy_runs import recorded_run


def propose(src: str, line: int, op: str = "item", dtype: str = "float32",
            alias: bool = False):
    src = textwrap.dedent(src)
    facts = Facts()
    facts.note(logging_item.KIND, {"dtype": dtype, "alias": alias}, where=("t.py", line))
    return logging_item.LOG_EVERY.propose(Site(op=op, file="t.py", line=line, per_step=1.0, count=4,
                                     phase="other"), Source("t.py", src),
                                facts)


def patched(src: str, line: int, **kw) -> str:
    proposal = propose(src, line, **kw)
    assert isinstance(proposal, Proposal), proposal
    assert proposal.output_matters and proposal.remedy == "item.log_every"
    out = apply(textwrap.dedent(src), list(proposal.edits))
    check("t.py", out)
    return out


def refused(src: str, line: int, **kw) -> str:
    refusal = propose(src, line, **kw)
    assert isinstance(refusal, Refusal), refusal
    return refusal.reason


# pytorch/examples word_language_model: the sum read and reset in the logging block.
WORD_LM = """\
def train():
    total_loss = 0.
    for batch, i in enumerate(range(0, n, bptt)):
        loss = criterion(output, targets)
        loss.backward()
        total_loss += loss.item()

        if batch % args.log_interval == 0 and batch > 0:
            cur_loss = total_loss / args.log_interval
            print('| loss {:5.2f} | ppl {:8.2f}'.format(cur_loss, math.exp(cur_loss)))
            total_loss = 0
"""


def test_a_sum_read_in_the_logging_block_is_kept_on_the_device_in_float64():
    out = patched(WORD_LM, 6)
    assert out == WORD_LM.replace("total_loss += loss.item()",
                                  "total_loss += loss.detach().double()").replace(
        "cur_loss = total_loss / args", "cur_loss = total_loss.item() / args")


# pytorch/examples mnist test(): sums divided and printed after the loop.
MNIST_TEST = """\
def test(model, device, test_loader):
    test_loss = 0
    correct = 0
    with torch.no_grad():
        for data, target in test_loader:
            output = model(data)
            test_loss += F.nll_loss(output, target, reduction='sum').item()  # sum up batch loss
            pred = output.argmax(dim=1, keepdim=True)
            correct += pred.eq(target.view_as(pred)).sum().item()

    test_loss /= len(test_loader.dataset)

    print('Average loss: {:.4f}, Accuracy: {}/{} ({:.0f}%)'.format(
        test_loss, correct, len(test_loader.dataset),
        100. * correct / len(test_loader.dataset)))
"""


def test_sums_read_after_the_loop_are_converted_where_the_script_reads_them():
    assert patched(MNIST_TEST, 7) == MNIST_TEST.replace(
        "reduction='sum').item()", "reduction='sum').detach().double()").replace(
        "test_loss /= len(test_loader.dataset)",
        "test_loss = float(test_loss) / len(test_loader.dataset)")
    # an int64 count stays an int: summed in int64, read with int()
    assert patched(MNIST_TEST, 9, dtype="int64") == MNIST_TEST.replace(
        ".sum().item()", ".sum()").replace("test_loss, correct,", "test_loss, int(correct),"
                                           ).replace("100. * correct", "100. * int(correct)")


def test_a_sum_that_starts_as_the_int_0_is_converted_only_where_float_cannot_show():
    vae = """\
    def train(epoch):
        train_loss = 0
        for batch_idx, (data, _) in enumerate(train_loader):
            loss = loss_function(recon_batch, data, mu, logvar)
            train_loss += loss.item() * len(data)
        print('Average loss: {:.4f}'.format(train_loss / len(train_loader.dataset)))
        return train_loss
    """
    # with no step, `return train_loss` gives 0 and float(train_loss) would give 0.0
    assert "may still be the script's [0] at line 7" in refused(vae, 5)
    out = patched(vae.replace("    return train_loss\n", ""), 5)
    assert "train_loss += loss.detach().double() * len(data)" in out
    assert "format(float(train_loss) / len(train_loader.dataset))" in out


def test_a_sum_a_block_above_may_have_reset_is_read_with_float_and_total_n_divides_it():
    src = """\
    total = 0.
    for i in r:
        total += loss.item()
        if i % 10 == 0:
            total = 0.
        if i % 5 == 0:
            print(total)
    total = total / n
    print(total)
    """
    out = patched(src, 3)
    assert "if i % 5 == 0:\n        print(float(total))\n" in out
    # total / n is a Python float: what follows reads it as it is
    assert out.endswith("total = float(total) / n\nprint(total)\n")


def test_a_logging_block_nested_in_the_gradient_accumulation_block_reads_the_sum():
    hf = """\
    tr_loss, logging_loss = 0.0, 0.0
    for step, batch in enumerate(epoch_iterator):
        loss = model(**batch)[0]
        loss.backward()
        tr_loss += loss.item()
        v = loss.item()
        if (step + 1) % args.gradient_accumulation_steps == 0:
            optimizer.step()
            global_step += 1
            if args.logging_steps > 0 and global_step % args.logging_steps == 0:
                logs["loss"] = (tr_loss - logging_loss) / args.logging_steps
                logging_loss = tr_loss
                print(v)
    print(global_step, tr_loss / global_step)
    """
    out = patched(hf, 5)
    assert "logs[\"loss\"] = (tr_loss.item() - logging_loss) / args.logging_steps\n" in out
    assert "logging_loss = tr_loss.item()\n" in out
    assert "print(global_step, float(tr_loss) / global_step)" in out
    # v: nothing before the nested block names `loss`: the read moves into it
    assert "global_step % args.logging_steps == 0:\n            v = loss.item()\n" in \
        patched(hf, 6)
    # the statements of the enclosing `if` run before the nested block: `loss` rebound there
    rebound = patched(hf.replace("global_step += 1", "loss = None"), 6)
    assert "    v = loss.detach()\n" in rebound and "            v = v.item()\n" in rebound


def test_a_count_started_in_a_tuple_assignment_is_summed_in_int64():
    snli = """\
    n_correct, n_total = 0, 0
    for batch_idx, batch in enumerate(train_iter):
        n_correct += (torch.max(answer, 1)[1].view(batch.label.size()) == batch.label).sum().item()
        n_total += batch.batch_size
        if iterations % args.log_every == 0:
            print(100. * n_correct / n_total)
            n_correct, n_total = 0, 0
    """
    out = patched(snli, 3, dtype="int64")
    assert "n_correct += (torch.max(answer, 1)[1].view(batch.label.size()) == " \
           "batch.label).sum()\n" in out
    assert "print(100. * n_correct.item() / n_total)" in out


def test_a_value_used_only_in_the_logging_block_moves_into_it_with_its_comment():
    src = """\
    for i, data in enumerate(trainloader):
        loss = criterion(model(data), labels)
        optimizer.step()
        v = loss.item()  # the loss, for the log
        scheduler.step()
        if (i + 1) % LOG_EVERY == 0:
            print(f'[{i + 1:5d}] loss: {v:.3f}')
    """
    assert patched(src, 4) == textwrap.dedent("""\
    for i, data in enumerate(trainloader):
        loss = criterion(model(data), labels)
        optimizer.step()
        scheduler.step()
        if (i + 1) % LOG_EVERY == 0:
            v = loss.item()  # the loss, for the log
            print(f'[{i + 1:5d}] loss: {v:.3f}')
    """)


def test_what_is_computed_for_the_read_stays_where_it_ran_only_the_read_moves():
    src = """\
    for i in r:
        with torch.no_grad(), torch.autocast("cuda"):
            acc = (model(x).argmax(1) == y).float().mean().item()
            loss = crit(model(x), y)
            v = loss.item()
        if i % 10 == 0:
            print(acc, v)
    """
    # model(x) runs under no_grad and autocast, every step, as before; `loss.item()` is a
    # pure read: it moves out of the `with` (whose end changes nothing about reading it)
    assert patched(src, 3) == textwrap.dedent(src).replace(
        "float().mean().item()", "float().mean().detach()").replace(
        "0:\n", "0:\n        acc = acc.item()\n")
    assert patched(src, 5) == textwrap.dedent(src).replace(
        "        v = loss.item()\n", "").replace("0:\n", "0:\n        v = loss.item()\n")
    assert "computes more than the read" in refused(
        src.replace("mean().item()", "mean().item() * 100"), 3)


DCGAN = """\
for i, data in enumerate(dataloader, 0):
    output = netD(real_cpu)
    D_x = output.mean().item()
    output = netD(fake.detach())
    if i % 100 == 0:
        print(D_x)
"""


def test_a_value_whose_tensor_is_rebound_before_the_block_is_held_detached_until_then():
    assert patched(DCGAN, 3) == DCGAN.replace("output.mean().item()", "output.mean().detach()"
                                              ).replace("0:\n", "0:\n        D_x = D_x.item()\n")
    # a view or a parameter may change in place (optimizer.step()): a clone is read later
    assert "D_x = output.mean().detach().clone()" in patched(DCGAN, 3, alias=True)
    # in place through its own name, between the read and the block: a clone too
    src = "for i in r:\n    f = float(loss)\n    loss.mul_(2)\n    if i % 5 == 0:\n" \
          "        print(f)\n"
    assert patched(src, 2, op="float()") == (
        "for i in r:\n    f = loss.detach().clone()\n    loss.mul_(2)\n    if i % 5 == 0:\n"
        "        f = float(f)\n        print(f)\n")


@pytest.mark.parametrize("src, line, reason", [
    ("for i in r:\n    print(f'{loss.item():.4f}')\n", 2,
     "logs it at every pass of its loop, and what it prints must stay the same: the script "
     "has no interval of"),
    ("for i in r:\n    with torch.cuda.stream(s):\n        v = loss.item()\n"
     "    if i % 9 == 0:\n        print(v)\n", 3,
     "inside `with torch.cuda.stream(s):`: reading it later, outside that context"),
    ("for i in r:\n    losses.update(loss.item(), n)\n", 2,
     "passed to `losses.update(loss.item(), n)` at every pass of its loop"),
    ("for i in r:\n    v = loss.item()\n    history.append(v)\n    if i % 9 == 0:\n"
     "        print(v)\n", 2,
     "`v` is read at every pass of the loop, line 3: `history.append(v)`"),
    ("for i in r:\n    v = loss.item()\n    sched.step(v)\n", 2,
     "read at every pass of the loop, line 3"),
    ("for i in r:\n    v = loss.item()\n    if i % 9 == 0:\n        print(v)\nprint(v)\n", 2,
     "`v` is read at every pass of the loop, line 5"),
    ("for i in r:\n    if i % 9 == 0:\n        print(loss.item())\n", 3,
     "already read only when `if i % 9 == 0:` holds"),
    ("def f(loss):\n    return loss.item()\n", 2, "not in a loop of its function"),
    ("t = 0.\nfor i in r:\n    t += loss.item() / n\n", 3,
     "only +, - and * give the same double on the device"),
    ("t = 0.\nfor i in r:\n    t += loss.item()\n    print(t)\n", 3,
     "`t` is read at every pass of the loop"),
    ("t = 0.\nfor i in r:\n    if i:\n        t += loss.item()\n", 4,
     "summed only in some iterations"),
    ("c = 0.\nfor i in r:\n    c += x.sum().item()\nprint(c)\n", 3,
     "starts as a float and sums integers"),
    ("for i in r:\n    v = loss.item()\n    if verbose:\n        print(v)\n", 2,
     "read at every pass of the loop, line 4"),
    ("for i in r:\n    print(loss.item(), acc.item())\n", 2, "logs it at every pass of its loop"),
    ("for i in r:\n    v = a.item() + b.item()\n", 2, "2 .item() calls on line 2"),
    ("for i in r:\n    print('%.4f' % loss)\n", 2, "the read is implicit"),
])
def test_reads_used_every_step_or_not_exactly_movable_are_refused_with_the_reason(
        src, line, reason):
    op = "float()" if "%" in src and "item" not in src else "item"
    dtype = "int64" if "x.sum()" in src else "float32"
    assert reason in refused(src, line, op=op, dtype=dtype)


def test_a_read_a_library_makes_under_the_scripts_line_is_not_the_scripts_to_move():
    site = Site(op="item", file="t.py", line=2, per_step=1.0, count=4, phase="other",
                library=CodeLine(file="/venv/site-packages/torch/amp/grad_scaler.py", line=460,
                                 function="step"))
    facts = Facts()
    facts.note(logging_item.KIND, {"dtype": "float32", "alias": False}, where=("t.py", 2))
    refusal = logging_item.LOG_EVERY.propose(
        site, Source("t.py", "for i in r:\n    scaler.step(opt)\n"), facts)
    assert isinstance(refusal, Refusal)
    assert refusal.reason.startswith(
        "the read is the library's (torch/amp/grad_scaler.py:460 step)")


def test_sites_of_other_ops_are_not_this_remedys():
    assert propose("x.to('cuda')\n", 1, op="H2D copy") is None


SCRIPT = """\
import torch

torch.manual_seed(0)
model = torch.nn.Linear(4, 2).to("cuda")
opt = torch.optim.SGD(model.parameters(), lr=0.1)
LOG_INTERVAL = 2


def train(epoch):
    running_loss = 0.0
    correct = 0
    for step in range(5):
        x = torch.randn(8, 4, device="cuda")
        y = torch.randint(0, 2, (8,), device="cuda")
        out = model(x)
        loss = torch.nn.functional.cross_entropy(out, y)
        opt.zero_grad()
        loss.backward()
        opt.step()
        last = loss.item()  # for the log
        running_loss += loss.item()
        correct += out.argmax(1).eq(y).sum().item()
        acc = float(out.argmax(1).eq(y).float().mean())
        if (step + 1) % LOG_INTERVAL == 0:
            print(f"{epoch} {step + 1} loss {last:.6f} avg {running_loss / LOG_INTERVAL}", acc)
            running_loss = 0.0
    print("correct", correct, 100. * correct / 40)


for epoch in range(2):
    train(epoch)
"""


def _run(path, tmp_path, name, sources=None):
    return recorded_run(path, tmp_path / f"{name}.pt", steps=20, observe=True, sources=sources)


@pytest.mark.usefixtures("in_process")
def test_the_patched_script_reads_only_at_logging_steps_and_prints_the_same(tmp_path):
    path = tmp_path / "train.py"
    path.write_text(SCRIPT)
    result, before = _run(path, tmp_path, "before")
    facts = Facts.from_json(result.facts)
    seen = {(f["line"], f["values"][0]["dtype"], f["calls"]) for f in facts.to_json()
            if f["kind"] == logging_item.KIND}
    assert seen == {(20, "float32", 10), (21, "float32", 10), (22, "int64", 10),
                    (23, "float32", 10)}
    sites = list(result.report.sites)
    assert {(s.op, s.line) for s in sites if s.per_step == 1} == {
        ("item", 20), ("item", 21), ("item", 22), ("float()", 23)}
    source = Source.read(path)
    proposals = [logging_item.LOG_EVERY.propose(s, source, facts) for s in sites]
    edits = [e for p in proposals if isinstance(p, Proposal) for e in p.edits]
    assert len([p for p in proposals if isinstance(p, Proposal)]) == 4
    text = apply(SCRIPT, edits)
    after_result, after = _run(path, tmp_path, "after", {str(path): text})
    after_sites = {(s.op, s.line): s.count for s in after_result.report.sites
                   if s.op != "H2D copy"}
    # the loss is read at the 2 logging steps of each epoch's 5, the count once per epoch
    assert text.splitlines()[21:28] == [
        "        acc = out.argmax(1).eq(y).float().mean().detach()",
        "        if (step + 1) % LOG_INTERVAL == 0:",
        "            acc = float(acc)",
        "            last = loss.item()  # for the log",
        '            print(f"{epoch} {step + 1} loss {last:.6f} avg '
        '{running_loss.item() / LOG_INTERVAL}", acc)',
        "            running_loss = 0.0",
        '    print("correct", int(correct), 100. * int(correct) / 40)']
    assert after_sites == {("float()", 24): 4, ("item", 25): 4, ("item", 26): 4,
                           ("int()", 28): 4}
    assert after["printed"] == before["printed"] and "correct" in before["printed"]
    assert after["losses"] == before["losses"] and len(before["losses"]) == 10
    assert all(torch.equal(a, b) for a, b in zip(after["parameters"], before["parameters"],
                                                 strict=True))


def test_observe_notes_the_dtype_and_whether_the_tensor_may_change_in_place_then_leaves():
    import sys

    original = (torch.Tensor.item, torch.Tensor.__float__, torch.Tensor.__int__)
    facts, x = Facts(), torch.arange(4.)
    here = sys._getframe().f_code.co_filename
    with logging_item.LOG_EVERY.observe(facts):
        line = sys._getframe().f_lineno
        x.sum().item()
        float(x[0])
        int(torch.nn.Parameter(torch.ones(())))
        len([1.0])  # no tensor read: nothing noted
    values = {n: facts.at(logging_item.KIND, here, n) for n in range(line + 1, line + 5)}
    assert values[line + 1].values == [{"dtype": "float32", "alias": False}]
    assert values[line + 2].values == [{"dtype": "float32", "alias": True}]  # a view
    assert values[line + 3].values == [{"dtype": "float32", "alias": True}]  # a parameter
    assert values[line + 4] is None
    assert (torch.Tensor.item, torch.Tensor.__float__, torch.Tensor.__int__) == original
