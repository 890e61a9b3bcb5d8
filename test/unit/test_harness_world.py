"""The harness's reading of a module (``Tree.mentions``) and of a class statement: what ``self`` gets assigned
(``world``), and a class parsed alone (``judged``: the tool's side)."""

import ast
import textwrap
from pathlib import Path

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


def test_a_module_searched_for_a_word_is_read_once_as_text_reads_it(tmp_path, monkeypatch):
    """``Tree.mentions`` decodes the bytes it searched where the word is there: the text ``Path.read_text`` gives
    (universal newlines), the file opened once; a module without the word is only searched."""
    package = tmp_path / "sglang"
    package.mkdir()
    (package / "mixed.py").write_bytes("steps = 1\r\nspeculative_num_steps = 2\rother = 3\n# é\n".encode())
    (package / "none.py").write_bytes(b"x = 1\r\n")
    expected = (package / "mixed.py").read_text(encoding="utf-8")
    opened = []
    real_open = Path.open
    monkeypatch.setattr(Path, "open", lambda self, *a, **k: opened.append(self.name) or real_open(self, *a, **k))
    tree = world.Tree(package, None)
    assert tree.mentions("mixed.py", "speculative_num_steps")
    assert tree.text("mixed.py") == expected == "steps = 1\nspeculative_num_steps = 2\nother = 3\n# é\n"
    assert not tree.mentions("none.py", "speculative_num_steps")
    assert "none.py" in tree.scanned and "none.py" not in tree.texts
    assert opened == ["mixed.py", "none.py"]
