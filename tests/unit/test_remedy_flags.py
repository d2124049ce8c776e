"""gpusync fix's keyword remedies: clip_grad_norm_ without error_if_nonfinite=True
(remedies/flags.py), distributions with validate_args=False (flags.py), fused=True for the
optimizer GradScaler steps (optimizers.py), is_causal=True for a transformer given the causal
mask torch made (causal.py)."""
import pytest
import torch

from gpusync.remedies import REMEDIES, Facts, Proposal, Refusal
from gpusync.remedies.causal import IS_CAUSAL
from gpusync.remedies.flags import CLIP_GRAD_NORM, VALIDATE_ARGS
from gpusync.remedies.helpers.source import Source, apply, check
from gpusync.remedies.optimizers import FUSED
from gpusync.report import CodeLine, Site
from tests.unit.remedy_runs import recorded_run

TORCH = "/venv/lib/python3.11/site-packages/torch/"


def _site(line, lib_file, function, op="bool()", file="t.py"):
    return Site(op=op, file=file, line=line, per_step=1.0, count=3, phase="other",
                library=CodeLine(TORCH + lib_file, 1, function))


def _applied(out, text):
    assert isinstance(out, Proposal), out
    patched = apply(text, list(out.edits))
    check("t.py", patched)
    return patched


def test_clip_grad_norm_drops_error_if_nonfinite_and_says_what_changes():
    text = ("from torch.nn.utils import clip_grad_norm_\n"
            "clip_grad_norm_(params, 1.0, error_if_nonfinite=True)\n"
            "torch.nn.utils.clip_grad_norm_(params, 1.0, 2.0, True, foreach=True)\n"
            "clip_grad_norm_(params, 1.0, error_if_nonfinite=args.strict)\n")
    source = Source("t.py", text)
    site = _site(2, "nn/utils/clip_grad.py", "_get_total_norm")
    out = CLIP_GRAD_NORM.propose(site, source, Facts())
    assert _applied(out, text).splitlines()[1] == "clip_grad_norm_(params, 1.0)"
    assert "an inf/nan norm no longer raises RuntimeError" in out.summary
    positional = CLIP_GRAD_NORM.propose(_site(3, "nn/utils/clip_grad.py", "x"), source, Facts())
    assert _applied(positional, text).splitlines()[2] == \
        "torch.nn.utils.clip_grad_norm_(params, 1.0, 2.0, False, foreach=True)"
    chosen = CLIP_GRAD_NORM.propose(_site(4, "nn/utils/clip_grad.py", "x"), source, Facts())
    assert isinstance(chosen, Refusal) and "args.strict is not the literal True" in chosen.reason
    assert CLIP_GRAD_NORM.propose(_site(2, "amp/grad_scaler.py", "x"), source, Facts()) is None


DIST = '''import torch.distributions as D
d = D.Independent(D.Normal(mu,
                           sigma), 1)
lp = d.log_prob(x)
e = D.Normal(mu, sigma, validate_args=True)
'''


def _dist_facts():
    facts = Facts()
    for name in ("Normal", "Independent"):
        facts.note(VALIDATE_ARGS.NAME, name, where=("t.py", 2))
    facts.note(VALIDATE_ARGS.NAME, "Normal", where=("t.py", 5))
    facts.note(VALIDATE_ARGS.SAMPLE, ["t.py", 2, "Independent"], where=("t.py", 4))
    return facts


def test_distributions_get_validate_args_false_where_they_are_built():
    source, facts = Source("t.py", DIST), _dist_facts()
    built = VALIDATE_ARGS.propose(_site(2, "distributions/distribution.py",
                                        "Distribution.__init__"), source, facts)
    patched = _applied(built, DIST)
    assert patched.splitlines()[1:3] == [
        "d = D.Independent(D.Normal(mu,", "                           sigma, validate_args=False"
        "), 1, validate_args=False)"]
    assert "invalid ones no longer raise ValueError" in built.summary
    sampled = VALIDATE_ARGS.propose(_site(4, "distributions/distribution.py",
                                          "Distribution._validate_sample"), source, facts)
    assert sampled.edits == built.edits and "(built at line 2)" in sampled.summary
    asked = VALIDATE_ARGS.propose(_site(5, "distributions/normal.py", "Normal.__init__"),
                                  source, facts)
    assert isinstance(asked, Refusal) and "validate_args=True is given" in asked.reason


