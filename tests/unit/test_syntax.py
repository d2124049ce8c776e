"""The remedies' one set of syntax-tree questions (remedies/syntax.py, Source's navigation)
and the one finder of the user's frame (detect/frames.py user_call), on real code."""
from __future__ import annotations

import ast
import os
import textwrap

from gpusync.detect import frames
from gpusync.remedies.helpers import syntax
from gpusync.remedies.helpers.source import Source


def _source(code: str) -> Source:
    return Source("train.py", textwrap.dedent(code))


def _expr(code: str) -> ast.expr:
    return ast.parse(code, mode="eval").body


def _call(source: Source, line: int, name: str) -> ast.Call:
    [call] = [c for c in source.calls_at(line, name) if c.lineno == line]
    return call


# -- the variable an expression starts from ----------------------------------------------------
def test_root_goes_through_attributes_items_stars_and_method_calls():
    assert syntax.root(_expr("x")) == "x"
    assert syntax.root(_expr("x.a.b")) == "x"
    assert syntax.root(_expr("x[0].a")) == "x"
    assert syntax.root(_expr("x.view(-1).detach()")) == "x"
    assert syntax.root(ast.parse("a, *x = y").body[0].targets[0].elts[1]) == "x"


def test_root_of_a_call_of_a_name_or_a_literal_is_none():
    assert syntax.root(_expr("f(x).a")) is None
    assert syntax.root(_expr("[x][0]")) is None
    assert syntax.root(_expr("(1).real")) is None


# -- names read and bound --------------------------------------------------------------------
def test_reads_names_loaded_only():
    tree = ast.parse("y = f(x, cfg.size)\nz += 1")
    assert syntax.reads(tree) == {"f", "x", "cfg"}  # `z +=` stores z: not a Load
    assert syntax.reads(tree, attributes=True) == {"f", "x", "cfg", "cfg.size"}


def test_reads_outside_a_block():
    tree = ast.parse("for i in r:\n    a = b\nc = d")
    loop = tree.body[0]
    assert syntax.reads(tree, skip=loop) == {"d"}
    assert syntax.reads(loop) == {"r", "b"}


def test_bindings_are_stores_and_deletes():
    tree = ast.parse("x = 1\nfor x in r:\n    pass\nprint(x)\ndel x\ny = (x := 2)")
    found = syntax.bindings(tree, {"x"})
    assert sorted((n.lineno, type(n.ctx).__name__) for n in found) == [
        (1, "Store"), (2, "Store"), (5, "Del"), (6, "Store")]
    assert syntax.bindings(tree, {"nothing"}) == []


def test_assigned_counts_targets_items_attributes_and_mutators():
    tree = ast.parse(textwrap.dedent("""
        a = 1
        b.c = 2
        d[0] = 3
        e.append(4)
        f.get("k").append(5)
        import os.path as g, numpy
        def h(): pass
        try:
            pass
        except ValueError as k:
            pass
        print(m)
    """))
    assert syntax.assigned(tree) == {"a", "b", "d", "e", "f", "g", "numpy", "h", "k"}


def test_handed_on_by_argument_or_method():
    tree = ast.parse("sched.step()\nupdate(cfg)\nprint(n + 1)\nlog(x.detach())")
    found = syntax.handed_on(tree, {"sched", "cfg", "n", "x", "unused"})
    assert {k: v.lineno for k, v in found.items()} == {"sched": 1, "cfg": 2, "x": 4}


# -- changes in place --------------------------------------------------------------------------
def test_changes_in_place_each_form():
    for code in ("x += 1", "x[0] = 1", "del x[0]", "x.data = y", "x.add_(1)",
                 "torch.add(a, b, out=x)", "x.view(-1).mul_(2)"):
        tree = ast.parse(code)
        assert any(syntax.changes_in_place(n, {"x"}) for n in ast.walk(tree)), code
    for code in ("y = x + 1", "x = x * 2", "f(x)", "x.__init__()", "z.add_(x)"):
        tree = ast.parse(code)
        assert not any(syntax.changes_in_place(n, {"x"}) for n in ast.walk(tree)), code


