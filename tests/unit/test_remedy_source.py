"""gpusync fix's source edits: spliced at exact spans, everything else byte for byte the user's."""
import pytest

from gpusync.remedies.helpers.observe import Facts
from gpusync.remedies.helpers.source import EditError, Source, apply, check

SRC = '''import torch.nn.functional as F
for i in range(3):
    y = F.one_hot(x)  # é, a comment that stays
    z = F.one_hot(
        x,  # its own comment
    )
    w = f()
'''


def test_keywords_are_added_where_a_careful_engineer_would_write_them():
    s = Source("t.py", SRC)
    edits = [s.set_keyword(s.calls_at(3, "one_hot")[0], "num_classes", "N"),
             s.set_keyword(s.calls_at(5, "one_hot")[0], "num_classes", "N"),
             s.set_keyword(s.calls_at(7, "f")[0], "a", "1"),
             s.insert_before(s.loop(s.calls_at(3, "one_hot")[0]), "C = 1")]
    out = apply(SRC, edits)
    check("t.py", out)
    assert out == ('import torch.nn.functional as F\nC = 1\nfor i in range(3):\n'
                   '    y = F.one_hot(x, num_classes=N)  # é, a comment that stays\n'
                   '    z = F.one_hot(\n        x, num_classes=N,  # its own comment\n    )\n'
                   '    w = f(a=1)\n')


def test_a_keyword_is_replaced_or_dropped_with_its_comma():
    s = Source("u.py", "f(a, b=1, c=2)\ng(b=1)\nh(b=1, c=2)\nk(b=3)\n")
    calls = [st.value for st in s.tree.body]
    edits = [s.drop_keyword(c, "b") for c in calls[:3]] + [s.set_keyword(calls[3], "b", "4")]
    assert apply(s.text, edits) == "f(a, c=2)\ng()\nh(c=2)\nk(b=4)\n"


def test_identical_edits_count_once_and_overlapping_ones_are_refused():
    s = Source("t.py", SRC)
    call = s.calls_at(3, "one_hot")[0]
    once = s.set_keyword(call, "num_classes", "N")
    assert apply(SRC, [once, once]) == apply(SRC, [once])
    with pytest.raises(EditError):
        apply(SRC, [s.replace(call, "a"), s.replace(call.args[0], "b")])
    with pytest.raises(EditError):
        check("t.py", "f(")


def test_columns_count_characters_not_utf8_bytes():
    s = Source("t.py", "é = f(x)\n")
    assert apply(s.text, [s.set_keyword(s.calls_at(1, "f")[0], "k", "1")]) == "é = f(x, k=1)\n"


def test_facts_say_whether_every_call_saw_one_value_and_survive_json():
    facts = Facts()
    for value in (10, 10):
        facts.note("one_hot", value, where=("t.py", 3))
    facts.note("tensor", [1], where=("t.py", 4))
    facts.note("tensor", [2], where=("t.py", 4))
    back = Facts.from_json(facts.to_json())
    assert back.at("one_hot", "t.py", 3).constant and back.at("one_hot", "t.py", 3).value == 10
    assert not back.at("tensor", "t.py", 4).constant and back.at("tensor", "t.py", 4).calls == 2
    assert back.at("one_hot", "t.py", 99) is None
