"""No connection or body may hold the server (issue 25, item 8), against a real `onepass serve`
over real sockets: a request head that never completes is closed within --header-timeout,
idle connections past --max-connections are shed so a normal request is still served, and the
CPU-bound validation of a 1.5 MB body runs off the event loop (/health/live keeps answering)."""

from __future__ import annotations

import json
import socket
import time

import httpx
import pytest
from server_process import live_latency, serve

HEADER_TIMEOUT = 1.0
MAX_CONNECTIONS = 16
KEY = "connections-test-key"


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    log = tmp_path_factory.mktemp("connections") / "server.log"
    with serve(["--threads", "1", "--api-key", KEY, "--header-timeout", str(HEADER_TIMEOUT),
                "--max-connections", str(MAX_CONNECTIONS)], log) as url:
        yield url


def _address(url: str) -> tuple[str, int]:
    host, port = url.split("//")[1].split(":")
    return host, int(port)


def _closed_after(sock: socket.socket, limit: float) -> float | None:
    """Seconds until the server closes ``sock`` (None: still open after ``limit``)."""
    start = time.monotonic()
    sock.settimeout(limit)
    try:
        while sock.recv(4096):
            pass
    except TimeoutError:
        return None
    except ConnectionResetError:
        pass
    return time.monotonic() - start


def _is_closed(sock: socket.socket) -> bool:
    sock.setblocking(False)
    try:
        return sock.recv(1, socket.MSG_PEEK) == b""
    except BlockingIOError:
        return False
    except ConnectionResetError:
        return True


def test_half_sent_headers_are_closed_within_the_header_timeout(server):
    with socket.create_connection(_address(server)) as sock:
        sock.sendall(b"GET /health/live HTTP/1.1\r\nHost: x\r\nX-Slow: ")
        took = _closed_after(sock, HEADER_TIMEOUT + 10)
    assert took is not None, "a connection with half its headers was still open"
    assert took < HEADER_TIMEOUT + 2, took


def test_a_silent_connection_is_closed_within_the_header_timeout(server):
    with socket.create_connection(_address(server)) as sock:
        took = _closed_after(sock, HEADER_TIMEOUT + 10)
    assert took is not None and took < HEADER_TIMEOUT + 2, took


def test_a_kept_alive_connection_gets_the_deadline_for_its_next_head(server):
    with socket.create_connection(_address(server)) as sock:
        sock.sendall(b"GET /health/live HTTP/1.1\r\nHost: x\r\n\r\n")
        sock.settimeout(10)
        assert sock.recv(4096).startswith(b"HTTP/1.1 200")
        time.sleep(HEADER_TIMEOUT + 0.5)  # idle between requests: keep-alive, not the deadline
        sock.sendall(b"GET /health/live HTTP/1.1\r\n")  # then half a head
        took = _closed_after(sock, HEADER_TIMEOUT + 10)
    assert took is not None and took < HEADER_TIMEOUT + 2, took


def test_idle_connections_cannot_lock_out_a_request(server):
    idle = [socket.create_connection(_address(server)) for _ in range(4 * MAX_CONNECTIONS)]
    try:
        time.sleep(0.3)
        start = time.monotonic()
        r = httpx.get(server + "/v1/models", headers={"authorization": f"Bearer {KEY}"},
                      timeout=10)
        took = time.monotonic() - start
        assert r.status_code == 200 and took < 2.0, (r.status_code, took)
        open_now = sum(not _is_closed(s) for s in idle)
        assert open_now <= MAX_CONNECTIONS, open_now  # the oldest idle ones were shed
    finally:
        for s in idle:
            s.close()


def _tools_body(invalid_last: bool) -> str:
    """~1.5 MB of function tools (each a 60-property schema); the last one's schema is
    invalid, so the request is refused once every schema has been checked."""
    tools = [{"type": "function", "function": {
        "name": f"f{i}", "description": "d" * 50,
        "parameters": {"type": "object", "properties": {
            f"p{j}": {"type": "string", "description": "x" * 20,
                      "enum": [f"v{k}" for k in range(20)]} for j in range(60)}}}}
        for i in range(120)]
    if invalid_last:
        tools[-1]["function"]["parameters"]["properties"]["bad"] = {"type": 5}
    return json.dumps({"messages": [{"role": "user", "content": "hi"}], "max_tokens": 1,
                       "tools": tools})


def test_validating_a_big_tools_body_does_not_block_the_event_loop(server):
    body = _tools_body(invalid_last=True)
    assert len(body) > 1_400_000
    with live_latency(server) as worst:
        start = time.monotonic()
        r = httpx.post(server + "/v1/chat/completions", content=body, timeout=120,
                       headers={"authorization": f"Bearer {KEY}",
                                "content-type": "application/json"})
        took = time.monotonic() - start
    print(f"1.5 MB tools body refused in {took:.2f} s; /health/live worst {worst[0]:.3f} s")
    assert r.status_code == 400, r.text[:300]
    assert r.json()["error"]["field"] == "tools[119].function.parameters", r.text[:300]
    assert worst[0] < 0.5, worst[0]  # before: blocked for the whole validation (4-10 s)
