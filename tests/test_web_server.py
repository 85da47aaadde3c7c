"""The standalone page's server (:mod:`dramatiq_slots.ops.web.server`) under slow and many clients.

A real ``SlotsWeb`` on the session's Redis, served by the package's server on a free port, and
real sockets: clients that connect and send nothing, or a byte now and then, hold a socket each
until their deadline and no thread; a normal request is answered meanwhile, and many at once are
all answered.
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import http.client
import select
import socket
import threading
import time
from collections.abc import Iterator

import redis

from dramatiq_slots.ledger import Ledger
from dramatiq_slots.ops.web import SlotsWeb
from dramatiq_slots.ops.web.server import MAX_BODY, MAX_HEAD
from tests.support.planted import plant_busy_queue
from tests.support.waiting import wait_until
from tests.support.web import TIMEOUT, served

SLOW_CLIENTS = 200
THREADS = 4
#: What a normal request may take while the slow clients are held: measured about 10 ms here; the
#: margin is for a loaded 2-core machine.
PROMPT = 1.0
PARTIAL_HEAD = b"GET /slots/api/ledgers HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Slow: "


def web_threads() -> list[str]:
    return [t.name for t in threading.enumerate() if t.name.startswith("dramatiq-slots-web-")]


def timed_get(port: int, path: str = "/slots/api/ledgers") -> tuple[float, int]:
    """One request on a connection of its own: (seconds, status)."""
    started = time.perf_counter()
    connection = http.client.HTTPConnection("127.0.0.1", port, timeout=TIMEOUT)
    try:
        connection.request("GET", path)
        reply = connection.getresponse()
        reply.read()
        return time.perf_counter() - started, reply.status
    finally:
        connection.close()


def unanswered(sock: socket.socket) -> bool:
    """Whether the server still holds ``sock`` open without having answered anything on it."""
    readable, _, _ = select.select([sock], [], [], 0)
    return not readable  # readable: an answer, or the end of the stream, is there


@contextlib.contextmanager
def slow_clients(port: int, count: int) -> Iterator[list[socket.socket]]:
    """``count`` connections: half sent part of a head and send a byte every 0.2 s, half nothing."""
    socks: list[socket.socket] = []
    stop = threading.Event()

    def dribble() -> None:
        while not stop.wait(0.2):
            for sock in socks[::2]:
                with contextlib.suppress(OSError):
                    sock.send(b"x")

    dribbler = threading.Thread(target=dribble, name="test-dribbler", daemon=True)
    try:
        for i in range(count):
            sock = socket.create_connection(("127.0.0.1", port), timeout=TIMEOUT)
            if i % 2 == 0:
                sock.sendall(PARTIAL_HEAD)
            socks.append(sock)
        dribbler.start()
        yield socks
    finally:
        stop.set()
        if dribbler.is_alive():
            dribbler.join(timeout=TIMEOUT)
        for sock in socks:
            sock.close()


def test_200_slow_clients_hold_no_thread_and_keep_no_normal_request_out(
    ledger: Ledger, redis_client: redis.Redis, key_prefix: str
) -> None:
    plant_busy_queue(ledger)
    app = SlotsWeb(redis_client, key_prefix=key_prefix)
    before = threading.active_count()
    with served(app, threads=THREADS) as base:
        port = int(base.rsplit(":", 1)[1])
        assert timed_get(port)[1] == 200
        with slow_clients(port, SLOW_CLIENTS) as slow:
            answers = [timed_get(port) for _ in range(10)]
            still_held = sum(unanswered(sock) for sock in slow)
            threads = web_threads()
            more_threads = threading.active_count() - before
        latencies = [seconds for seconds, _ in answers]
        print(
            f"\nMEASURE web server: {SLOW_CLIENTS} slow clients held, a normal request took "
            f"{max(latencies) * 1000:.0f} ms at most (median {sorted(latencies)[5] * 1000:.0f} ms); "
            f"handler threads {len(threads)}"
        )
        assert [status for _, status in answers] == [200] * len(answers)
        assert still_held == SLOW_CLIENTS, "the slow clients were held while the others were served"
        assert max(latencies) < PROMPT, latencies
        assert len(threads) == THREADS, threads
        assert more_threads <= THREADS + 2, "the pool, the server's loop and the test's dribbler"

        # 200 requests at once: every one answered, by the same few threads.
        with concurrent.futures.ThreadPoolExecutor(SLOW_CLIENTS) as pool:
            many = list(pool.map(lambda _: timed_get(port), range(SLOW_CLIENTS)))
        worst = max(seconds for seconds, _ in many)
        print(f"MEASURE web server: {SLOW_CLIENTS} requests at once, the slowest took {worst * 1000:.0f} ms")
        assert [status for _, status in many] == [200] * SLOW_CLIENTS
        assert len(web_threads()) == THREADS


def test_a_request_must_arrive_within_its_deadline_and_within_its_bounds(
    redis_client: redis.Redis, key_prefix: str
) -> None:
    read_timeout = 1.0
    with served(SlotsWeb(redis_client, key_prefix=key_prefix), read_timeout=read_timeout) as base:
        port = int(base.rsplit(":", 1)[1])
        started = time.monotonic()
        with slow_clients(port, 20) as slow:
            wait_until(
                lambda: not any(unanswered(sock) for sock in slow),
                timeout=read_timeout + TIMEOUT,
                what="the slow clients answered and closed at their deadline",
            )
            took = time.monotonic() - started
            for sock in slow:
                sock.settimeout(TIMEOUT)
                assert sock.recv(1024).startswith(b"HTTP/1.0 408 Request Timeout\r\n")
        assert took >= read_timeout, "a byte now and then does not put the deadline off"

        def refused(request: bytes) -> bytes:
            with socket.create_connection(("127.0.0.1", port), timeout=TIMEOUT) as sock:
                sock.sendall(request)
                return sock.recv(1024).split(b"\r\n")[0]

        head = b"POST /slots/api/actions/pause HTTP/1.1\r\nHost: 127.0.0.1\r\n"
        assert refused(head + b"X: " + b"a" * MAX_HEAD) == b"HTTP/1.0 431 Request Header Fields Too Large"
        too_long = f"Content-Length: {MAX_BODY + 1}\r\n\r\n".encode()
        assert refused(head + too_long) == b"HTTP/1.0 413 Content Too Large"
        assert refused(head + b"Transfer-Encoding: chunked\r\n\r\n") == b"HTTP/1.0 411 Length Required"
        assert (
            refused(head + b"Content-Length: 1\r\nContent-Length: 2\r\n\r\n") == b"HTTP/1.0 400 Bad Request"
        )
        assert timed_get(port)[1] == 200
