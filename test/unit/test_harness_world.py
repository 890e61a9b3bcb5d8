"""The harness's reading of a class statement: what ``self`` gets assigned (``world``), and a class parsed alone
(``judged``: the tool's side)."""

import ast
import textwrap

from sglang_draft_layout.harness import judged, world

CLASS = textwrap.dedent(
    """\
    import x


    @decorated
    class Backend(Base):
        size = 1

        def __init__(self, runner):
            self.a, (self.b, *self.c) = runner.pair
            self.d: int = 0
            self.d += 1
            self.e = self.f = None
            other.g = 1
            print(self.h)
            for self.i in range(2):
                with open(x) as self.j:
                    pass
            try:
                pass
            except ValueError:
                self.k = 1
            match runner:
                case 1:
                    self.l = 2
            rows = [0 for self.m in range(3)]
            self.n[0] = 1

            def inner(self):
                self.o = 1

            return lambda: self.p
    """
)


def every_self_store(node: ast.ClassDef) -> frozenset:
    return frozenset(
        t.attr
        for t in ast.walk(node)
        if isinstance(t, ast.Attribute) and isinstance(t.ctx, ast.Store) and getattr(t.value, "id", "") == "self"
    )


def test_self_stores_are_every_store_context_self_attribute():
    node = ast.parse(CLASS).body[1]
    assert world._self_stores(node) == every_self_store(node)
    assert world._self_stores(node) == set("abcdefijklmo")


def test_a_class_is_parsed_alone_at_its_lines():
    text = CLASS + "\n\ndef after():\n    pass\n"
    node = judged._class_statement(compile(text, "backend.py", "exec"), text, "backend.py", "Backend")
    assert (node.name, node.lineno, node.decorator_list[0].lineno) == ("Backend", 5, 4)
    assert ast.dump(node) == ast.dump(ast.parse(CLASS).body[1])


def test_a_class_not_at_the_margin_is_left_to_the_whole_module():
    text = "if True:\n    class Backend:\n        x = 1\n"
    code = compile(text, "backend.py", "exec")
    assert judged._class_statement(code, text, "backend.py", "Backend") is False
    assert judged._class_statement(code, text, "backend.py", "Other") is None


def test_an_unknown_unpacks_into_as_many_items_as_the_statement_takes():
    """``a, b = x`` and ``a, *b, c = x`` read how many items off the unpacking instruction, a count past 255 (held by
    an ``EXTENDED_ARG`` unit) too; a loop over an unknown takes one item or none, as the run decides."""
    from sglang_draft_layout.harness.unknown import Run, Unknown

    names = [f"v{i}" for i in range(300)]
    namespace = {"x": Unknown("x")}
    exec(f"a, b, c = x\nd, *e, f = x\n{', '.join(names)} = x\n", namespace)
    assert [namespace[n]._name for n in "abcdf"] == ["x[0]", "x[1]", "x[2]", "x[0]", "x[1]"]
    assert namespace["e"] == [] and namespace["v299"]._name == "x[299]"
    for forced, count in (({}, 1), ({"items of x": False}, 0)):
        with Run(forced):
            assert len([item for item in namespace["x"]]) == count
