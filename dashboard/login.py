"""Optional sign-in with Streamlit's built-in OIDC login (st.login).

`moemeter dashboard --require-login` (or MOEMETER_DASHBOARD_LOGIN=1) turns it on; the
identity provider is configured in Streamlit's secrets file under [auth] (README, Security).
"""

from __future__ import annotations

import os
import tomllib
from pathlib import Path

import streamlit as st

LOGIN_ENV = "MOEMETER_DASHBOARD_LOGIN"
AUTH_KEYS = ("redirect_uri", "cookie_secret", "client_id", "client_secret", "server_metadata_url")
MIN_COOKIE_SECRET = 32  # characters; Streamlit signs the sign-in cookie with it (an empty one lets anyone forge it)
MIN_COOKIE_SECRET_SYMBOLS = 12  # distinct characters in it; token_urlsafe(32)'s 43 hold about 32


def required() -> bool:
    return os.environ.get(LOGIN_ENV) == "1"


def secrets_files(cwd: Path | None = None) -> list[Path]:
    """Where Streamlit reads secrets: the user's, then the working directory's."""
    return [Path.home() / ".streamlit" / "secrets.toml", (cwd or Path.cwd()) / ".streamlit" / "secrets.toml"]


def config_problem(files: list[Path]) -> str | None:
    """Why sign-in cannot work with these secrets files, or None. Never echoes a secret."""
    auth: dict[str, object] = {}
    for f in files:
        if f.is_file():
            try:
                auth.update(tomllib.loads(f.read_text()).get("auth") or {})
            except (OSError, tomllib.TOMLDecodeError) as exc:
                return f"{f}: {exc}"
    if not auth:
        return f"no [auth] section in {' or '.join(map(str, files))}"
    providers = [v for v in auth.values() if isinstance(v, dict)]  # [auth.google] and the like
    have = set(auth) | ({k for p in providers for k in p} if providers else set())
    missing = [k for k in AUTH_KEYS if k not in have]
    if missing:
        return f"[auth] lacks {', '.join(missing)}"
    values = {**{k: v for p in providers for k, v in p.items()}, **auth}
    not_text = sorted(k for k in AUTH_KEYS if k in values and not isinstance(values[k], str))
    if not_text:  # a list of one-character strings passed a length check, and Streamlit signed with one
        return f"[auth] {', '.join(not_text)} must be a string (in quotes), not a {type(values[not_text[0]]).__name__}"
    empty = sorted(k for k, v in values.items() if not isinstance(v, dict) and not str(v).strip())
    if empty:
        return f"[auth] has empty {', '.join(empty)}"
    secret = str(auth.get("cookie_secret", ""))
    make = "make one with: python -c 'import secrets; print(secrets.token_urlsafe(32))'"
    if len(secret) < MIN_COOKIE_SECRET:
        return (
            f"[auth] cookie_secret is shorter than {MIN_COOKIE_SECRET} characters: anyone who guesses it can "
            f"sign cookies as any user ({make})"
        )
    if len(set(secret)) < MIN_COOKIE_SECRET_SYMBOLS:
        return (
            f"[auth] cookie_secret repeats a few characters ({len(set(secret))} distinct): it is guessed as easily "
            f"as a short one ({make})"
        )
    return None


def gate() -> None:
    """Stop the page here until the user is signed in, when sign-in is required."""
    if not required():
        return
    if problem := config_problem(secrets_files()):  # started without `moemeter dashboard`'s check
        st.error(f"Sign-in is required but not configured safely: {problem}. See README, Security.")
        st.stop()
    if not st.user.get("is_logged_in", False):
        st.title("moemeter")
        st.info("Sign in to see the dashboard.")
        st.button("Log in", on_click=st.login, type="primary")
        st.stop()
    with st.sidebar:
        st.caption(f"Signed in as {st.user.get('email') or st.user.get('name') or 'you'}")
        st.button("Log out", on_click=st.logout)