def test_a_distribution_built_in_another_file_is_that_files_edit():
    facts = Facts()
    facts.note(VALIDATE_ARGS.SAMPLE, ["other.py", 7, "Normal"], where=("t.py", 4))
    out = VALIDATE_ARGS.propose(_site(4, "distributions/distribution.py", "_validate_sample"),
                                Source("t.py", DIST), facts)
    assert isinstance(out, Refusal) and "built in other.py:7" in out.reason


OPT = '''import torch
opt = torch.optim.SGD(model.parameters(),
                      lr=0.1, momentum=0.9,
                      )
scaler.step(opt)
'''


def _fused(what, line=5):
    facts = Facts()
    facts.note(FUSED.NAME, what, where=("t.py", line))
    site = _site(line, "amp/grad_scaler.py", "GradScaler._maybe_opt_step", op="item")
    return FUSED.propose(site, Source("t.py", OPT), facts)


def test_the_optimizer_gradscaler_steps_is_built_fused():
    out = _fused({"class": "SGD", "why_not": None, "built": ["t.py", 2]})
    assert "                      lr=0.1, momentum=0.9, fused=True,\n" in _applied(out, OPT)
    assert out.summary.startswith("SGD(..., fused=True) at line 2: GradScaler hands found_inf")
    refused = _fused({"class": "SGD", "why_not": "built with foreach=True, which fused refuses",
                      "built": ["t.py", 2]})
    assert isinstance(refused, Refusal) and "SGD: built with foreach=True" in refused.reason
    elsewhere = _fused({"class": "SGD", "why_not": None, "built": None})
    assert isinstance(elsewhere, Refusal) and "built outside the user's code" in elsewhere.reason


CAUSAL = "h = enc(pos(x), mask=m)\ny = model(s, t, tgt_mask=m, tgt_is_causal=False)\n"


def _causal(values, line=1):
    facts = Facts()
    for value in values:
        facts.note(IS_CAUSAL.NAME, value, where=("t.py", line))
    site = _site(line, "nn/modules/transformer.py", "_detect_is_causal_mask")
    return IS_CAUSAL.propose(site, Source("t.py", CAUSAL), facts)


def test_is_causal_is_written_only_for_the_mask_torch_made():
    seen = {"causal": True, "keyword": "is_causal", "span": [1, 4, 1, 23]}
    out = _causal([seen, seen])
    assert _applied(out, CAUSAL).splitlines()[0] == "h = enc(pos(x), mask=m, is_causal=True)"
    own = _causal([seen, {**seen, "causal": False}])
    assert isinstance(own, Refusal) and "not known without reading it" in own.reason
    wrapped = _causal([seen, {**seen, "keyword": None}])
    assert isinstance(wrapped, Refusal) and "other code than torch's" in wrapped.reason
    unspanned = _causal([{**seen, "span": None}])  # before Python 3.11: the masked call
    assert unspanned.edits == out.edits
    given = _causal([{**seen, "keyword": "tgt_is_causal", "span": [2, 4, 2, 48]}], line=2)
    assert isinstance(given, Refusal) and "tgt_is_causal=False is given" in given.reason


def test_the_flag_remedies_are_registered():
    assert {CLIP_GRAD_NORM, VALIDATE_ARGS, FUSED, IS_CAUSAL} <= set(REMEDIES)
    assert len({r.NAME for r in REMEDIES}) == len(REMEDIES)


SCRIPT = '''import torch
import torch.nn as nn
from torch.distributions import Normal

torch.manual_seed(0)
model = nn.Linear(8, 8).cuda()
opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
scaler = torch.amp.GradScaler("cuda")
layer = nn.TransformerEncoderLayer(8, 2, 16, batch_first=True)
enc = nn.TransformerEncoder(layer, 2).cuda()
mask = nn.Transformer.generate_square_subsequent_mask(5).to("cuda")
own = torch.triu(torch.full((5, 5), float("-inf")), diagonal=1).cuda()
for step in range(4):
    x = torch.randn(4, 5, 8).cuda()
    h = enc(x, mask=mask)
    g = enc(x, mask=mask, is_causal=True) + enc(x, mask=own)
    d = Normal(model(h).mean(), torch.ones(()).cuda())
    loss = (h ** 2).mean() - d.log_prob(torch.zeros(()).cuda()) + g.mean()
    opt.zero_grad()
    scaler.scale(loss).backward()
    scaler.unscale_(opt)
    torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0, error_if_nonfinite=True)
    scaler.step(opt)
    scaler.update()
'''
SITES = {15: "transformer.is_causal", 17: "distributions.validate_args",
         18: "distributions.validate_args", 22: "clip_grad_norm.error_if_nonfinite",
         23: "optimizer.fused"}


