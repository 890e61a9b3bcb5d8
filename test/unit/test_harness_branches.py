"""harness/branches.py: which way each ``if`` ordering against or equal to a number went in the runs.

``invariant.judge`` runs a probe one past its number (an equality's: at it; ``paths.past``) where one went one way on
every base probe (a fork's ``if num_seqs <= 4:`` around its capacity check: test/releases/test_spelling_properties.py,
``CHECK_FOR_FEWER_BATCHES``), and refuses one still one way whose operand varied.
"""

from __future__ import annotations

import ast
import builtins
import types

from sglang_draft_layout.harness.branches import BRANCH, Branches, comparisons, ordering_lines, with_branches
from sglang_draft_layout.harness.paths import Probe, past
from sglang_draft_layout.harness.unknown import Run

SOURCE = """\
def f(num_seqs, rows):
    if rows is None:
        return "none"
    if num_seqs <= 4:
        return "few"
    elif num_seqs > 1:
        return "many"
    return "one"
"""


def recorded(source: str, filename: str) -> tuple[Branches, dict]:
    """``source`` run with its ``if``s recording to a ``Branches`` (as ``Tree`` builds its modules): both."""
    branches = Branches()
    namespace = {"__builtins__": {**builtins.__dict__, BRANCH: branches}}
    exec(compile(with_branches(ast.parse(source), source, filename), filename, "exec"), namespace)
    return branches, namespace


def test_only_a_comparison_with_a_number_past_what_the_probes_take_or_a_constant_is_recorded():
    tests = ["num_seqs <= 4", "bs > 16", "a and 1 < bs < 8", "4 >= x", "x < MAX_BS", "MAX_BS >= x", "x == 8"]
    tests += ["5 != x", "x == MAX_BS", "x < self.MAX_BS", "cls.LIMIT >= bs"]
    tests += ["x > 1", "x is None", "x == 2", "a < b", "x < Max", "x < self.Max", "x = 8"]
    assert [bool(comparisons(ast.parse(t))) for t in tests] == [True] * 11 + [False] * 7


def test_the_lines_that_may_compare_with_such_a_number_are_found_without_parsing():
    text = "n = 5\nif x == 5:\n    f(n=16)\nif 16 != y or x == 0:\n    pass\nif x==MAX_BS or a <= 4:\n    pass\n"
    text += "if x <= self.MAX_BS:\n    pass\nif cls.LIMIT > x:\n    pass\nif x <= self.max_bs:\n    pass\n"
    assert ordering_lines(text) == [2, 4, 6, 8, 10]


def test_an_arrow_a_shift_and_a_comment_order_against_nothing():
    """What ``ordering_lines`` leaves out holds no comparison (0.5.23's ``# full->SWA ...`` comments sent six
    attention modules to the slow path: parsed whole), and what it keeps holds one."""
    none = ["def f(x) -> SWA:", "x = 1 << 20", "x >>= MAX", "y = a<<B", "# full->SWA", "  # if n > 5:", "f(x)  # n > 5"]
    some = ["s = '#' if n > 5 else ''", "if x <= 4:  # a comment", "if x<-4 or n >=16:", "if a <MAX: f()", "b = MAX> a"]
    assert ordering_lines("\n".join(none + some) + "\n") == list(range(len(none) + 1, len(none) + len(some) + 1))
    in_a_string = 's = """\n# heading """ if n > 5 else ""\n'  # no quote before the #, one after: not cut
    assert ordering_lines(in_a_string) == [2]


def test_each_number_is_recorded_with_its_operand_and_whether_an_equality():
    found = comparisons(ast.parse("a and 1 < bs < 8 or n >= 12 or self.v == 3", mode="eval").body)
    assert sorted((n.value, equal, ast.unparse(o)) for n, equal, o in found) == [(3, True, "self.v"), (8, False, "bs"),
                                                                                (12, False, "n")]  # fmt: skip


def test_the_probes_at_a_value_take_sequences_topk_steps_then_context_within_their_bounds():
    assert past(5) == [Probe(5, 1, 3), Probe(2, 5, 3)]  # 5 steps, context 5: a base probe took them
    assert past(3) == [Probe(2, 3, 3)]  # only topk 3 no base probe took
    assert past(17) == [Probe(17, 1, 3), Probe(2, 17, 3)]  # 17 steps: past the steps' bound
    assert past(101) == [Probe(101, 1, 3), Probe(2, 101, 3), Probe(2, 2, 3, 101)]
    assert past(257) == [Probe(257, 1, 3), Probe(2, 2, 3, 257)]
    assert past((1 << 16) + 1) == []


