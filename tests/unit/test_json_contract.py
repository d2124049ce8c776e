"""One JSON contract: every --format json output carries schema_version and kind and is valid
against the schema published in gpusync/schemas (scan, baseline, gate, tune and tune of a
profile are checked where their commands are tested; bench, bench all and overhead here)."""
import json

import jsonschema
import pytest
import torch

from gpusync import schemas
from tests.conftest import check_contract, run_main
from tests.unit.test_overhead import FACTORY

pytestmark = pytest.mark.usefixtures("in_process")


@pytest.mark.parametrize("kind", sorted(schemas.VERSIONS))
def test_every_kind_has_a_valid_schema_naming_its_version(kind):
    doc = schemas.schema(kind)
    jsonschema.Draft202012Validator.check_schema(doc)
    assert doc["$id"] == f"{kind}-{schemas.VERSIONS[kind]}"
    assert doc["properties"]["kind"] == {"const": kind}
    assert doc["properties"]["schema_version"] == {"const": schemas.VERSIONS[kind]}


def test_a_document_that_breaks_its_schema_is_caught():
    with pytest.raises(jsonschema.ValidationError):
        check_contract(schemas.document("gpusync-gate", {"status": "fine"}))


def _fake_technique(device, steps, repeats, progress=None):
    from gpusync.bench.harness import Stepper, Variant, run_technique

    def make():
        state = torch.zeros(2)
        return Stepper(lambda: state.add_(1.0), result=lambda: state.clone())

    return run_technique("fake", [Variant("naive", make), Variant("fast", make)], device,
                         steps=steps, repeats=repeats, progress=progress)


def test_bench_and_bench_all(monkeypatch):
    from gpusync.bench import techniques

    monkeypatch.setitem(techniques.TECHNIQUES, "writeback", _fake_technique)
    proc = run_main("bench", "writeback", "--steps", "1", "--repeats", "2", "--format", "json")
    assert proc.returncode == 0, proc.stderr
    assert check_contract(json.loads(proc.stdout))["technique"] == "fake"

    def unavailable(device, steps, repeats, progress=None):
        from gpusync.errors import Unavailable

        raise Unavailable("needs CUDA streams")

    names = list(techniques.TECHNIQUES)  # `bench all` runs them all: each a fake here
    for name in names:
        monkeypatch.setitem(techniques.TECHNIQUES, name,
                            unavailable if name == "pipeline" else _fake_technique)
    proc = run_main("bench", "all", "--steps", "1", "--repeats", "2", "--format", "json")
    assert proc.returncode == 0, proc.stderr
    data = check_contract(json.loads(proc.stdout))
    assert data["kind"] == "gpusync-bench-all" and len(data["results"]) == len(names) - 1
    assert data["not_run"] == {"pipeline": "needs CUDA streams"}




def test_overhead(tmp_path):
    (tmp_path / "f.py").write_text(FACTORY)
    (tmp_path / "p.yaml").write_text("name: p\nworkload: f.py:make\n")
    proc = run_main("bench", "overhead", "--profile", str(tmp_path / "p.yaml"), "--steps", "2",
                    "--warmup", "1", "--format", "json")
    assert proc.returncode == 0, proc.stderr
    assert check_contract(json.loads(proc.stdout))["kind"] == "gpusync-overhead"


def test_a_script_tunes_statuses_come_from_the_typed_verdicts():
    """A candidate's status and reason in gpusync-tune are read from tune.decide's typed
    verdict, never from its text: results that differ and an approximate candidate left out
    are both `rejected`, a candidate not clearly faster only `run`, and the choice `chosen`."""
    from gpusync import knobs, tune_script
    from gpusync.reporters import render_as
    from gpusync.tune import CandidateStatus, CandidateVerdict, Decision, RunStatus

    names = ["baseline", "fast", "differs", "approximate", "slow"]
    runs = [tune_script.CandidateRun(knobs.KnobCandidate(name, {"env:X": name}),
                                     status=RunStatus.RUN) for name in names]
    decision = Decision("fast", {
        "baseline": CandidateVerdict(CandidateStatus.REFERENCE),
        "fast": CandidateVerdict(CandidateStatus.CHOSEN, "median 20.0% faster than the baseline"),
        "differs": CandidateVerdict(CandidateStatus.DIFFERS,
                                    "results differ from the baseline (x)"),
        "approximate": CandidateVerdict(CandidateStatus.NOT_CONSIDERED, "approximate (x)"),
        "slow": CandidateVerdict(CandidateStatus.NOT_FASTER, "median 1.0% faster")})
    tune = tune_script.ScriptTune("x.py", "gpusync tune x.py", "cpu", {}, runs,
                                  decision=decision)
    data = json.loads(render_as("tune-script", tune, "json"))
    schemas.validator("gpusync-tune").validate(data)
    got = {c["name"]: (c["status"], c["reason"]) for c in data["candidates"]}
    assert got == {
        "baseline": ("run", "the script as it is"),
        "fast": ("chosen", "median 20.0% faster than the baseline"),
        "differs": ("rejected", "results differ from the baseline (x)"),
        "approximate": ("rejected", "not considered: approximate (x)"),
        "slow": ("run", "not clearly faster: median 1.0% faster")}
