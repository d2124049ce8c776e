"""The HTML reports: well-formed pages (every tag we open is closed), self-contained (no URL but
the SVG namespace), user strings escaped, and what each page must show: the scan's sites and
fixes, the bench's variants, the tune's chosen candidate."""
import dataclasses
import html
import itertools
import json
import textwrap
from html.parser import HTMLParser

import pytest
import torch

from gpusync.bench.harness import Stepper, Variant, run_technique
from gpusync.reporters.html import box_plot, render_bench, render_scan, render_tune, ticks
from gpusync.scan import run_scan
from gpusync.schemas import validator

pytestmark = pytest.mark.usefixtures("in_process")

SVG_NS = 'xmlns="http://www.w3.org/2000/svg"'
VOID = {"meta", "br", "hr", "img", "input", "link", "wbr", "col", "source"}
EVIL = "<script>alert(1)</script>"

SCRIPT = '''
import torch
m = torch.nn.Linear(3, 1).to("cuda" if torch.cuda.is_available() else "cpu")
opt = torch.optim.SGD(m.parameters(), lr=0.1)
print(torch.ones(2, device=m.weight.device).sum().item())  # before the steps: setup only
for i in range(5):
    x = torch.randn(4, 3, device=m.weight.device)
    loss = m(x[x[:, 0] > 0]).sum()
    opt.zero_grad(); loss.backward(); opt.step()
    print(loss.item())
'''


class Checker(HTMLParser):
    """Balanced tags (void elements aside, `<x/>` closes itself), the tags seen, the text."""

    def __init__(self):
        super().__init__(convert_charrefs=True)
        self.stack, self.tags, self.text, self.errors = [], [], [], []

    def handle_starttag(self, tag, attrs):
        self.tags.append(tag)
        if tag not in VOID:
            self.stack.append(tag)

    def handle_startendtag(self, tag, attrs):
        self.tags.append(tag)

    def handle_endtag(self, tag):
        if not self.stack or self.stack[-1] != tag:
            self.errors.append(f"</{tag}> closes {self.stack[-1:]}")
        else:
            self.stack.pop()

    def handle_data(self, data):
        if self.stack[-1:] != ["style"]:
            self.text.append(data)


def check_page(page: str) -> Checker:
    assert page.startswith("<!DOCTYPE html>")
    checker = Checker()
    checker.feed(page)
    checker.close()
    assert checker.errors == [] and checker.stack == [], (checker.errors, checker.stack)
    # self-contained: the SVG namespace (a name, never fetched) is the only URL
    rest = page.replace(SVG_NS, "")
    assert "http://" not in rest and "https://" not in rest
    assert page.count("<svg") == page.count(SVG_NS)
    assert "script" not in checker.tags and "link" not in checker.tags
    assert "<img" not in page and "@import" not in page and "url(" not in page
    checker.joined = "".join(checker.text)
    return checker


@pytest.fixture(scope="module")
def report(tmp_path_factory):
    path = tmp_path_factory.mktemp("scan") / "train.py"
    path.write_text(textwrap.dedent(SCRIPT))
    result = run_scan(str(path), mode="simulate")
    assert result.error is None, result.traceback
    return result.report


def test_scan_page_shows_sites_fixes_setup_and_plots(report):
    page = render_scan(report)
    text = check_page(page).joined
    from gpusync.reporters.common import advice_line, numbered, short_path, summary

    assert summary(report) in text
    steady = [(i, s) for i, s in numbered(report) if not s.setup]
    setup = [(i, s) for i, s in numbered(report) if s.setup]
    assert steady and setup  # the script makes both
    for i, s in steady:  # the site bars are labelled "#n op file:line"
        assert f"#{i} {s.op} {short_path(s.file)}:{s.line}" in text
    for _, s in steady + setup:
        assert advice_line(s) in text
    assert text.index("Sites, per step") < text.index("Setup: ") < text.index(
        advice_line(setup[0][1]))
    assert "syncs/step" in text and page.count("<svg") == 2  # phases, sites
    for phase in report.syncs_by_phase:
        assert phase in text
    assert "predicted" not in text and 'class="badge"' not in page  # nothing was predicted


