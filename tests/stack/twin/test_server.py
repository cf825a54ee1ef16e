"""The twin's HTTP side: a scraper that leaves mid-answer costs one log line."""

from __future__ import annotations

import logging
import socket
import struct
import time

from stack.twin.config import load_profile
from stack.twin.server import Twin


def test_a_scraper_that_goes_away_is_one_line_never_a_traceback(caplog, capfd):
    twin = Twin(load_profile("deepseek-v4.1-flash"), seed=3, start=time.time() - 1)  # no warm-up: quick to start
    targets = twin.serve()
    caplog.set_level(logging.INFO, logger="stack.twin.server")
    try:
        decode = next(t for t in targets if t["role"] == "decode")  # a 5 MB page: the answer outlives the client
        host, port = str(decode["url"]).split("//")[1].split("/")[0].split(":")
        for _ in range(3):
            s = socket.create_connection((host, int(port)))
            s.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))  # close with a reset
            s.sendall(b"GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n")
            s.recv(1024)  # the answer has begun
            s.close()
        deadline = time.monotonic() + 60
        while not [r for r in caplog.records if "went away" in r.getMessage()]:
            assert time.monotonic() < deadline, "the server never noticed the client leave"
            time.sleep(0.05)
    finally:
        twin.close()
    gone = [r for r in caplog.records if "went away" in r.getMessage()]
    assert gone and all(r.exc_info is None and "\n" not in r.getMessage() for r in gone)
    assert "Traceback" not in capfd.readouterr().err
