"""Nothing injected: text gpusync prints for the user to paste, eval or render (tune's
`--emit env|python|yaml`, the export lines of its report, Markdown tables) says what was
measured and nothing else, whatever the knob values, file names and targets hold."""
import dataclasses
import re
import subprocess

import pytest
import yaml

from gpusync import knobs, tune_script
from gpusync.bench.harness import Measurement, TechniqueResult
from gpusync.detect.events import Frame, SyncEvent
from gpusync.knobs import user
from gpusync.report import build_report
from gpusync.reporters import render, render_as
from gpusync.reporters.bench import technique_table
from gpusync.tune import Decision, RunStatus
from tests.conftest import run_main, stderr_lines

pytestmark = pytest.mark.usefixtures("in_process")

HOSTILE = ["$(touch PWNED) a b", "`touch PWNED`", "x; touch PWNED", "it's \"quoted\"",
           "line\ntouch PWNED", "$HOME"]


def tuned(base: dict, chosen: dict) -> tune_script.ScriptTune:
    """A tune whose decision chose `chosen` over the script's own `base` settings."""
    changed = {k: v for k, v in chosen.items() if base.get(k) != v}
    runs = [tune_script.CandidateRun(knobs.KnobCandidate("baseline", base),
                                     status=RunStatus.RUN),
            tune_script.CandidateRun(knobs.KnobCandidate("the chosen one", chosen, changed),
                                     status=RunStatus.RUN)]
    return tune_script.ScriptTune("x.py", "gpusync tune x.py", "cpu", {}, runs,
                                  decision=Decision("the chosen one"))


def emit(tune: tune_script.ScriptTune, form: str) -> str:
    """What `gpusync tune --emit FORM` prints for this tune."""
    return render_as("tune-emit", tune, form)


def bash(text: str, cwd, then: str = "") -> str:
    proc = subprocess.run(["bash", "-c", f"eval \"$EMITTED\"\n{then}"], cwd=cwd, text=True,
                          capture_output=True, env={"EMITTED": text, "PATH": "/usr/bin:/bin"},
                          timeout=60)
    assert proc.returncode == 0, proc.stderr
    return proc.stdout


@pytest.mark.parametrize("value", HOSTILE)
def test_emitted_exports_set_the_value_and_run_nothing(tmp_path, value):
    text = emit(tuned({"env:FAST": ""}, {"env:FAST": value}), "env")
    assert bash(text, tmp_path, then='printf %s "$FAST"') == value
    assert list(tmp_path.iterdir()) == []  # no PWNED
    table = render_as("tune-script", tuned({"env:FAST": ""}, {"env:FAST": value}), "table")
    export = table[table.index("export FAST="):]
    assert bash(export, tmp_path, then='printf %s "$FAST"') == value
    assert list(tmp_path.iterdir()) == []


def test_an_emitted_unset_variable_is_unset_not_empty(tmp_path):
    text = emit(tuned({"env:FAST": "1"}, {"env:FAST": ""}), "env")
    assert text == "unset FAST\n"
    assert bash(text, tmp_path, then='echo "${FAST-unset}"') == "unset\n"


@pytest.mark.parametrize("value", HOSTILE + ["4\nimport os; os.system('touch PWNED')"])
def test_emitted_python_is_comments_that_stay_comments(tmp_path, monkeypatch, value):
    monkeypatch.chdir(tmp_path)
    text = emit(tuned({"arg:--prefetch": "2"}, {"arg:--prefetch": value}),
                                 "python")
    assert all(line.startswith("# ") for line in text.splitlines())
    exec(compile(text, "<emitted>", "exec"), {})
    assert list(tmp_path.iterdir()) == []


def test_emitted_python_spells_the_flags_as_a_shell_reads_them(tmp_path):
    text = emit(tuned({"arg:--data": "a"}, {"arg:--data": "my file"}), "python")
    assert text == "# run the script with: --data 'my file'\n"


