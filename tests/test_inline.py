"""The inliner behind the library-free expert (envs/pocketworld/inline.py, issue 27)."""

import pytest

from sage_rl.envs.pocketworld.inline import NotInlinable, inline_solution

SOURCE = '''
def add(a: int, b: int = 10) -> int:
    """Add."""
    total = a + b
    return total


def first_big(values, limit):
    for v in values:
        if v > limit:
            return v


def scaled(x, **kw):
    total = add(x, kw["k"])
    return total * 2
'''


def run(code: str) -> dict:
    scope: dict = {}
    exec(code, scope)
    return scope


def test_a_call_becomes_its_body_with_its_arguments_in_place():
    out = inline_solution(SOURCE, "y = add(1)\nprint(y)")
    assert out == "total = 1 + 10\ny = total\nprint(y)\n"  # constants where the parameters are read
    assert "def" not in out and run(out)["y"] == 11
    out = inline_solution(SOURCE, "n = 2\ny = add(n, b=n)")
    assert out == "n = 2\ntotal = n + n\ny = total\n" and run(out)["y"] == 4  # names too


def test_a_parameter_or_a_name_the_body_rebinds_is_bound_first():
    src = """
def bump(a, step):
    a = a + step
    return a


def plus_x(a):
    x = 1
    return a + x
"""
    out = inline_solution(src, "v = bump(1, 2)")
    assert out == "a = 1\na = a + 2\nv = a\n" and run(out)["v"] == 3  # `a` is assigned: bound
    # the body assigns the argument's own name (the call's target): read at the call, as Python does
    out = inline_solution(src, "x = 5\nx = plus_x(x)")
    assert out == "x = 5\na = x\nx = 1\nx = a + x\n" and run(out)["x"] == 6
    # a list argument (not plain) is bound once, not evaluated where it is read
    assert inline_solution(SOURCE, "y = add([1][0], 2)").startswith("a = [1][0]\n")


def test_nested_calls_are_hoisted_in_order_and_locals_renamed():
    out = inline_solution(SOURCE, "total = 5\nz = add(scaled(total, k=1), total)")
    scope = run(out)
    assert scope["z"] == 17 and scope["total"] == 5  # the callee's `total` did not clobber the caller's
    assert "total_2" in out and "scaled_result" in out


def test_a_return_in_the_last_loop_becomes_a_break():
    out = inline_solution(SOURCE, "w = first_big([1, 5, 9], 4)")
    assert "break" in out and run(out)["w"] == 5


def test_a_discarded_value_is_dropped():
    assert inline_solution(SOURCE, "add(1, 2)") == "total = 1 + 2\n"


@pytest.mark.parametrize(
    "call, what",
    [
        ("x = [add(i) for i in range(3)]", "ListComp"),
        ("x = 0 or add(1)", "BoolOp"),
        ("x = lambda: add(1)", "Lambda"),
        ("while add(0, 0):\n    pass", "while test"),
    ],
)
def test_what_python_evaluates_lazily_is_refused(call, what):
    with pytest.raises(NotInlinable, match=what):
        inline_solution(SOURCE, call)


def test_a_call_in_a_returned_expression_is_hoisted():
    src = SOURCE + '''

def doubled_sum(xs):
    return sum(v * 2 for v in first_big(xs, 0) or [])
'''
    # first_big's value feeds a generator's first iterable (evaluated at once): hoisted, not refused
    out = inline_solution(src.replace("first_big(xs, 0) or []", "[first_big(xs, 0)]"), "r = doubled_sum([3, 4])")
    assert "def" not in out and run(out)["r"] == 6


def test_a_parameter_passed_a_same_named_variable_that_is_renamed_is_still_bound():
    src = '''
def outer(rel):
    return inner(rel)


def inner(rel):
    return rel + 1
'''
    out = inline_solution(src, "rel = 1\nres = outer(rel)")
    assert run(out)["res"] == 2
