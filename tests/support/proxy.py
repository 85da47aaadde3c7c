"""A TCP proxy in front of a Redis server that can lose or delay a reply after the command ran.

:class:`FaultProxy` listens on 127.0.0.1 (a free port) and forwards every
connection to the target server, byte for byte. It reads both directions as
RESP (requests: arrays of bulk strings; replies: any RESP2 value) to pair each
reply with its command. After :meth:`FaultProxy.lose_reply`, the reply to the
next command of that name is swallowed and the connection reset, both sides:
the server has executed the command, the client never learns the outcome (the
case a lease must survive without a leaked or doubled member). After
:meth:`FaultProxy.delay_reply`, the reply is held back for a while (a slow
network: the hold was written long before its holder hears of it). After
:meth:`FaultProxy.blackhole`, nothing crosses the proxy either way for a while, on any
connection, old or new: bytes wait there (a partition that heals; a client whose socket
timeout fired has gone by then).

A connection that subscribes (Pub/Sub) receives pushes without requests; it
is forwarded blindly from then on, and never has a reply dropped.
"""

from __future__ import annotations

import contextlib
import socket
import threading
import time
from collections import deque


class _Incomplete(Exception):
    pass


def _line(buf: bytes, pos: int) -> tuple[bytes, int]:
    end = buf.find(b"\r\n", pos)
    if end < 0:
        raise _Incomplete
    return buf[pos:end], end + 2


def parse(buf: bytes, pos: int = 0) -> tuple[object, int]:
    """One RESP value (RESP2 or RESP3) of ``buf`` at ``pos``: (value, end); raises
    _Incomplete when cut short. Aggregates come back as lists (a map as its keys and values
    in turn), bulk strings as bytes, the rest as their line."""
    if pos >= len(buf):
        raise _Incomplete
    kind = buf[pos : pos + 1]
    head, pos = _line(buf, pos + 1)
    if kind in (b"+", b"-", b":", b"_", b"#", b",", b"("):
        return head, pos
    if kind in (b"$", b"!", b"="):
        size = int(head)
        if size < 0:
            return None, pos
        if len(buf) < pos + size + 2:
            raise _Incomplete
        return buf[pos : pos + size], pos + size + 2
    if kind == b"|":  # an attribute map, then the value it annotates
        for _ in range(2 * int(head)):
            _, pos = parse(buf, pos)
        return parse(buf, pos)
    if kind in (b"*", b"~", b">", b"%"):
        count = int(head) * (2 if kind == b"%" else 1)
        items = []
        for _ in range(max(count, 0)):
            item, pos = parse(buf, pos)
            items.append(item)
        return items, pos
    raise ValueError(f"not RESP: {kind!r}")


class _Pair:
    """One client connection and its server connection."""

    def __init__(self, proxy: FaultProxy, client: socket.socket) -> None:
        self.proxy = proxy
        self.client = client
        self.server = socket.create_connection(("127.0.0.1", proxy.target_port))
        self.pending: deque[tuple[bytes, bytes]] = deque()
        self.blind = False
        self.lock = threading.Lock()

    def start(self) -> None:
        for target in (self._requests, self._replies):
            threading.Thread(target=target, daemon=True).start()

    def close(self) -> None:
        for sock in (self.client, self.server):
            with contextlib.suppress(OSError):
                sock.shutdown(socket.SHUT_RDWR)
            with contextlib.suppress(OSError):
                sock.close()

    def _requests(self) -> None:
        buf = b""
        try:
            while True:
                data = self.client.recv(65536)
                if not data:
                    break
                buf += data
                while buf:
                    try:
                        value, end = parse(buf)
                    except _Incomplete:
                        break
                    buf = buf[end:]
                    words = [w for w in value if isinstance(w, bytes)] if isinstance(value, list) else []
                    name = words[0].upper() if words else b""
                    with self.lock:
                        if name in (b"SUBSCRIBE", b"PSUBSCRIBE", b"SSUBSCRIBE"):
                            self.blind = True
                        self.pending.append((name, words[1] if len(words) > 1 else b""))
                self.proxy.wait_open()
                self.server.sendall(data)
        except OSError:
            pass
        finally:
            self.close()

    def _replies(self) -> None:
        buf = b""
        try:
            while True:
                data = self.server.recv(65536)
                if not data:
                    break
                self.proxy.wait_open()
                if self.blind:
                    self.client.sendall(data)
                    continue
                buf += data
                out = b""
                while buf:
                    try:
                        _, end = parse(buf)
                    except _Incomplete:
                        break
                    reply, buf = buf[:end], buf[end:]
                    with self.lock:
                        name, arg = self.pending.popleft() if self.pending else (b"", b"")
                    if self.proxy.take(name, arg):
                        self.client.sendall(out)  # what came before it is delivered
                        return  # the reply is lost: reset both sides
                    wait = self.proxy.delay_for(name, arg)
                    if wait:
                        self.client.sendall(out)
                        out = b""
                        time.sleep(wait)  # the fault itself: a reply slow to arrive
                    out += reply
                if out:
                    self.client.sendall(out)
        except OSError:
            pass
        finally:
            self.close()


