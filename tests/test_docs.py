"""Documentation is part of the contract: every config field and metric family has its line."""

from __future__ import annotations

import ast
import re
import subprocess
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families

from moemeter.contract import FAMILIES, ROLES
from stack.twin.config import load_profile
from stack.twin.server import Twin

ROOT = Path(__file__).parents[1]
METRICS_MD = (ROOT / "docs" / "metrics.md").read_text()


def dataclass_fields_without_docstring(path: Path) -> list[str]:
    missing = []
    for cls in (n for n in ast.parse(path.read_text()).body if isinstance(n, ast.ClassDef)):
        body = cls.body
        for i, node in enumerate(body):
            if isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
                nxt = body[i + 1] if i + 1 < len(body) else None
                documented = (
                    isinstance(nxt, ast.Expr)
                    and isinstance(nxt.value, ast.Constant)
                    and isinstance(nxt.value.value, str)
                )
                if not documented:
                    missing.append(f"{cls.name}.{node.target.id}")
    return missing


def test_every_twin_config_field_has_a_docstring():
    assert dataclass_fields_without_docstring(ROOT / "stack" / "twin" / "config.py") == []


@pytest.fixture(scope="module")
def twin_pages():
    return Twin(load_profile("deepseek-v4.1-flash"), seed=1, start=0.0).pages(20.0)


def test_every_family_the_twin_emits_is_documented(twin_pages):
    missing = set()
    for text in twin_pages.values():
        for fam in text_string_to_metric_families(text):
            if fam.name.startswith(("python_", "process_", "http_")) or fam.name.endswith("_created"):
                continue
            if f"`{fam.name}" not in METRICS_MD:
                missing.add(fam.name)
    assert sorted(missing) == []


def test_every_metric_a_page_reads_is_documented():
    sources = "\n".join(p.read_text() for p in (ROOT / "dashboard").rglob("*.py"))
    sources += "".join("\n" + p.read_text() for p in (ROOT / "warehouse" / "sql").glob("*.sql"))  # what pages run
    read = set(re.findall(r"'((?:vllm:|vllm_router_|DCGM_)[A-Za-z0-9_:]+)'", sources))
    read |= set(re.findall(r'"((?:vllm:|vllm_router_|DCGM_)[A-Za-z0-9_:]+)"', sources))
    assert read, "the pages read no metric?"
    base = {re.sub(r"_(bucket|count|sum)$", "", m) for m in read}
    assert sorted(m for m in base if f"`{m}" not in METRICS_MD) == []


def test_every_family_a_statement_names_is_the_contracts():
    """A quoted family name in warehouse/sql/*.sql ('vllm:...', 'moemeter_...', 'DCGM_...') is a
    family of the contract, or a sample name of one (_bucket, _sum, _count, _total)."""
    statements = "\n".join(p.read_text() for p in (ROOT / "warehouse" / "sql").glob("*.sql"))
    named = set(re.findall(r"'((?:vllm:|vllm_router_|moemeter_|DCGM_|process_)[A-Za-z0-9_:]+)'", statements))
    assert named, "the statements name no family?"
    sample = re.compile(r"_(bucket|sum|count|total)$")
    assert sorted(m for m in named if m not in FAMILIES and sample.sub("", m) not in FAMILIES) == []


def test_every_role_a_statement_names_is_the_contracts_and_pools_are_written_once():
    """A statement compares a target's role only with a role of the contract (`role = 'decode'`,
    the pool whose tokens it counts), and names the two pools together only as {{pools}}."""
    statements = {p.name: p.read_text() for p in (ROOT / "warehouse" / "sql").glob("*.sql")}
    compared = {r for text in statements.values() for r in re.findall(r"\brole\s*=\s*'([^']*)'", text)}
    assert compared and compared <= set(ROLES)
    listed = [n for n, text in statements.items() if re.search(r"IN\s*\(\s*'prefill'\s*,\s*'decode'", text)]
    assert listed == []


def test_nothing_cites_a_file_outside_the_repository():
    """The definitions live in docs/definitions.md; no file names the design notes the project was
    seeded from, or a path outside the repository."""
    tracked = subprocess.run(["git", "ls-files"], cwd=ROOT, capture_output=True, text=True, check=True).stdout.split()
    outside = re.compile(r"DESIGN\.md|\.\./shared|\bshared/(?:fixtures|STYLE|DESIGN)")
    cited = [
        f
        for f in tracked
        if (ROOT / f).is_file()
        and not f.startswith("tests/fixtures/eplb/")
        and outside.search((ROOT / f).read_text(errors="replace"))
    ]
    assert cited == [], cited
    assert "definitions.md" in (ROOT / "README.md").read_text()


def test_every_hostile_test_file_is_in_the_hostile_suites_table_and_every_one_named_exists():
    """docs/hostile.md names each input surface's tests: a new file in tests/hostile/ lands with its
    row, and no row names a test file that is gone."""
    table = [line for line in (ROOT / "docs" / "hostile.md").read_text().splitlines() if line.startswith("| ")]
    rows = [[cell.strip() for cell in line.strip("|").split(" | ")] for line in table[2:]]
    assert rows and all(len(r) == 4 and all(r) for r in rows), "each row: surface, invariant, cases, tests"
    named = {f for r in rows for f in re.findall(r"`(tests/[\w/]+\.py)`", r[3])}
    assert all(re.findall(r"`(tests/[\w/]+\.py)`", r[3]) for r in rows), "a row without a test file"
    assert sorted(f for f in named if not (ROOT / f).is_file()) == []
    hostile = {str(p.relative_to(ROOT)) for p in (ROOT / "tests" / "hostile").glob("test_*.py")}
    assert sorted(hostile - named) == []


def test_docs_index_links_every_doc_and_every_link_resolves():
    """docs/README.md is the index: every file in docs/ has its line there, and every file it links
    to exists."""
    docs = ROOT / "docs"
    index = (docs / "README.md").read_text()
    links = [t.split("#")[0] for t in re.findall(r"\]\(([^)\s]+)\)", index) if "://" not in t]
    linked = {(docs / t).resolve() for t in links if t}
    missing = sorted(t for t in links if t and not (docs / t).is_file())
    assert missing == [], f"docs/README.md links to files that do not exist: {missing}"
    unlisted = sorted(p.name for p in docs.glob("*.md") if p.name != "README.md" and p.resolve() not in linked)
    assert unlisted == [], f"docs/README.md does not link: {unlisted}"


def test_the_readme_table_of_commands_is_the_parsers():
    """Each command's README row is declared beside it (moemeter/cli/), as its --help description."""
    from moemeter.cli.reference import README_BEGIN, README_END, readme_table

    readme = (ROOT / "README.md").read_text()
    begin = readme.index(README_BEGIN)
    table = readme[readme.index("\n", begin) + 1 : readme.index(README_END)]
    assert table == readme_table(), "regenerate it: python -m moemeter.cli.reference --readme"


def test_docs_cli_md_is_the_parsers():
    """docs/cli.md shows every command's usage and every option's flags, default and help."""
    from moemeter.cli.reference import markdown_reference

    assert (ROOT / "docs" / "cli.md").read_text() == markdown_reference(), (
        "regenerate it: python -m moemeter.cli.reference --docs > docs/cli.md"
    )
