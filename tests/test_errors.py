"""Every error a user sees has one base (moemeter/contract/errors.py), which the CLI prints without a
traceback: an error class that forgets it would reach a user as a stack trace."""

from __future__ import annotations

import importlib
import inspect
import pkgutil

import moemeter
from moemeter.contract.errors import MoemeterError

PACKAGES = ("moemeter", "collectors", "warehouse", "dashboard", "stack")
# Raised and caught inside one module, never shown as they are: a scrape's failure becomes the
# target's `error`, a refusal an HTTP answer, a non-plain page the strict parser's fallback.
INTERNAL = {"ScrapeError", "Refused", "_Refusal", "_NotPlain"}


def error_classes() -> dict[str, type]:
    found: dict[str, type] = {}
    for package in PACKAGES:
        root = importlib.import_module(package)
        for info in pkgutil.walk_packages(root.__path__, package + "."):
            if info.name.endswith("__main__") or ".vllm_plugin" in info.name or info.name.startswith("dashboard.pages"):
                continue  # the plugin runs inside vLLM without moemeter; pages are scripts
            module = importlib.import_module(info.name)
            for name, cls in inspect.getmembers(module, inspect.isclass):
                if issubclass(cls, Exception) and cls.__module__ == module.__name__:
                    found[f"{module.__name__}.{name}"] = cls
    return found


def test_every_error_a_user_sees_is_a_moemeter_error():
    classes = error_classes()
    assert len(classes) > 15, sorted(classes)
    stray = [n for n, c in classes.items() if not issubclass(c, MoemeterError) and n.rsplit(".", 1)[1] not in INTERNAL]
    assert stray == []
    assert moemeter.__name__ == "moemeter"