#: The command name that stands for any script call, ``FCALL`` or ``EVALSHA`` (no command's name).
ANY_SCRIPT = "FCALL|EVALSHA"


def _names(name: bytes) -> tuple[bytes, ...]:
    """The names a command sent as ``name`` answers to."""
    return (name, ANY_SCRIPT.encode()) if name in (b"FCALL", b"EVALSHA") else (name,)


class FaultProxy:
    """The proxy (see the module docstring); a context manager that stops it."""

    def __init__(self, target_port: int) -> None:
        self.target_port = target_port
        self._listener = socket.create_server(("127.0.0.1", 0))
        self.port = self._listener.getsockname()[1]
        self._armed: dict[tuple[bytes, bytes], int] = {}
        self._delays: list[tuple[bytes, bytes, float]] = []
        #: The commands whose replies were held back: (name, first argument).
        self.delayed: list[tuple[str, str]] = []
        self._lock = threading.Lock()
        #: The commands whose replies were lost: (name, first argument, e.g. the script's sha).
        self.dropped: list[tuple[str, str]] = []
        self._pairs: list[_Pair] = []
        self._thread = threading.Thread(target=self._accept, daemon=True)
        #: Set while bytes may cross (cleared by :meth:`blackhole`).
        self._open = threading.Event()
        self._open.set()
        self._closes_at = 0.0

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def lose_reply(self, command: str = ANY_SCRIPT, times: int = 1, *, arg: str = "") -> None:
        """Lose the replies to the next ``times`` commands named ``command`` (whose first
        argument is ``arg``, when given: e.g. one script's function or sha; by default, any
        script call)."""
        with self._lock:
            key = (command.upper().encode(), arg.encode())
            self._armed[key] = self._armed.get(key, 0) + times

    def delay_reply(self, seconds: float, command: str = ANY_SCRIPT, *, arg: str = "") -> None:
        """Hold back the reply to the next command named ``command`` (first argument ``arg``)."""
        with self._lock:
            self._delays.append((command.upper().encode(), arg.encode(), seconds))

    def blackhole(self, seconds: float) -> None:
        """Let nothing cross, either way, for ``seconds`` (then everything held back flows)."""
        with self._lock:
            self._closes_at = max(self._closes_at, time.monotonic() + seconds)
            self._open.clear()
        timer = threading.Timer(seconds, self._reopen)
        timer.daemon = True
        timer.start()

    def _reopen(self) -> None:
        with self._lock:
            if time.monotonic() >= self._closes_at - 0.001:
                self._open.set()

    def wait_open(self) -> None:
        """Block while the proxy is blackholed (the fault itself)."""
        self._open.wait()

    def delay_for(self, name: bytes, arg: bytes) -> float:
        """Seconds to hold this reply back (0: none); counts an armed delay down."""
        with self._lock:
            for i, (command, wanted, seconds) in enumerate(self._delays):
                if command in _names(name) and wanted in (b"", arg):
                    del self._delays[i]
                    self.delayed.append((name.decode(), arg.decode(errors="replace")))
                    return seconds
            return 0.0

    def take(self, name: bytes, arg: bytes = b"") -> bool:
        """Whether to lose the reply to this command (counts it down when armed)."""
        with self._lock:
            for key in [(n, a) for n in _names(name) for a in (arg, b"")]:
                if self._armed.get(key, 0) > 0:
                    self._armed[key] -= 1
                    self.dropped.append((name.decode(), arg.decode(errors="replace")))
                    return True
            return False

    def _accept(self) -> None:
        while True:
            try:
                client, _ = self._listener.accept()
            except OSError:
                return
            try:
                pair = _Pair(self, client)
            except OSError:
                client.close()
                continue
            self._pairs.append(pair)
            pair.start()

    def __enter__(self) -> FaultProxy:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._open.set()
        with contextlib.suppress(OSError):
            self._listener.close()
        for pair in self._pairs:
            pair.close()