def test_the_parsed_tree_is_left_as_it_is():
    parsed = ast.parse(SOURCE)
    dumped = ast.dump(parsed, include_attributes=True)
    assert with_branches(parsed, SOURCE, "f.py").body[0] is not parsed.body[0]
    assert ast.dump(parsed, include_attributes=True) == dumped
    plain = "def g(x):\n    if x > 1:\n        return x\n"
    assert with_branches(ast.parse(plain), plain, "g.py").body[0].body[0].test.__class__ is ast.Compare


def test_each_way_is_recorded_in_runs_only():
    branches, namespace = recorded(SOURCE, "f.py")
    f = namespace["f"]
    assert f(9, None) == "none" and f(9, 0) == "many" and branches.ways == {}  # outside a run: module code
    with Run():
        assert (f(1, 0), f(3, 0)) == ("few", "few")
    assert branches.one_way() == [("f.py", 4, "num_seqs <= 4", (5,))]  # its other side: 5 sequences
    with Run():
        assert f(8, 0) == "many"
    assert branches.one_way() == []


def test_an_if_in_a_match_case_or_an_except_is_recorded():
    source = (
        "def f(x, n):\n    match x:\n        case 1:\n            if n <= 4:\n                return 1\n"
        "    try:\n        pass\n    except ValueError:\n        if n > 8:\n            return 2\n"
    )
    module = with_branches(ast.parse(source), source, "f.py")
    assert [node.test.func.id for node in ast.walk(module) if isinstance(node, ast.If)] == [BRANCH, BRANCH]


def test_a_conditional_expression_is_recorded_as_an_if_is():
    """``x if num_seqs <= 12 else y`` is a branch on a layout parameter as an ``if`` is: each way recorded, in any
    expression of a statement (an argument, a comprehension, an assert), not only an ``if``'s test."""
    source = (
        "def f(num_seqs, rows):\n"
        "    width = rows * 2 if num_seqs <= 12 else rows\n"
        "    assert (width > 0) if num_seqs != 5 else True\n"
        "    return [g(n if n < SMALL else 0) for n in range(2)], width\n"
        "SMALL = 16\n"
        "def g(n):\n"
        "    return n\n"
    )
    parsed = ast.parse(source)
    dumped = ast.dump(parsed, include_attributes=True)
    branches, namespace = recorded(source, "f.py")
    assert ast.dump(parsed, include_attributes=True) == dumped
    with Run():
        assert namespace["f"](3, 4) == ([0, 1], 8)
    assert branches.one_way() == [
        ("f.py", 2, "num_seqs <= 12", (13,)),
        ("f.py", 3, "num_seqs != 5", (5,)),
        ("f.py", 4, "n < SMALL", (17,)),
    ]


def test_a_min_or_max_bounding_a_value_by_a_number_is_recorded_as_an_if_is():
    """``min(max_bs, 64)`` orders ``max_bs`` against 64 as ``if max_bs <= 64`` would: each bound recorded (in a call's
    keyword and a comprehension's loop too), its value unchanged; ``min(a, 2)`` (a number the probes pass) and
    ``max(rows)`` are not."""
    source = (
        "def f(bs, rows, steps):\n"
        "    width = min(bs, 64) * rows\n"
        "    cut = dict(row=max(MIN_BS, bs))\n"
        "    return [min(i, 3) for i in range(steps)], width, cut, min(bs, 2), max(rows, bs)\n"
        "MIN_BS = 8\n"
    )
    assert ordering_lines(source) == [2, 3, 4]
    branches, namespace = recorded(source, "f.py")
    with Run():
        assert namespace["f"](3, 4, 2) == ([0, 1], 12, {"row": 8}, 2, 4)
    assert branches.one_way() == [
        ("f.py", 2, "min(bs, 64)", (65,)),
        ("f.py", 3, "max(MIN_BS, bs)", (9,)),
        ("f.py", 4, "min(i, 3)", (4,)),
    ]
    with Run():
        namespace["f"](70, 4, 5)
    assert branches.one_way() == []  # each taken the other way


