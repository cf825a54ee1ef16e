"""The directions README's Layout states, held for every import in the tree (those inside functions
too): the contract is a leaf, the serving side and the read side meet only in it, the pages reach
data only through their read layer, and tests build warehouse files through warehouse code."""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

import pytest

ROOT = Path(__file__).parents[1]
OURS = ("moemeter", "stack", "collectors", "warehouse", "dashboard", "benchmarks")
CONTRACT = "moemeter.contract"
DASHBOARD_READ_LAYER = ("dashboard.data", "dashboard.source")


def module_of(path: Path) -> str:
    parts = path.relative_to(ROOT).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def imports(path: Path, module: str | None = None) -> Iterator[tuple[int, str]]:
    """(line, module) of every import of ours in `path`, relative ones resolved, and every
    importlib.import_module or __import__ of a module named in the code."""
    package = (module or module_of(path)).split(".")
    if path.name != "__init__.py":
        package = package[:-1]
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = ".".join(package[: len(package) - node.level + 1]) if node.level else ""
            module = ".".join(p for p in (base, node.module or "") if p)
            # `from pkg import mod` imports pkg.mod when mod is a module of pkg
            names = [f"{module}.{a.name}" if _is_module(f"{module}.{a.name}") else module for a in node.names]
        elif _dynamic(node):
            names = [node.args[0].value]  # type: ignore[attr-defined]
        else:
            continue
        for name in names:
            if name.split(".")[0] in OURS:
                yield node.lineno, name


def _dynamic(node: ast.AST) -> bool:
    """`importlib.import_module("x")` or `__import__("x")` with the module's name written out."""
    if not (isinstance(node, ast.Call) and node.args and isinstance(node.args[0], ast.Constant)):
        return False
    f = node.func
    name = f.attr if isinstance(f, ast.Attribute) else f.id if isinstance(f, ast.Name) else ""
    return name in ("import_module", "__import__") and isinstance(node.args[0].value, str)


def _is_module(name: str) -> bool:
    p = ROOT.joinpath(*name.split("."))
    return p.with_suffix(".py").is_file() or (p / "__init__.py").is_file()


def sources(*tops: str) -> list[Path]:
    return sorted(p for top in tops for p in (ROOT / top).rglob("*.py") if "build" not in p.parts)


def within(name: str, *prefixes: str) -> bool:
    return any(name == p or name.startswith(p + ".") for p in prefixes)


def breaches(paths: list[Path], allowed: tuple[str, ...]) -> list[str]:
    return [
        f"{p.relative_to(ROOT)}:{line} imports {name}"
        for p in paths
        for line, name in imports(p)
        if not within(name, *allowed)
    ]


def reaching(paths: list[Path], forbidden: tuple[str, ...]) -> list[str]:
    return [
        f"{p.relative_to(ROOT)}:{line} imports {name}"
        for p in paths
        for line, name in imports(p)
        if within(name, *forbidden)
    ]


def test_the_contract_imports_nothing_of_ours():
    assert breaches(sources("moemeter/contract"), (CONTRACT,)) == []


def test_the_stack_imports_only_the_contract():
    """What is observed (the twin, the gateway, the load generator, the local stack) knows the
    contract and itself, never the collectors, the warehouse or the pages."""
    stack = [p for p in sources("stack") if "vllm_plugin" not in p.parts]
    assert breaches(stack, (CONTRACT, "stack")) == []


def test_the_vllm_plugin_imports_nothing_of_ours():
    """It is installed alone into vLLM's environment, where no other part of moemeter is."""
    assert breaches(sources("stack/vllm_plugin"), ("stack.vllm_plugin", "moemeter_vllm_plugin")) == []


def test_the_warehouse_imports_neither_collectors_nor_the_stack():
    """The read side depends on no serving side: what it shares with the gateway is the contract's."""
    assert breaches(sources("warehouse"), (CONTRACT, "warehouse")) == []


def test_collectors_write_through_the_warehouse_and_know_nothing_else():
    assert breaches(sources("collectors"), (CONTRACT, "collectors", "warehouse")) == []


def test_pages_reach_data_only_through_their_read_layer():
    """Views, figures and the app import the warehouse only through dashboard/data and
    dashboard/source.py, which alone import it."""
    pages = [p for p in sources("dashboard") if not within(module_of(p), *DASHBOARD_READ_LAYER)]
    assert breaches(pages, (CONTRACT, "dashboard")) == []
    read_layer = [p for p in sources("dashboard") if within(module_of(p), *DASHBOARD_READ_LAYER)]
    assert breaches(read_layer, (CONTRACT, "dashboard", "warehouse")) == []


def test_nothing_below_the_command_imports_it():
    """`moemeter/cli` is the top: it may import every layer, and no layer imports it."""
    below = sources("moemeter/contract", "stack", "collectors", "warehouse", "dashboard")
    assert reaching(below, ("moemeter.cli", "moemeter.__main__")) == []


@pytest.mark.parametrize("folder", ["tests/warehouse", "tests/dashboard"])
def test_warehouse_fixtures_are_built_by_warehouse_code(folder):
    """Fixtures of the read side are files made by the warehouse's own writers (Ingestor,
    RequestIngestor, the twin's fast-forward as a function), not by running the command."""
    fixtures = [p for p in (ROOT / folder).rglob("conftest.py")] + [p for p in (ROOT / folder).glob("*rack*.py")]
    assert fixtures
    assert reaching(fixtures, ("moemeter.cli", "moemeter.__main__")) == []


def test_the_checks_see_every_layer():
    """A check that reads no file cannot fail: each layer has modules, and the resolver finds
    imports in them."""
    for top in ("moemeter/contract", "stack", "collectors", "warehouse", "dashboard"):
        paths = sources(top)
        assert paths, top
        assert any(True for p in paths for _ in imports(p)), top


def test_a_module_imported_by_its_name_is_an_import(tmp_path):
    """importlib.import_module("warehouse.db") in the stack is an import like `import warehouse.db`."""
    path = tmp_path / "probe.py"
    path.write_text('import importlib\nimportlib.import_module("warehouse.db")\n__import__("collectors.service")\n')
    assert [name for _, name in imports(path, "stack.probe")] == ["warehouse.db", "collectors.service"]
