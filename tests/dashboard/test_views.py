"""Every page script: Streamlit's "magic" writes any bare expression of a page onto the page, so a
string statement other than the module's docstring (a constant's docstring, say) shows up on it."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

VIEWS = sorted((Path(__file__).parents[2] / "dashboard" / "views").glob("*.py"))


@pytest.mark.parametrize("page", VIEWS, ids=[p.name for p in VIEWS])
def test_no_page_writes_a_stray_string(page: Path):
    body = ast.parse(page.read_text()).body
    stray = [
        node.lineno
        for node in body[1:]  # the module docstring is not written
        if isinstance(node, ast.Expr) and isinstance(node.value, ast.Constant) and isinstance(node.value.value, str)
    ]
    assert not stray, f"{page.name}: a bare string at line {stray} would be shown on the page"