def test_predicted_sites_are_marked(report):
    site = dataclasses.replace(report.sites[0], predicted="DDP's logger waits on CUDA events")
    page = render_scan(dataclasses.replace(report, sites=[site, *report.sites[1:]]))
    check_page(page)
    assert '<span class="badge">predicted</span>' in page
    assert 'class="site predicted"' in page
    assert "[predicted: DDP&#x27;s logger waits on CUDA events]" in page


def test_user_strings_are_escaped(report):
    site = dataclasses.replace(report.sites[0], op=EVIL, advice=EVIL, module=EVIL)
    evil = dataclasses.replace(report, target=EVIL, notes=[EVIL], error=EVIL,
                               sites=[site, *report.sites[1:]])
    page = render_scan(evil)
    checker = check_page(page)  # no <script> tag was parsed
    assert EVIL not in page and "&lt;script&gt;alert(1)&lt;/script&gt;" in page
    assert EVIL in checker.joined  # shown as text


def test_a_scan_without_syncs_says_so(report):
    page = render_scan(dataclasses.replace(report, sites=[], syncs_by_phase={}))
    assert "No host<-device syncs found." in check_page(page).joined and "<svg" not in page


def counter_variant(name, scale):
    def make():
        state = torch.zeros(3)

        def step():
            state.add_(scale)

        return Stepper(step, result=lambda: state.clone())
    return Variant(name, make)


@pytest.fixture(scope="module")
def bench_result():
    values = itertools.cycle([10.0, 12.0, 11.0, 30.0, 9.0, 10.5, 7.0])
    return run_technique("demo", [counter_variant("naive", 1.0), counter_variant("fast", 1.0),
                                  counter_variant(EVIL, 2.0)], "cpu", steps=2, repeats=7,
                         timer=lambda fn, steps: (fn(), next(values))[1])


def test_bench_page_has_a_box_plot_and_table_per_technique(bench_result):
    page = render_bench([bench_result, bench_result])
    text = check_page(page).joined
    assert page.count("<svg") == 2 and page.count("<table>") == 2
    assert "naive (baseline)" in text and "fast" in text and EVIL in text
    assert EVIL not in page
    assert "step time (ms)" in text and "p50 ms" in text
    assert "peak alloc MB" not in text  # no GPU: the empty columns are left out
    assert render_bench([bench_result.to_dict()]) == render_bench([bench_result])  # JSON too
    skipped = check_page(render_bench([], not_run={"collectives": f"needs torchrun {EVIL}"}))
    assert f"not run: collectives: needs torchrun {EVIL}" in skipped.joined


def test_box_plot_whiskers_stop_at_1_5_iqr_and_outliers_are_dots():
    plot = box_plot([{"name": "b", "label": "b", "samples_ms": [1.0, 2.0, 3.0, 4.0, 100.0],
                      "p50_ms": 3.0, "p90_ms": 100.0, "colour": "#000"}], "b", "t")
    assert plot.count("<circle") == 1 and plot.count("<rect") == 1
    only_p50_p90 = box_plot([{"name": "b", "label": "b", "p50_ms": 3.0, "p90_ms": 4.0,
                              "colour": "#000"}], "b", "t")
    assert only_p50_p90.count("<circle") == 1 and "<rect" not in only_p50_p90


def test_ticks_are_round_and_cover_the_range():
    assert ticks(0.0, 1.0) == [0.0, 0.2, 0.4, 0.6, 0.8, 1.0]
    assert ticks(7.0, 30.0) == [5.0, 10.0, 15.0, 20.0, 25.0, 30.0]
    assert ticks(0.0, 0.0) == [0.0, 0.2, 0.4, 0.6, 0.8, 1.0]
    marks = ticks(0.431, 0.7323)
    assert marks[0] <= 0.431 and marks[-1] >= 0.7323


def tune_candidate(name, status, p50=None, p90=None, reason="", output=None):
    return {"name": name, "settings": {"env:TOY": name}, "status": status, "reason": reason,
            "p50_ms": p50, "p90_ms": p90, "syncs_per_step": None if p50 is None else 1.0,
            "syncs_by_phase": None if p50 is None else {"other": 1.0},
            "parity": None if p50 is None else "identical", "peak_alloc_mb": None,
            "peak_reserved_mb": None, "output": output}


