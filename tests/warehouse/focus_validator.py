"""The referee of `moemeter report focus`: the FinOps Foundation's own focus-validator 2.2.1
(`make focus-env`), run offline on FOCUS 1.2 with its bundled rules and the applicability
criteria the export declares (warehouse/focus.APPLICABILITY). Its working directory is its own
site-packages folder: it opens `focus_validator/rules/currency_codes.csv` by a relative path."""

from __future__ import annotations

import re
import subprocess
import xml.etree.ElementTree as ET
from dataclasses import dataclass
from pathlib import Path

from warehouse.focus import APPLICABILITY, COLUMNS, VERSION

ROOT = Path(__file__).parents[2]
VENV = ROOT / ".focus-venv"
DEFINITIONS = ROOT / "docs" / "definitions.md"


@dataclass
class Verdict:
    passed: set[str]
    failed: dict[str, str]  # rule id: the validator's message
    skipped: set[str]

    @property
    def mandatory_failed(self) -> dict[str, str]:
        return {rule: msg for rule, msg in self.failed.items() if rule.endswith("-M")}


def ensure() -> None:
    if not (VENV / ".installed").exists():
        subprocess.run(["make", "focus-env"], cwd=ROOT, check=True, timeout=900)


def validate(path: Path, out: Path) -> Verdict:
    """focus-validator's verdict on the file: every rule it ran, by id."""
    ensure()
    [site] = (VENV / "lib").glob("python3.*/site-packages")
    report = out / f"{path.name}.xml"
    run = subprocess.run(
        [
            str(VENV / "bin" / "focus-validator"),
            "--data-file",
            str(path.resolve()),
            "--block-download",
            "--validate-version",
            VERSION,
            "--applicability-criteria",
            ",".join(APPLICABILITY),
            "--output-type",
            "unittest",
            "--output-destination",
            str(report.resolve()),
        ],
        cwd=site,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert run.returncode == 0 and report.exists(), run.stdout[-2000:] + run.stderr[-2000:]
    passed, failed, skipped = set(), {}, set()
    for case in ET.parse(report).iter("testcase"):
        rule = case.get("name", "").split(" ::")[0]
        verdicts = {child.tag: child.get("message", "") for child in case}
        if "failure" in verdicts or "error" in verdicts:
            failed[rule] = verdicts.get("failure") or verdicts.get("error", "")
        elif "skipped" in verdicts:
            skipped.add(rule)
        else:
            passed.add(rule)
    return Verdict(passed, failed, skipped)


def explained() -> set[str]:
    """The rule ids docs/definitions.md explains (its FOCUS export section's table)."""
    text = DEFINITIONS.read_text()
    section = text.split("## FOCUS export", 1)[1].split("\n## ", 1)[0]
    return set(re.findall(r"`([A-Za-z]+-[CD]-\d{3}-[MCO])`", section))


def check(verdict: Verdict) -> None:
    """Zero mandatory violations; every other rule that failed is one the docs explain."""
    assert not verdict.mandatory_failed, verdict.mandatory_failed
    unexplained = set(verdict.failed) - explained()
    assert not unexplained, {rule: verdict.failed[rule] for rule in unexplained}
    unchecked = [
        c for c in COLUMNS if not c.startswith("x_") and not any(r.startswith(f"{c}-C-") for r in verdict.passed)
    ]
    assert not unchecked, f"no rule of these columns passed: did the validator read them? {unchecked}"
