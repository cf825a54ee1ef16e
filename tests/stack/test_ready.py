import subprocess
import sys
import time

import pytest

from stack.ready import NotReady, wait_http
from tests.conftest import reply


def test_returns_once_every_url_answers_200(http_server):
    url, routes = http_server
    routes["/a"], routes["/b"] = reply(b"ok"), reply(b"ok")
    wait_http([url + "/a", url + "/b"], 5)


def test_names_the_url_that_never_answered_200(http_server):
    url, routes = http_server
    routes["/a"], routes["/b"] = reply(b"ok"), reply(b"no", status=503)
    t = time.monotonic()
    with pytest.raises(NotReady, match=r"/b did not answer within 1 s"):
        wait_http([url + "/a", url + "/b"], 1)
    assert time.monotonic() - t < 5


def test_stops_at_once_when_a_child_exits():
    child = subprocess.Popen([sys.executable, "-c", "raise SystemExit(3)"])
    child.wait()
    t = time.monotonic()
    with pytest.raises(NotReady, match="server exited with 3") as exc:
        wait_http("http://127.0.0.1:9/health", 60, {"server": child})
    assert exc.value.child == "server"
    assert time.monotonic() - t < 5
