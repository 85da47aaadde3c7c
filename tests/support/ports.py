"""Free TCP ports on 127.0.0.1 for the servers the tests start."""

from __future__ import annotations

import socket

#: Ports a test server must never take (6379 is the one a developer's own Redis uses).
FORBIDDEN_PORTS = frozenset({6379})


def free_port() -> int:
    """A TCP port on 127.0.0.1 that was free a moment ago (the kernel picked it; never 6379)."""
    while True:
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
            s.bind(("127.0.0.1", 0))
            port = int(s.getsockname()[1])
        if port not in FORBIDDEN_PORTS:
            return port


def distinct_free_ports(count: int) -> list[int]:
    """``count`` different free ports."""
    ports: list[int] = []
    while len(ports) < count:
        port = free_port()
        if port not in ports:
            ports.append(port)
    return ports