def test_changed_in_place_gives_the_first_line_after():
    tree = ast.parse("x.add_(1)\ny = 2\nx[0] = 3\nf(out=\n  x)")
    assert syntax.changed_in_place(tree, "x") == 1
    assert syntax.changed_in_place(tree, "x", after=1) == 3
    assert syntax.changed_in_place(tree, "x", after=3) == 5  # out='s value, not its keyword
    assert syntax.changed_in_place(tree, "y") is None


# -- keywords and literals -----------------------------------------------------------------------
def test_keyword_and_its_value():
    call = _expr("f(a, fused=True, lr=0.1)")
    assert syntax.keyword(call, "fused").arg == "fused"
    assert syntax.keyword_value(call, "lr").value == 0.1
    assert syntax.keyword(call, "foreach") is None
    assert syntax.keyword_value(call, "foreach") is None


def test_literal_reads_true_false_none_only():
    assert syntax.literal(_expr("True")) is True
    assert syntax.literal(_expr("False")) is False
    assert syntax.literal(_expr("None")) is None
    for code in ("1", "0", "'True'", "flag"):
        assert syntax.literal(_expr(code)) is syntax.NOT_LITERAL, code
    assert syntax.literal(None) is syntax.NOT_LITERAL


# -- places in a file --------------------------------------------------------------------------
LOOPS = """\
def train(r):
    for x in make(r):
        while ok(x):
            y = g(x)
        else:
            done(x)
        [h(v) for v in x]
        def inner():
            return q()
async def serve():
    async for x in stream():
        w(x)
"""


def test_loop_around_any_part_or_every_iteration():
    s = _source(LOOPS)
    outer, inner = s.tree.body[0].body[0], s.tree.body[0].body[0].body[0]
    assert s.loop(_call(s, 4, "g")) is inner
    assert s.loop(_call(s, 4, "g"), every_iteration=True) is inner
    assert s.loop(_call(s, 3, "ok"), every_iteration=True) is inner  # a while's test
    assert s.loop(_call(s, 6, "done")) is inner  # in its else...
    assert s.loop(_call(s, 6, "done"), every_iteration=True) is outer  # ...run once per loop
    assert s.loop(_call(s, 2, "make")) is outer  # a for's iterable...
    assert s.loop(_call(s, 2, "make"), every_iteration=True) is None  # ...runs once
    assert s.loop(_call(s, 9, "q")) is None  # a function of its own, defined in the loop
    assert isinstance(s.loop(_call(s, 12, "w"), every_iteration=True), ast.AsyncFor)


def test_function_and_functions_around():
    s = _source(LOOPS)
    train = s.tree.body[0]
    assert s.function(_call(s, 4, "g")) is train
    assert s.functions(_call(s, 4, "g")) == [train, s.tree]
    assert s.function(train) is s.tree
    inner = s.tree.body[0].body[0].body[2]
    assert s.functions(_call(s, 9, "q")) == [inner, train, s.tree]
    assert s.functions(s.tree.body[1].body[0]) == [s.tree.body[1], s.tree]


def test_in_comprehension_below_a_stop():
    s = _source(LOOPS)
    call = _call(s, 7, "h")
    loop = s.loop(call)
    assert syntax.in_comprehension(s, call, loop)
    assert not syntax.in_comprehension(s, _call(s, 4, "g"), loop)
    assert not syntax.in_comprehension(s, call, s.parent(call))  # the stop comes first


def test_calls_by_span_and_by_end():
    s = _source("a = x.to(d), y.to(d)\nb = DataLoader(ds,\n    batch_size=4)\n")
    first, second = sorted(s.calls_at(1, "to"), key=lambda c: c.col_offset)
    assert s.call_at([1, first.col_offset, 1, first.end_col_offset]) is first
    assert s.call_at([1, 0, 1, 1]) is None
    assert s.call_ending(1, (1, second.end_col_offset), ("to", "cuda")) is second
    assert s.call_ending(1, None, ("to",)) is None  # two on the line: not told apart
    loader = s.call_ending(2, None, ("DataLoader",))
    assert loader is not None and loader.end_lineno == 3


