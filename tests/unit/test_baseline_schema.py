"""Baselines are checked against gpusync/schemas/baseline.schema.json: what the gate cannot judge
is refused (exit 2) in one line naming the file and the JSON path of the offending value."""
import copy
import json

import pytest

from gpusync import baseline
from gpusync.errors import BadInput

VALID = {
    "schema_version": 6, "kind": "gpusync-baseline", "target": "train.py", "mode": "simulate",
    "device": "cpu", "torch": "2.5.0", "gpusync": "0.1.0", "commit": None,
    "created": "2026-01-01T00:00:00+00:00", "steps": 8, "warmup": 1, "measured_steps": 8,
    "syncs_per_step": 1.0, "max_syncs_per_step": 1, "syncs_by_phase": {"other": 1.0},
    "sites": [{"key": "item | other | - | train.py | <module>", "op": "item", "phase": "other",
               "hook": None, "module": None, "file": "train.py", "function": "<module>",
               "lines": [8], "per_step": 1.0, "margin": 0.0, "fix": "keep it on the device"}],
    "timing": {"device": "cpu", "samples_ms": [1.0, 2.0, 3.0]},
}


def write(tmp_path, text: str) -> str:
    path = tmp_path / "base.json"
    path.write_text(text)
    return str(path)


def load_error(tmp_path, text: str) -> str:
    path = write(tmp_path, text)
    with pytest.raises(BadInput) as e:
        baseline.load(path)
    message = str(e.value)
    assert "\n" not in message and message.startswith(f"baseline {path} "), message
    assert e.value.exit_code == 2
    return message


def changed(mutate) -> str:
    data = copy.deepcopy(VALID)
    mutate(data)
    return json.dumps(data)  # writes NaN / Infinity / -Infinity as such


def test_a_valid_baseline_loads(tmp_path):
    assert baseline.load(write(tmp_path, json.dumps(VALID))) == VALID


def test_steps_null_older_files_and_informational_keys_are_accepted(tmp_path):
    data = copy.deepcopy(VALID)
    data["steps"] = None  # no --steps: the script ran to its end
    del data["measured_steps"]  # older files
    del data["timing"]
    data["future_info"] = {"anything": [1, "two"]}
    data["sites"][0]["future_field"] = "x"
    assert baseline.load(write(tmp_path, json.dumps(data)))["steps"] is None


@pytest.mark.parametrize("mutate,expected", [
    (lambda d: d["sites"][0].update(per_step=float("nan")),
     "is invalid: sites[0].per_step: NaN is not a number"),
    (lambda d: d.update(syncs_per_step=float("inf")),
     "is invalid: syncs_per_step: Infinity is not a number"),
    (lambda d: d["timing"]["samples_ms"].append(float("-inf")),
     "is invalid: timing.samples_ms[3]: -Infinity is not a number"),
    (lambda d: d["syncs_by_phase"].update(backward=float("nan")),
     "is invalid: syncs_by_phase.backward: NaN"),
    (lambda d: d.update(extra=[1, {"x": float("nan")}]),  # anywhere, informational keys too
     "is invalid: extra[1].x: NaN"),
])
def test_nan_and_infinities_are_refused_where_they_are(tmp_path, mutate, expected):
    assert expected in load_error(tmp_path, changed(mutate))


def test_a_number_too_large_for_a_float_is_refused(tmp_path):
    text = json.dumps(VALID).replace('"margin": 0.0', '"margin": 1e400')
    assert "is invalid: sites[0].margin: 1e400 is too large" in load_error(tmp_path, text)


def test_a_key_given_twice_is_refused(tmp_path):
    text = json.dumps(VALID).replace('"per_step": 1.0', '"per_step": 1.0, "per_step": 9.0')
    assert "is invalid: sites[0].per_step: key 'per_step' is given twice" in load_error(
        tmp_path, text)


def test_two_sites_with_one_key_are_refused(tmp_path):
    text = changed(lambda d: d["sites"].append(dict(d["sites"][0], lines=[9])))
    assert "is invalid: sites[1].key: 'item | other | - | train.py | <module>' is also the key " \
           "of sites[0]" in load_error(tmp_path, text)


