"""Sign-in in headless Chromium against the real Streamlit server: a sign-in cookie forged with the
empty key (what `cookie_secret = ""` allowed) never gets in, while one signed with the configured
secret does (the control that proves the forged cookie is well formed)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys

import pytest

from .test_browser import CHROMIUM, CHROMIUM_ARGS, ROOT, free_port, ms, wait_http

pytestmark = [
    pytest.mark.integration,
    pytest.mark.browser,
    pytest.mark.skipif(not os.path.exists(CHROMIUM), reason="needs Debian's chromium"),
]
SECRET = "t8PzQ2mWv5KcR1nYbX7dL4sHfJ0gA3eU"
FORGED = "forged@attacker.example"


def signed(secret: str, origin: str) -> str:
    """A `_streamlit_user` cookie as Streamlit itself signs one after an OIDC sign-in."""
    from streamlit.web.server.server_util import AUTH_COOKIE_NAME
    from streamlit.web.server.starlette.starlette_app_utils import create_signed_value

    user = {"origin": origin, "is_logged_in": True, "email": FORGED, "name": "Forged"}
    return create_signed_value(secret, AUTH_COOKIE_NAME, json.dumps(user)).decode()


def test_a_cookie_forged_with_the_empty_key_never_gets_in(tmp_path):
    from playwright.sync_api import sync_playwright

    port = free_port()
    origin = f"http://127.0.0.1:{port}"
    (tmp_path / ".streamlit").mkdir()
    (tmp_path / ".streamlit" / "secrets.toml").write_text(
        f'[auth]\nredirect_uri = "{origin}/oauth2callback"\ncookie_secret = "{SECRET}"\nclient_id = "moemeter"\n'
        'client_secret = "idp-secret"\nserver_metadata_url = "http://127.0.0.1:9/.well-known/openid-configuration"\n'
    )
    env = {**os.environ, "HOME": str(tmp_path)}
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "moemeter",
            "dashboard",
            "--require-login",
            "--port",
            str(port),
            "--api",
            "http://127.0.0.1:9",
        ],
        cwd=tmp_path,
        env={**env, "PYTHONPATH": str(ROOT)},
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    seen: dict[str, str] = {}
    try:
        wait_http(f"{origin}/_stcore/health", 120, proc)
        with sync_playwright() as p:
            browser = p.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
            for who, key in (("forged", ""), ("secret holder", SECRET)):
                ctx = browser.new_context(viewport={"width": 1280, "height": 900})
                ctx.add_cookies([{"name": "_streamlit_user", "value": signed(key, origin), "url": origin}])
                page = ctx.new_page()
                page.goto(origin, wait_until="networkidle")
                page.wait_for_function(
                    "document.body.innerText.includes('Sign in to see the dashboard') || "
                    "document.body.innerText.includes('Signed in as')",
                    timeout=ms(90),
                )
                seen[who] = page.inner_text("body")
                ctx.close()
            browser.close()
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(20)
        except subprocess.TimeoutExpired:
            proc.kill()
    assert "Sign in to see the dashboard" in seen["forged"] and FORGED not in seen["forged"]
    assert f"Signed in as {FORGED}" in seen["secret holder"]  # the same cookie, signed with the secret, is let in
