"""compose.yaml cannot run here (no Docker engine): check it against the CLI it drives."""

from __future__ import annotations

from pathlib import Path

import yaml

from moemeter.cli import build_parser

ROOT = Path(__file__).parents[1]


def test_compose_services_run_valid_moemeter_commands():
    spec = yaml.safe_load((ROOT / "compose.yaml").read_text())
    services = spec["services"]
    assert set(services) == {"twin", "collector", "dashboard"}
    parser = build_parser()
    for name, svc in services.items():
        args = parser.parse_args(svc["command"])  # raises SystemExit on a bad command line
        assert args.command == {"twin": "twin", "collector": "serve", "dashboard": "dashboard"}[name]
        assert svc["build"] == "." and "twin" in svc["profiles"]


def test_one_writer_and_published_ports_on_loopback_only():
    spec = yaml.safe_load((ROOT / "compose.yaml").read_text())
    writers = [n for n, s in spec["services"].items() if any(v.startswith("data:") for v in s.get("volumes", []))]
    assert writers == ["collector"]
    for svc in spec["services"].values():
        for port in svc.get("ports", []):
            assert port.startswith("127.0.0.1:")
    dockerfile = (ROOT / "Dockerfile").read_text()
    for package in ("moemeter", "stack", "collectors", "warehouse", "dashboard"):
        assert f"COPY {package} ./{package}" in dockerfile
