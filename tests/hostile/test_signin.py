"""Hostile cases of the dashboard's sign-in configuration: a secrets file that would let a forged
cookie in is refused before Streamlit starts (the browser test, tests/e2e/test_login_browser.py,
shows a forged cookie kept out with a configured secret)."""

from __future__ import annotations

import pytest

from dashboard import login
from moemeter.cli import main
from tests.dashboard.test_login import AUTH

SECRET = "kq3Vb0hM2yRr7WcXfN9sE4tLpA6uJdZg"


@pytest.mark.parametrize(
    ("value", "why"),
    [
        ("[" + ", ".join(['"x"'] * 40) + "]", "cookie_secret must be a string (in quotes), not a list"),
        ("1" * 40, "cookie_secret must be a string (in quotes), not a int"),
        ("{ a = 1 }", "cookie_secret must be a string"),
        ('"' + "x" * 64 + '"', "repeats a few characters (1 distinct)"),
        ('"' + "ab" * 32 + '"', "repeats a few characters (2 distinct)"),
        ('"' + SECRET[:31] + '"', "shorter than 32 characters"),
    ],
)
def test_a_cookie_secret_anyone_could_sign_with_is_refused(tmp_path, monkeypatch, capsys, value, why) -> None:
    monkeypatch.setenv("HOME", str(tmp_path))
    monkeypatch.chdir(tmp_path)
    (tmp_path / ".streamlit").mkdir()
    secrets = tmp_path / ".streamlit" / "secrets.toml"
    secrets.write_text(AUTH.replace(f'"{SECRET}"', value))
    assert why in (login.config_problem([secrets]) or "")
    assert main(["dashboard", "--require-login", "--port", "1"]) != 0  # never starts
    err = capsys.readouterr().err
    assert why in err and "do-not-print-me" not in err


def test_client_keys_given_as_lists_are_refused(tmp_path) -> None:
    f = tmp_path / "secrets.toml"
    f.write_text(AUTH.replace('client_id = "moemeter"', 'client_id = ["moemeter"]'))
    assert login.config_problem([f]) == "[auth] client_id must be a string (in quotes), not a list"
