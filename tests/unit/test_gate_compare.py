"""The count gate and its GitHub annotations on fabricated baselines and reports."""
import dataclasses

from gpusync.gate import GateStatus, Problem, ProblemKind, Verdict, combine, compare_counts
from gpusync.report import Process, Report, Site
from gpusync.reporters import render_as


def render(verdict: Verdict, fmt: str) -> str:
    return render_as("gate", verdict, fmt)


KEY = "item | other | - | train.py | <module>"


def site(line, per_step, advice="keep the value on the device", setup=False):
    return Site(op="item", phase="other", module=None, file="train.py", function="<module>",
                line=line, per_step=per_step, advice=advice, setup=setup, hook=None)


def base(per_step=1.0, margin=0.0, lines=(8,), fix="baseline fix"):
    return {"sites": [{"key": KEY, "file": "train.py", "lines": list(lines),
                       "per_step": per_step, "margin": margin, "fix": fix}]}


def report(*sites, measured_steps=2, syncs_per_step=0.5, max_syncs_per_step=1):
    return Report(mode="simulate", device="cpu", steps=measured_steps + 1, warmup=1,
                  measured_steps=measured_steps, syncs_per_step=syncs_per_step,
                  max_syncs_per_step=max_syncs_per_step, syncs_by_phase={}, sites=sites,
                  target="t.py")


def test_a_margin_tolerates_more_syncs_never_fewer():
    assert compare_counts(base(per_step=2.0, margin=1.0), report(site(8, 3.0))) == []
    [problem] = compare_counts(base(per_step=3.0, margin=2.0), report(site(8, 1.0)))
    assert problem.kind is ProblemKind.FEWER_SYNCS and "update the baseline" in problem.message


def test_more_syncs_point_at_the_line_the_baseline_did_not_have():
    [problem] = compare_counts(base(lines=(8,)), report(site(8, 1.0), site(12, 1.0, "now fix")))
    assert (problem.kind, problem.file, problem.line, problem.advice) == (
        ProblemKind.MORE_SYNCS, "train.py", 12, "now fix")
    line = render(Verdict(GateStatus.REGRESSION, [problem]), "github").splitlines()[0]
    assert line.startswith("::error file=train.py,line=12,title=gpusync%3A more syncs::")
    assert line.endswith("%0Afix: now fix")


def test_a_site_gone_is_annotated_at_the_baselines_line_with_its_fix():
    [problem] = compare_counts(base(lines=(8, 9)), report())
    assert (problem.kind, problem.file, problem.line, problem.advice) == (
        ProblemKind.SITE_GONE, "train.py", 8, "baseline fix")
    line = render(Verdict(GateStatus.REGRESSION, [problem]), "github").splitlines()[0]
    assert line == ("::warning file=train.py,line=8,title=gpusync%3A site gone::fewer syncs "
                    "(update the baseline): item | other | - | train.py | <module>: 1 -> 0/step"
                    "%0Afix: baseline fix")


def test_a_suggestion_only_for_wins():
    win = Problem(ProblemKind.FEWER_SYNCS, "fewer")
    assert combine([win, Problem(ProblemKind.SITE_GONE, "gone")], None).only_improvements
    assert not combine([win, Problem(ProblemKind.NEW_SITE, "new")], None).only_improvements
    assert not combine([win], (GateStatus.REGRESSION, "slower: 1.3x")).only_improvements
    assert not combine([], None).only_improvements


def test_fewer_syncs_fail_the_gate_as_an_unrecorded_improvement_not_a_regression():
    win = combine([Problem(ProblemKind.FEWER_SYNCS, "fewer syncs: k 2 -> 1 per step", "a.py",
                           3)], None)
    assert win.status is GateStatus.REGRESSION and win.exit_code == 1  # still fails: record the win
    text = render(win, "text")
    assert text.endswith("gate: unrecorded improvement (fewer syncs than the baseline records: "
                         "commit the suggested baseline to record it)\n")
    worse = combine([Problem(ProblemKind.FEWER_SYNCS, "f"), Problem(ProblemKind.NEW_SITE, "n")],
                    None)
    assert render(worse, "text").endswith("gate: regression\n")


def test_annotations_without_a_line_or_file():
    verdict = Verdict(GateStatus.REGRESSION, [Problem(ProblemKind.NEW_SITE, "x", "a.py", 0),
                                     Problem(ProblemKind.SLOWER, "slower: 1.3x, p=0.001")])
    assert render(verdict, "github").splitlines() == [
        "::error file=a.py,title=gpusync%3A new site::x",
        "::error title=gpusync%3A slower::slower: 1.3x, p=0.001"]


def test_text_and_json_formats_are_unchanged():
    verdict = Verdict(GateStatus.REGRESSION, [Problem(
        ProblemKind.NEW_SITE, "new sync site: k (1/step)", "a.py", 3, "k", "do this")])
    assert render(verdict, "text") == ("FAIL new sync site: k (1/step) (a.py:3)\n  fix: do this\n"
                                       "gate: regression\n")
    import json

    assert json.loads(render(verdict, "json")) == {
        "schema_version": 1, "kind": "gpusync-gate", "status": "regression", "exit_code": 1,
        "notes": [], "suggested_baseline": None,
        "problems": [{"kind": "new site", "message": "new sync site: k (1/step)",
                      "file": "a.py", "line": 3, "key": "k", "fix": "do this"}]}


def test_annotations_escape_what_workflow_commands_require():
    # data: % CR LF; properties (file, title): also : and ,
    verdict = Verdict(GateStatus.REGRESSION,
                      [Problem(ProblemKind.NEW_SITE, "50% a\r\nb", "a,b:c.py", 3)])
    assert render(verdict, "github").splitlines()[0] == (
        "::error file=a%2Cb%3Ac.py,line=3,title=gpusync%3A new site::50%25 a%0D%0Ab")


def test_the_same_run_gives_the_baselines_figure_exactly():
    from gpusync.baseline import from_report

    # two lines of one key, 6 in 7 steps each: summed then rounded on both sides (1.7143)
    now = report(site(7, 6 / 7), site(8, 6 / 7), measured_steps=7, syncs_per_step=12 / 7,
                 max_syncs_per_step=2)
    recorded = from_report(now)
    assert recorded["sites"][0]["per_step"] == 1.7143
    assert compare_counts(recorded, now) == []


def test_a_new_site_is_shown_at_its_line_not_at_a_setup_site_with_its_key():
    [problem] = compare_counts({"sites": []}, report(site(213, 0.0, setup=True), site(316, 1.0)))
    assert (problem.kind, problem.line) == (ProblemKind.NEW_SITE, 316)


def test_a_spawned_processs_site_is_keyed_on_its_own_by_the_processs_name():
    """A site a spawned child made (counted per the child's steps) never adds to the
    parent's figure at the same key; its key names the process, not its pid (which changes
    from run to run)."""
    from gpusync.baseline import from_report, keyed_sites

    child = dataclasses.replace(site(8, 1.0), process=Process(4027, "SpawnProcess-2"))
    now = report(site(8, 0.5), child)
    keys = {k: v[0] for k, v in keyed_sites(now).items()}
    assert keys == {KEY: 0.5, f"{KEY} | spawned SpawnProcess-2": 1.0}
    again = report(site(8, 0.5), dataclasses.replace(child, process=Process(5120,
                                                                          "SpawnProcess-2")))
    assert compare_counts(from_report(now), again) == []
