"""The lazily parsed tree equals ast.parse's once every body is read, whatever the layout."""

from __future__ import annotations

import ast
import textwrap

import pytest

from ckptlint.lazy_tree import UNPARSABLE, LazyFunctionDef, check_unparsed_bodies, parse_lazily
from ckptlint.source import split_lines

LAYOUTS = {
    "plain": """
        import torch
        def f(x):
            return x
        class C(Base, metaclass=M):
            attribute = 1
            def method(self):
                return 2
        """,
    "decorators over several lines": """
        @decorate(
            "text",
        )
        @other
        class C:
            pass
        @property
        def g():  # comment after the colon
            return 1  # trailing comment
        # a comment at column 0 after a definition
        x = 1
        """,
    "definition-looking lines inside strings": '''
        def f():
            """Example:
        def not_a_function():
            pass
        class NotAClass:
        """
            return 1
        TEXT = """
        def inside():
        """
        ''',
    "column-0 line inside brackets": """
        def f():
            return g(
        1)
        y = 2
        """,
    "else and except at column 0": """
        if a:
            def f():
                pass
        else:
            def f():
                return 1
        try:
            import x
        except ImportError:
            x = None
        """,
    "one-line definitions and async": """
        def f(): return 1
        class C: pass
        async def g(
            a,
            b,
        ) -> int:
            await a
        """,
    "form feed and backslash continuation": (
        "def f():\n    return 1\n\x0c\nx = 1 + \\\n2\ndef g():\n    pass\n"
    ),
    "old Mac line ends": "def f():\r    return 1\rx = 2\r",
    "file without final newline": "def f():\n    return 1",
    "colons inside a header": """
        @(lambda f: f)
        def f(x=lambda y: y, z: dict[str, int] = {"a:": 1}, w=a[1:2]) -> "T:":  # c: d
            return x
        class C(B, metaclass=M):  # note: x
            def m(self, s=":", t=r"\\":", u=b'#:'):
                return s
        def g(
            a: int = (1 if b else 2),
        ) -> list[
            int
        ]:
            return a
        def h(s='''a:
        b'''):
            return s
        """,
}


def materialized_dump(tree: ast.AST) -> str:
    return ast.dump(tree, include_attributes=True)


@pytest.mark.parametrize("source", LAYOUTS.values(), ids=LAYOUTS.keys())
@pytest.mark.parametrize("interesting", [(), (2,), (1, 3, 5, 7)])
def test_lazy_tree_equals_ast_parse(source: str, interesting: tuple[int, ...]) -> None:
    text = textwrap.dedent(source).lstrip("\n") if source.startswith("\n") else source
    lazy = parse_lazily(text, split_lines(text), "m.py", interesting)
    assert materialized_dump(lazy) == materialized_dump(ast.parse(text))


def test_bodies_are_parsed_only_when_read() -> None:
    text = "import torch\n\ndef f(x):\n    return x\n"
    tree = parse_lazily(text, split_lines(text), "m.py", ())
    stub = tree.body[1]
    assert isinstance(stub, LazyFunctionDef) and isinstance(stub, ast.FunctionDef)
    assert stub._parsed_body is None
    assert (stub.name, stub.lineno, stub.end_lineno) == ("f", 3, 4)
    assert isinstance(stub.body[0], ast.Return)


def test_a_body_that_does_not_match_its_stub_is_the_whole_texts() -> None:
    """A stub that said something else than the body (a split gone wrong) takes the body
    and the end the whole text's tree gives that definition: laziness never changes a tree."""
    text = "def f():\n    return 1\n"
    tree = parse_lazily(text, split_lines(text), "m.py", ())
    stub = tree.body[0]
    stub.end_lineno = 5
    assert ast.dump(stub.body[0]) == ast.dump(ast.parse(text).body[0].body[0])  # type: ignore[attr-defined]
    assert stub.end_lineno == 2


def test_a_body_that_does_not_parse_is_unknown_code_and_its_files_error() -> None:
    """Read by the analysis, a body with a syntax error returns what cannot be known (its
    callers' analysis goes on); the file's own check raises the error ast.parse raises."""
    text = "import torch\n\ndef f(x):\n    return x +\n\ndef g(x):\n    return x\n"
    tree = parse_lazily(text, split_lines(text), "m.py", ())
    (statement,) = tree.body[1].body  # type: ignore[attr-defined]
    assert isinstance(statement, ast.Return) and isinstance(statement.value, ast.Name)
    assert statement.value.id == UNPARSABLE
    with pytest.raises(SyntaxError) as raised:
        check_unparsed_bodies(tree, text, "m.py")
    assert raised.value.lineno == 4


UNREAD_BODY_ERRORS = {
    "missing operand": "def unrelated(x):\n    return x +\n",
    "bad indentation": "def unrelated(x):\n    y = 1\n      z = 2\n",
    "unclosed bracket at the end": "class Unrelated:\n    def f(self):\n        return (1,\n",
    "bad syntax after a multi-line string": 'def unrelated():\n    """doc\n    """\n    1 +\n',
}


@pytest.mark.parametrize("body", UNREAD_BODY_ERRORS.values(), ids=UNREAD_BODY_ERRORS.keys())
def test_syntax_error_in_a_body_no_rule_reads_is_reported(body: str) -> None:
    """The lazy parser never builds this body, yet its error is CKP901 at the very place
    ast.parse names."""
    from tests.conftest import lint

    source = (
        "import torch.utils.checkpoint as cp\n\n"
        + body
        + "\ndef forward(self, x):\n    return cp.checkpoint(self.block, x, use_reentrant=False)\n"
    )
    with pytest.raises(SyntaxError) as expected:
        ast.parse(source)
    (finding,) = lint(source)
    assert finding.code == "CKP901"
    assert (finding.line, finding.column) == (expected.value.lineno, expected.value.offset)


def test_a_wrong_split_is_not_a_syntax_error() -> None:
    """``1)`` at the start of a line looks like a new top-level statement: the chunks do not
    parse on their own, but the file does, so nothing is reported."""
    from tests.conftest import lint

    source = (
        "import torch.utils.checkpoint as cp\n\n"
        "def helper(x):\n    y = (\n1)\n    return y\n\n"
        "def forward(self, x):\n    return cp.checkpoint(self.block, x, use_reentrant=False)\n"
    )
    assert lint(source) == []