@pytest.mark.usefixtures("in_process")
def test_the_patched_script_loses_its_sites_and_computes_the_same(tmp_path):
    path = tmp_path / "train.py"
    path.write_text(SCRIPT)

    before, original = recorded_run(path, tmp_path / "a.pt", steps=3, observe=True)
    facts, source = Facts.from_json(before.facts), Source.read(path)
    # observed where the user's code called: the causal mask, not the mask of one's own
    assert [v["causal"] for v in facts.at(IS_CAUSAL.NAME, str(path), 15).values] == [True]
    assert [v["causal"] for v in facts.at(IS_CAUSAL.NAME, str(path), 16).values] == [False]
    assert facts.at(FUSED.NAME, str(path), 23).value == {
        "class": "SGD", "why_not": None, "built": [str(path), 7]}
    edits, proposed = [], {}
    for site in before.report.sites:
        for remedy in (CLIP_GRAD_NORM, VALIDATE_ARGS, FUSED, IS_CAUSAL):  # this file's
            out = remedy.propose(site, source, facts)
            if isinstance(out, Proposal):
                proposed[site.line] = out.remedy
                edits += out.edits
            elif out is not None:
                assert (site.line, out.remedy) == (16, IS_CAUSAL.NAME), out  # the own mask
    assert proposed == SITES
    after, patched = recorded_run(path, tmp_path / "b.pt", steps=3,
                                  sources={str(path): apply(source.text, edits)})
    left = {s.line for s in after.report.sites if s.op != "H2D copy"}
    assert left == {16}
    assert patched["losses"] == original["losses"] and len(original["losses"]) == 4
    assert all(torch.equal(a, b) for a, b in zip(original["parameters"],
                                                 patched["parameters"], strict=True))


OBSERVED = '''import torch
from torch.distributions import Normal
m = torch.nn.Linear(2, 2)
opt = torch.optim.SGD(m.parameters(), lr=0.1)
scaler = torch.amp.GradScaler("cpu")
for i in range(2):
    d = Normal(torch.zeros(2), torch.ones(2))
    q = Normal(torch.zeros(2), torch.ones(2), validate_args=False)
    loss = -d.log_prob(m(torch.ones(2))).sum() - q.log_prob(torch.zeros(2)).sum()
    opt.zero_grad()
    scaler.scale(loss).backward()
    scaler.step(opt)
    scaler.update()
'''


def test_observe_notes_the_validating_distributions_and_the_stepped_optimizer(tmp_path,
                                                                             monkeypatch):
    import runpy

    # as in a fresh process: torch.compile run by another test turns validation off for good
    monkeypatch.setattr(torch.distributions.Distribution, "_validate_args", True)

    path = tmp_path / "t.py"
    path.write_text(OBSERVED)
    facts, file = Facts(), str(path)
    with VALIDATE_ARGS.observe(facts), FUSED.observe(facts), IS_CAUSAL.observe(facts):
        runpy.run_path(file)
    assert not hasattr(torch.optim.Optimizer.__init__, "__wrapped__")  # the layers are gone
    seen = {(kind, line): (o.calls, o.values) for (kind, f, line), o in facts.data.items()
            if f == file}
    assert seen == {  # nothing for q, built with validate_args=False
        (VALIDATE_ARGS.NAME, 7): (2, ["Normal"]),
        (VALIDATE_ARGS.SAMPLE, 9): (2, [[file, 7, "Normal"]]),
        (FUSED.NAME, 12): (2, [{"class": "SGD", "why_not": None, "built": [file, 4]}]),
    }


def test_a_step_a_wrapper_watches_is_not_made_fused():
    """accelerate's AcceleratedOptimizer replaces the optimizer's step on the instance to tell
    a step GradScaler skipped (an overflow) by its not being called, and then skips the
    scheduler's step too; a fused optimizer is always called, so the schedule would change on a
    GPU where a step overflows (the virtual device's float32 autocast never overflows). torch's
    own LR scheduler wraps step() only to warn: no reason to refuse."""
    import torch

    from gpusync.remedies.optimizers import _why_not

    opt = torch.optim.SGD(torch.nn.Linear(2, 1).parameters(), lr=0.1)
    torch.optim.lr_scheduler.StepLR(opt, step_size=1)
    assert "step" in vars(opt) and _why_not(opt) is None
    original = opt.step

    def patched_step(*args, **kwargs):  # accelerate/optimizer.py patch_optimizer_step
        return original(*args, **kwargs)

    opt.step = patched_step
    assert "accelerate's AcceleratedOptimizer" in (_why_not(opt) or "")
