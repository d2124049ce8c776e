"""Bounded input: every YAML file gpusync reads (a profile, `gpusync run`'s tuned settings) is
read within bounds. A few hundred bytes of nested aliases stand for billions of values; such a
file, a recursive alias, a document nested thousands deep and a file past the size limit are
refused with one line and exit 2, having done work in proportion to the file's length (the
bombs below would take minutes to expand). A value of the wrong type says what it must be."""
import pytest

from gpusync import yamlfile
from gpusync.errors import BadInput
from gpusync.profiles import load_profile
from gpusync.tune_script import load_tuned
from tests.conftest import run_main, stderr_lines

pytestmark = pytest.mark.usefixtures("in_process")

TUNED_HEAD = "kind: gpusync-tune\nschema_version: 1\n"
RAN = "open('ran', 'w').close()\n"


def laughs(levels: int = 12, width: int = 9) -> str:
    """The billion laughs: `width ** levels` values (12 levels of 9: 2.8e11) in ~700 bytes."""
    lines = [f"l0: &l0 [{', '.join(['lol'] * width)}]"]
    lines += [f"l{i}: &l{i} [{', '.join([f'*l{i - 1}'] * width)}]" for i in range(1, levels)]
    return "\n".join("  " + line for line in lines) + "\n"


def merges(levels: int = 40) -> str:
    """Merge keys (`<<: *a`) and aliases that double at each level: 2 ** 40 values."""
    lines = ["  m0: &m0 {x: 1, y: 2}"]
    lines += [f"  m{i}: &m{i} {{<<: *m{i - 1}, k: [*m{i - 1}, *m{i - 1}]}}"
              for i in range(1, levels)]
    return "\n".join(lines) + "\n"


BOMBS = {"billion laughs": laughs(), "merge keys": merges()}


def test_the_measure_counts_what_aliases_stand_for_without_expanding_them():
    import yaml

    node = yaml.compose(laughs(levels=3, width=3), Loader=yaml.SafeLoader)
    # the mapping and its 3 keys; l0: a list of 3 (4 nodes), l1: 1 + 3 x 4, l2: 1 + 3 x 13
    assert yamlfile.expanded_size(node, limit=10**6) == 1 + 3 + 4 + 13 + 40
    with pytest.raises(yamlfile.TooLarge, match="more than 50 values"):
        yamlfile.expanded_size(node, limit=50)


@pytest.mark.parametrize("bomb", list(BOMBS))
def test_a_profile_that_is_an_alias_bomb_is_refused(tmp_path, bomb):
    path = tmp_path / "profile.yaml"
    path.write_text("name: x\nworkload: w.py:make\nargs:\n" + BOMBS[bomb])
    assert path.stat().st_size < 4096
    with pytest.raises(BadInput, match="more than 100000 values once its aliases are expanded"):
        load_profile(path)
    proc = run_main("scan", "profile.yaml", cwd=tmp_path)
    assert proc.returncode == 2 and len(stderr_lines(proc)) == 1, proc.stderr
    assert "is refused: more than 100000 values" in proc.stderr


def test_tuned_settings_that_are_an_alias_bomb_are_refused_before_the_script_runs(tmp_path):
    (tmp_path / "tuned.yaml").write_text(TUNED_HEAD + "settings:\n" + laughs())
    (tmp_path / "x.py").write_text(RAN)
    proc = run_main("run", "tuned.yaml", "python", "x.py", cwd=tmp_path)
    assert proc.returncode == 2, proc.stderr
    assert stderr_lines(proc) == ["gpusync: error: tuned settings tuned.yaml is refused: more "
                                  "than 100000 values once its aliases are expanded"]
    assert not (tmp_path / "ran").exists()


@pytest.mark.parametrize("text,message", [
    ("name: &n [*n]\nworkload: a:b\n", "a recursive alias (line 1)"),
    ("name: x\nworkload: a:b\nargs: {a: " + "[" * 5000 + "]" * 5000 + "}\n",
     "nested too deeply"),
    ("name: x\nworkload: a:b\n" + "#" * (2 << 20) + "\n", "larger than 1024 KiB"),
])
def test_recursion_depth_and_size_are_bounded(tmp_path, text, message):
    path = tmp_path / "p.yaml"
    path.write_text(text)
    with pytest.raises(BadInput, match=message.replace("(", r"\(").replace(")", r"\)")):
        load_profile(path)


def test_an_endless_file_is_read_no_further_than_the_limit(tmp_path):
    (tmp_path / "p.yaml").symlink_to("/dev/zero")
    with pytest.raises(BadInput, match="larger than 1024 KiB"):
        load_profile(tmp_path / "p.yaml")


@pytest.mark.parametrize("value,read", [("1", "1 (int)"), ("010", "8 (int)"),
                                        ("yes", "True (bool)"), ("[1]", "[1] (list)"),
                                        ("", "None (NoneType)")])
def test_a_hand_edited_value_that_yaml_reads_as_no_string_says_it_must_be_one(tmp_path, value,
                                                                              read):
    (tmp_path / "t.yaml").write_text(TUNED_HEAD + f"settings:\n  env:FAST: {value}\n")
    (tmp_path / "x.py").write_text(RAN)
    proc = run_main("run", "t.yaml", "python", "x.py", cwd=tmp_path)
    assert proc.returncode == 2, proc.stderr
    assert stderr_lines(proc) == [f"gpusync: error: t.yaml: knob 'env:FAST' must be a string, "
                                  f"and YAML read {read}: quote it: env:FAST: \"...\""]
    assert not (tmp_path / "ran").exists()


def test_a_quoted_value_is_used_as_written(tmp_path):
    (tmp_path / "t.yaml").write_text(TUNED_HEAD + 'settings:\n  env:FAST: "010"\n')
    assert load_tuned(str(tmp_path / "t.yaml")) == {"env:FAST": "010"}
    (tmp_path / "x.py").write_text("import os\nassert os.environ['FAST'] == '010'\n" + RAN)
    proc = run_main("run", "t.yaml", "python", "x.py", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert (tmp_path / "ran").exists()


def test_a_hand_edited_name_a_shell_cannot_take_is_refused(tmp_path):
    (tmp_path / "t.yaml").write_text(TUNED_HEAD + 'settings:\n  "env:FAST X": "1"\n')
    with pytest.raises(BadInput, match="'FAST X' is not an environment variable name"):
        load_tuned(str(tmp_path / "t.yaml"))