@pytest.mark.parametrize("base,chosen,says", [
    ({"env:FAST": "1"}, {"env:FAST": "1"}, "# nothing to change: the script's own settings"),
    ({"env:FAST": "1"}, {"env:FAST": "2"}, "# nothing to change in the code: the chosen "
                                            "settings are environment variables"),
])
def test_emitted_python_with_nothing_for_the_code_says_so(base, chosen, says):
    text = emit(tuned(base, chosen), "python")
    assert text.startswith(says) and text.count("\n") == 1


@pytest.mark.parametrize("value", HOSTILE + ["yes", "1", "- a", "{x: 1}", "*alias"])
def test_emitted_yaml_reads_back_as_the_very_settings(value):
    text = emit(tuned({"env:FAST": ""}, {"env:FAST": value}), "yaml")
    assert yaml.safe_load(text) == {"settings": {"env:FAST": value}}


@pytest.mark.parametrize("knob,why", [
    ("env:FAST X=1,2", "'FAST X' is not an environment variable name"),
    ("env:A=B=1,2", None),  # the value of A is "B=1" or "2": a valid name
    ("env:1ST=1,2", "'1ST' is not an environment variable name"),
    ("env:$(touch PWNED)=1", "is not an environment variable name"),
    ("arg:lr=1,2", "'lr' is not a flag"),
    ("arg:--lr x=1,2", "is not a flag"),
])
def test_knob_names_a_shell_cannot_take_are_refused_before_anything_runs(tmp_path, knob, why):
    (tmp_path / "x.py").write_text("open('ran', 'w').close()\n")
    if why is None:
        assert user.parse(knob, ()).name == "env:A"
        return
    proc = run_main("tune", "x.py", "--knob", knob, cwd=tmp_path)
    assert proc.returncode == 2, proc.stderr
    lines = stderr_lines(proc)
    assert len(lines) == 1 and why in lines[0], proc.stderr
    assert list(tmp_path.iterdir()) == [tmp_path / "x.py"]


def cells(line: str) -> int:
    """The cells of a Markdown table row: the `|` not escaped."""
    return len(re.findall(r"(?<!\\)\|", line))


def table_lines(text: str) -> list[str]:
    lines = [ln for ln in text.splitlines() if ln.startswith("|")]
    assert lines
    return lines


def assert_one_width(text: str) -> None:
    lines = table_lines(text)
    assert {cells(ln) for ln in lines} == {cells(lines[0])}, text


def test_a_scanned_script_named_with_a_pipe_keeps_the_markdown_table(tmp_path):
    (tmp_path / "pipe|name.py").write_text(
        "import torch\nx = torch.ones(3, device='cuda')\nfor _ in range(2):\n"
        "    x.sum().item()\n")
    proc = run_main("scan", "pipe|name.py", "--format", "markdown", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert_one_width(proc.stdout)
    assert r"pipe\|name.py:4" in proc.stdout
    assert proc.stdout.startswith(r"## gpusync scan of pipe\|name.py")


def test_markdown_cells_show_file_names_literally():
    event = SyncEvent(op="item", frames=(Frame("/x/__init__.py", 3, "step"),), phase="other",
                      step=0, stall_ms=None, advice="fix it")
    report = build_report([event], steps=1, warmup=0, mode="simulate", target="t.py")
    site = dataclasses.replace(report.sites[0], module="a|b", per_rank={"0": 1.0, "1": 2.0})
    text = render(dataclasses.replace(report, sites=[site], ranks=2), "markdown")
    assert_one_width(text)  # the per-rank column's " | " included
    assert r"\_\_init\_\_.py:3" in text and r"a\|b" in text


def test_bench_and_tune_markdown_tables_keep_their_columns():
    def m(name, parity):
        return Measurement(name, [1.0, 1.1], 0.0, {"for|ward": 1.0}, None, None, parity)

    result = TechniqueResult("tune", "cpu", "baseline", [
        m("baseline", "identical"), m("env:X=a|b", "max abs diff 1|2")], 1, 2)
    assert_one_width(technique_table(result, "markdown"))
    tune = tuned({"env:X": ""}, {"env:X": "a|b"})
    tune.result = result
    text = render_as("tune-script", tune, "markdown")
    assert_one_width(text)
    assert text.startswith("## gpusync tune of x.py")