def test_a_constants_number_is_read_when_the_test_runs():
    source = "SMALL = 12\nTINY = 2\ndef f(num_seqs):\n    if num_seqs <= SMALL:\n        return 1\n    if num_seqs < TINY:\n        return 2\n"
    branches, namespace = recorded(source, "f.py")
    with Run():
        assert namespace["f"](13) is None
    assert branches.one_way() == [("f.py", 4, "num_seqs <= SMALL", (13,))]  # 2: both ways on the base probes


CONFIGURED = """\
class Backend:
    def __init__(self, num_seqs):
        self.num_seqs, self.fa_impl_ver, self.paged = num_seqs, 3, True

    def rows(self):
        if self.fa_impl_ver == 3:
            pass
        if abs(self.fa_impl_ver) == 3:
            pass
        if self.num_seqs != 5:
            return 1
"""

#: ifs of ``CONFIGURED.rows`` whose tests compute a value of their own, or read one that varies, beside one that is
#: configuration
BESIDE = """\
        if self.num_seqs > 10**6 and self.fa_impl_ver == 3:
            pass
        if self.paged and not self.fa_impl_ver != 3:
            pass
        if self.num_seqs in (8, 9) or self.fa_impl_ver == 4:
            pass
        if self.num_seqs and self.fa_impl_ver == 4:
            pass
"""


def test_an_if_one_way_on_a_configuration_value_is_told_from_one_on_a_layout_parameter():
    """``self.fa_impl_ver == 3`` (the same value on every probe, one of another context among them) is configuration,
    not refused (``invariant.judge``); ``self.num_seqs != 5`` (one value a probe) is not, nor an operand not read again
    (a call)."""
    branches, namespace = recorded(CONFIGURED, "b.py")
    for num_seqs, other_context in ((1, False), (3, False), (2, False), (2, True)):
        with Run():
            assert namespace["Backend"](num_seqs).rows() == 1
        if other_context:
            assert [branches.configuration(key) for key in branches.one_way()] == [False] * 3  # the context unmoved
        branches.probed(other_context)
    assert [(key[2], key[3]) for key in branches.one_way()] == [
        ("self.fa_impl_ver == 3", (3,)), ("abs(self.fa_impl_ver) == 3", (3,)), ("self.num_seqs != 5", (5,))
    ]  # fmt: skip
    assert [branches.configuration(key) for key in branches.one_way()] == [True, False, False]


def test_an_if_that_computes_a_value_or_reads_one_that_varies_beside_a_configuration_value_is_not_configuration():
    """``f(bs) and self.fa_impl_ver == 3`` went one way for its call's sake, not the configuration value's: it is
    refused where one way (each of these was taken as configuration before); ``self.paged and not self.fa_impl_ver !=
    3`` reads only configuration values."""
    branches, namespace = recorded(
        CONFIGURED.replace("        if self.num_seqs != 5:", BESIDE + "        if self.num_seqs != 5:"), "b.py"
    )
    for num_seqs, other_context in ((1, False), (3, False), (2, False), (2, True)):
        with Run():
            assert namespace["Backend"](num_seqs).rows() == 1
        branches.probed(other_context)
    configuration = {key[2]: branches.configuration(key) for key in branches.one_way()}
    assert configuration == {
        "self.fa_impl_ver == 3": True,
        "abs(self.fa_impl_ver) == 3": False,
        "self.num_seqs > 10 ** 6 and self.fa_impl_ver == 3": False,
        "self.paged and (not self.fa_impl_ver != 3)": True,
        "self.num_seqs in (8, 9) or self.fa_impl_ver == 4": False,
        "self.num_seqs and self.fa_impl_ver == 4": False,
        "self.num_seqs != 5": False,
    }


def test_an_operand_is_handed_where_the_test_reads_it_never_read_again():
    source = "def f(rows):\n    if rows is not None and rows.n == 5:\n        return 1\n    return 0\n"
    branches, namespace = recorded(source, "f.py")
    with Run():
        assert namespace["f"](None) == 0  # rows.n unread: no AttributeError
        assert namespace["f"](types.SimpleNamespace(n=4)) == 0
    branches.probed(other_context=True)
    assert branches.read == {("f.py", 2): {(bool, False), (bool, True), (int, 4)}}  # of `rows`, whether it is None