def test_fresh_name_avoids_every_token():
    s = _source("x_const = 1\nx_const_2 = 2  # x_const_3 is in a comment only\n")
    assert syntax.fresh_name(s, "x_const") == "x_const_3"
    assert syntax.fresh_name(s, "other") == "other"


def test_insertion_line_above_the_comments_that_introduce():
    s = _source("a = 1\n\n# the loop\n# over batches\nfor b in r:\n    pass\n")
    assert syntax.insertion_line(s, s.tree.body[1]) == 3
    assert syntax.insertion_line(s, s.tree.body[0]) == 1


# -- the user's frame --------------------------------------------------------------------------
def _compiled(path: str, code: str) -> dict:
    space: dict = {"frames": frames}
    exec(compile(textwrap.dedent(code), path, "exec"), space)
    return space


# gpusync's own code (machinery, never the user's) and an installed package's (a library)
_PROBE = _compiled(os.path.join(os.path.dirname(frames.__file__), "probe_for_tests.py"), """
    seen = []
    def probe(*_):
        seen.append(frames.user_call())
        return seen[-1]
""")
_LIBRARY = _compiled("/opt/env/lib/site-packages/somelib/run.py",
                     "def run(fn):\n    return fn()\n")["run"]


def test_user_call_is_the_callers_own_line_when_direct():
    found = frames.user_call(0)
    assert found is not None and found.frame.f_code.co_name == \
        "test_user_call_is_the_callers_own_line_when_direct"
    assert found.direct and not found.through_torch and not found.through_library
    assert found.where == (__file__, found.frame.f_lineno)


def test_user_call_past_gpusync_is_direct():
    found = _PROBE["probe"]()
    assert found.frame.f_code.co_name == "test_user_call_past_gpusync_is_direct"
    assert found.direct


def test_user_call_through_a_library():
    found = _LIBRARY(_PROBE["probe"])
    assert found.frame.f_code.co_name == "test_user_call_through_a_library"
    assert found.through_library and not found.through_torch and not found.direct


def test_user_call_through_torchs_thin_wrappers():
    import torch

    torch.nn.Linear(1, 1).apply(_PROBE["probe"])  # Module.apply: torch's plumbing
    found = _PROBE["seen"][-1]
    assert found.frame.f_code.co_name == "test_user_call_through_torchs_thin_wrappers"
    assert found.through_torch and not found.through_library and not found.direct


def test_user_call_none_without_a_user_frame():
    import threading

    thread = threading.Thread(target=_PROBE["probe"])  # only the standard library's frames
    thread.start()
    thread.join()
    assert _PROBE["seen"][-1] is None


def test_statement_at_is_the_innermost_simple_statement():
    tree = ast.parse("for b in r:\n    x = f(a,\n          b)\n    y = 2\n")
    found = syntax.statement_at(tree, 3)
    assert isinstance(found, ast.Assign) and (found.lineno, found.end_lineno) == (2, 3)
    assert syntax.statement_at(tree, 4).targets[0].id == "y"
    assert syntax.statement_at(tree, 1) is None  # the for's own line: no simple statement


def test_own_nodes_leave_out_what_nested_scopes_hold_but_their_decorators():
    tree = ast.parse(textwrap.dedent("""
        a = 1
        @wrap(b)
        def f(c):
            d = 2
        g = lambda e: e
        class K:
            h = 3
    """))
    names = {n.id for n in syntax.own_nodes(tree) if isinstance(n, ast.Name)}
    assert names == {"a", "wrap", "b", "g"}
    kinds = {type(n).__name__ for n in syntax.own_nodes(tree)}
    assert {"FunctionDef", "Lambda", "ClassDef"} <= kinds