@pytest.mark.parametrize("mutate,expected", [
    # booleans where counts and numbers belong
    (lambda d: d["sites"][0].update(per_step=True),
     "sites[0].per_step: True is not of type 'number'"),
    (lambda d: d["sites"][0].update(margin=False), "sites[0].margin: False is not of type"),
    (lambda d: d.update(syncs_per_step=True), "syncs_per_step: True is not of type"),
    (lambda d: d.update(steps=True), "steps: True is not of type"),
    (lambda d: d.update(warmup=False), "warmup: False is not of type"),
    (lambda d: d.update(measured_steps=True), "measured_steps: True is not of type"),
    (lambda d: d.update(max_syncs_per_step=True), "max_syncs_per_step: True is not of type"),
    (lambda d: d["timing"]["samples_ms"].__setitem__(1, True), "timing.samples_ms[1]: True"),
    (lambda d: d["sites"][0]["lines"].append(True), "sites[0].lines[1]: True"),
    # negative counts
    (lambda d: d["sites"][0].update(per_step=-1), "sites[0].per_step: -1 is less than"),
    (lambda d: d["sites"][0].update(margin=-0.5), "sites[0].margin: -0.5 is less than"),
    (lambda d: d.update(syncs_per_step=-1), "syncs_per_step: -1 is less than"),
    (lambda d: d.update(warmup=-1), "warmup: -1 is less than"),
    (lambda d: d.update(measured_steps=-1), "measured_steps: -1 is less than"),
    (lambda d: d.update(steps=0), "steps: 0 is less than the minimum of 1"),
    (lambda d: d["syncs_by_phase"].update({"odd phase": -2}), 'syncs_by_phase["odd phase"]: -2'),
    # wrong types
    (lambda d: d.update(steps=2.5), "steps: 2.5 is not of type"),
    (lambda d: d.update(sites={}), "sites: {} is not of type 'array'"),
    (lambda d: d["sites"][0].update(key=1), "sites[0].key: 1 is not of type 'string'"),
    (lambda d: d["sites"][0].update(fix=["x"]), "sites[0].fix: ['x'] is not of type 'string'"),
    (lambda d: d.update(target=3), "target: 3 is not of type"),
    (lambda d: d.update(mode="gpu"), "mode: 'gpu' is not one of"),
    (lambda d: d.update(timing=[1.0]), "timing: [1.0] is not of type 'object'"),
    # missing keys
    (lambda d: d.pop("sites"), "top level: 'sites' is a required property"),
    (lambda d: d.pop("warmup"), "top level: 'warmup' is a required property"),
    (lambda d: d.pop("syncs_per_step"), "top level: 'syncs_per_step' is a required property"),
    (lambda d: d["sites"][0].pop("per_step"), "sites[0]: 'per_step' is a required property"),
    (lambda d: d["timing"].pop("samples_ms"), "timing: 'samples_ms' is a required property"),
])
def test_schema_violations_name_the_json_path(tmp_path, mutate, expected):
    message = load_error(tmp_path, changed(mutate))
    assert f"is invalid: {expected}" in message, message


@pytest.mark.parametrize("version", [1, 2, 3, 4, 5, 7, "6", True, None])
def test_only_the_schema_version_this_gpusync_reads(tmp_path, version):
    text = changed(lambda d: d.update(schema_version=version) if version is not None
                   else d.pop("schema_version"))
    message = load_error(tmp_path, text)
    assert f"has schema_version {version!r}; this gpusync reads 6" in message
    assert "record it again with `gpusync baseline`" in message


def test_a_long_offending_value_still_makes_one_short_line(tmp_path):
    text = changed(lambda d: d.update(sites={f"site {i}\nx": i for i in range(500)}))
    message = load_error(tmp_path, text)
    assert len(message) < 400 and message.endswith("is not of type 'array'")


@pytest.mark.parametrize("text,expected", [
    ("{not json", "is corrupt: Expecting property name"),
    ("[" * 100000 + "]" * 100000, "is corrupt"),
    ("[1, 2]", "is not a gpusync baseline"),
    ('{"kind": "gpusync-baseline", "kind": "gpusync-baseline"}', "is not a gpusync baseline"),
])
def test_what_is_not_a_baseline(tmp_path, text, expected):
    assert expected in load_error(tmp_path, text)