TUNE = {"schema_version": 2, "kind": "gpusync-tune", "device": "cpu", "target": "toy.py",
        "command": "gpusync tune toy.py --knob env:TOY=fast,crash", "baseline": "baseline",
        "chosen": "env:TOY=fast", "p50_gain": 0.12, "p90_gain": 0.08, "baseline_noise": 0.0,
        "settings": {"env:TOY": "fast"}, "changes": {"env:TOY": "fast"},
        "emit": {"env": {"TOY": "fast"}, "python": ""},
        "candidates": [
            tune_candidate("baseline", "run", 0.49, 0.56, "the script as it is"),
            tune_candidate("env:TOY=fast", "chosen", 0.43, 0.51, "median 12% faster, p=0.004"),
            tune_candidate("env:TOY=changed", "rejected", 0.44, 0.72, "results differ"),
            tune_candidate("env:TOY=crash", "failed", reason="raised RuntimeError",
                           output=f"Traceback ...\nRuntimeError: {EVIL}")],
        "notes": ["no GPU: step times are CPU times"], "versions": {"torch": "2"},
        "date": "2026-01-01", "builds": {}}


def test_tune_page_highlights_the_chosen_candidate():
    validator("gpusync-tune").validate(TUNE)  # the test data has the real shape
    page = render_tune(TUNE)
    text = check_page(page).joined
    assert "env:TOY=fast (chosen)" in text and "baseline (baseline)" in text
    assert '<tr class="chosen"><td>env:TOY=fast</td>' in page
    assert '<span class="badge chosen">env:TOY=fast</span>' in page
    assert "env:TOY=crash" in text and "env:TOY=crash (" not in text  # table only, no plot
    assert EVIL not in page and EVIL in text  # its output, escaped, in <details>
    assert "export TOY=fast" in text and "12.0%" in text
    assert "<rect" not in page.split("<h2>Candidates")[0].split("<svg")[1]  # no samples: dots
    boxes = render_tune(TUNE, samples={"baseline": [0.45, 0.48, 0.49, 0.5, 0.56],
                                       "env:TOY=fast": [0.38, 0.4, 0.43, 0.44, 0.6]})
    check_page(boxes)
    assert boxes.split("<svg")[1].count("<rect") == 2


def test_tune_profile_document_is_drawn_from_its_samples(bench_result):
    from gpusync.profiles import Profile, ProfileCandidate
    from gpusync.reporters import render_as
    from gpusync.tune import CandidateStatus, CandidateVerdict, Decision, ProfileTune

    profile = Profile("demo", "demo.py:make", candidates=[
        ProfileCandidate("naive", {}), ProfileCandidate("fast", {"pipeline": "fast"}),
        ProfileCandidate(EVIL, {})])
    decision = Decision("fast", {
        "naive": CandidateVerdict(CandidateStatus.REFERENCE),
        "fast": CandidateVerdict(CandidateStatus.CHOSEN, "median 10% faster"),
        EVIL: CandidateVerdict(CandidateStatus.DIFFERS, "results differ from the baseline (n/a)")})
    tuned = ProfileTune(profile, bench_result, decision)
    validator("gpusync-tune-profile").validate(json.loads(render_as("tune", tuned, "json")))
    page = render_as("tune", tuned, "html")
    text = check_page(page).joined
    assert "fast (chosen)" in text and "naive (baseline)" in text
    assert page.split("<svg")[1].count("<rect") == 3  # a box per variant
    assert "rejected" in text and "pipeline" in text
    # the status column is the typed verdict's: rejected, drawn red
    assert f"<td>{html.escape(EVIL)}</td><td>rejected</td>" in page


def test_every_command_with_format_html_writes_a_page(tmp_path, monkeypatch):
    from gpusync.bench import techniques
    from tests.conftest import run_main
    from tests.unit.test_json_contract import _fake_technique

    (tmp_path / "train.py").write_text(textwrap.dedent(SCRIPT))
    proc = run_main("scan", "train.py", "--format", "html", "-o", "r.html", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert (tmp_path / "r.html").read_text().lstrip().lower().startswith("<!doctype html")
    monkeypatch.setitem(techniques.TECHNIQUES, "writeback", _fake_technique)
    proc = run_main("bench", "writeback", "--steps", "1", "--repeats", "2", "--format", "html")
    assert proc.returncode == 0, proc.stderr
    assert "<svg" in proc.stdout and "naive" in proc.stdout
