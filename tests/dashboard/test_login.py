"""Sign-in: off by default; when required, nothing but the sign-in prompt until signed in;
`dashboard --require-login` refuses a missing or incomplete [auth] configuration."""

from __future__ import annotations

from pathlib import Path

from streamlit.testing.v1 import AppTest

from dashboard import login
from moemeter.cli import main

APP = str(Path(__file__).parents[2] / "dashboard" / "app.py")
AUTH = """[auth]
redirect_uri = "http://localhost:8501/oauth2callback"
cookie_secret = "a-long-random-string"
client_id = "moemeter"
client_secret = "do-not-print-me"
server_metadata_url = "https://idp.example/.well-known/openid-configuration"
"""


def test_when_required_only_the_sign_in_prompt_shows(empty_api, monkeypatch):
    monkeypatch.setenv(login.LOGIN_ENV, "1")
    at = AppTest.from_file(APP, default_timeout=60)
    at.run()
    assert not at.exception
    assert [b.label for b in at.button] == ["Log in"]
    assert "Sign in" in at.info[0].value
    assert not at.metric and not at.dataframe  # no page ran


def test_off_by_default_the_pages_render(empty_api, monkeypatch):
    monkeypatch.delenv(login.LOGIN_ENV, raising=False)
    at = AppTest.from_file(APP, default_timeout=60)
    at.run()
    assert not at.exception
    assert "Log in" not in [b.label for b in at.button]


def test_configuration_is_checked_without_echoing_secrets(tmp_path):
    f = tmp_path / "secrets.toml"
    assert "no [auth] section" in (login.config_problem([f]) or "")
    f.write_text(AUTH.replace('client_secret = "do-not-print-me"\n', ""))
    assert login.config_problem([f]) == "[auth] lacks client_secret"
    f.write_text(AUTH)
    assert login.config_problem([f]) is None
    provider = "[auth]\nredirect_uri = 'x'\ncookie_secret = 'y'\n[auth.google]\n" + AUTH.split("\n", 3)[3]
    f.write_text(provider)
    assert login.config_problem([f]) is None  # a named provider holds the client keys
    f.write_text("[auth\nbroken")
    assert str(f) in (login.config_problem([f]) or "")


def test_require_login_refuses_an_unconfigured_dashboard(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("HOME", str(tmp_path))
    monkeypatch.chdir(tmp_path)
    assert main(["dashboard", "--require-login", "--port", "1"]) != 0
    err = capsys.readouterr().err
    assert "--require-login: no [auth] section" in err and "README" in err
    (tmp_path / ".streamlit").mkdir()
    (tmp_path / ".streamlit" / "secrets.toml").write_text(AUTH.replace("cookie_secret", "cookie"))
    assert main(["dashboard", "--require-login", "--port", "1"]) != 0
    err = capsys.readouterr().err
    assert "lacks cookie_secret" in err and "do-not-print-me" not in err
