"""A throwaway Sentinel setup for the tests: 1 primary, 1 replica, 3 sentinels, on free ports.

The primary and the replica are :class:`~.servers.Server` processes (the replica
started with ``--replicaof``); each sentinel is the engine's own server binary run as ``<binary> <conf>
--sentinel`` in its own temporary directory (a sentinel rewrites its own
configuration file), monitoring the primary as ``MASTER_NAME`` with a quorum of
2 and a short ``down-after-milliseconds``, so a failover takes seconds. Nothing
here touches a server it did not start.
"""

from __future__ import annotations

import contextlib
import shutil
import signal
import subprocess
import tempfile
import time
from pathlib import Path
from typing import Any

import redis
from redis.sentinel import Sentinel

from .ports import free_port
from .servers import Engine, Server

MASTER_NAME = "slots-test"
#: Milliseconds without an answer before the sentinels call the primary down.
DOWN_AFTER_MS = 1_000


class SentinelError(RuntimeError):
    pass


class _SentinelProcess:
    def __init__(self, binary: str, primary_port: int) -> None:
        self.port = free_port()
        self.dir = Path(tempfile.mkdtemp(prefix="slots-sentinel-"))
        conf = self.dir / "sentinel.conf"
        conf.write_text(
            f"port {self.port}\n"
            "bind 127.0.0.1\n"
            f"dir {self.dir}\n"
            f"sentinel monitor {MASTER_NAME} 127.0.0.1 {primary_port} 2\n"
            f"sentinel down-after-milliseconds {MASTER_NAME} {DOWN_AFTER_MS}\n"
            f"sentinel failover-timeout {MASTER_NAME} 10000\n"
            f"sentinel parallel-syncs {MASTER_NAME} 1\n"
        )
        self.log = self.dir / "sentinel.log"
        with open(self.log, "wb") as out:
            self.proc = subprocess.Popen(
                [binary, str(conf), "--sentinel"], stdout=out, stderr=subprocess.STDOUT, cwd=self.dir
            )

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(timeout=10)
        shutil.rmtree(self.dir, ignore_errors=True)


class LocalSentinel:
    """The primary, its replica and three sentinels; a context manager that stops them all."""

    start_timeout = 60.0

    def __init__(self, engine: Engine) -> None:
        self.engine = engine
        self.primary = Server(engine)
        self.replica: Server | None = None
        self.sentinels: list[_SentinelProcess] = []

    def start(self) -> LocalSentinel:
        self.primary.start()
        self.replica = Server(self.engine, extra_args=("--replicaof", "127.0.0.1", str(self.primary.port)))
        self.replica.start()
        self.sentinels = [_SentinelProcess(self.engine.binary, self.primary.port) for _ in range(3)]
        deadline = time.monotonic() + self.start_timeout
        while time.monotonic() < deadline:
            if self._ready():
                return self
            time.sleep(0.1)
        raise SentinelError("sentinels did not all see the primary and its replica in time")

    def _ready(self) -> bool:
        with contextlib.suppress(redis.RedisError):
            replica = self.replica.client(socket_timeout=1) if self.replica else None
            try:
                if replica is None or replica.info("replication").get("master_link_status") != "up":
                    return False
            finally:
                if replica is not None:
                    replica.close()
            for sentinel in self.sentinels:
                client = redis.Redis(port=sentinel.port, socket_timeout=1)
                try:
                    master = client.sentinel_master(MASTER_NAME)
                    assert isinstance(master, dict), f"SENTINEL MASTER replied {master!r}"
                    if int(master.get("num-slaves", 0)) < 1 or int(master.get("num-other-sentinels", 0)) < 2:
                        return False
                finally:
                    client.close()
            return True
        return False

    def sentinel(self, **kwargs: Any) -> Sentinel:
        return Sentinel([("127.0.0.1", s.port) for s in self.sentinels], **kwargs)

    def master_port(self) -> int:
        """The primary's port as the sentinels see it now."""
        _, port = self.sentinel(socket_timeout=1).discover_master(MASTER_NAME)
        return int(port)

    def wait_failover(self, old_port: int, timeout: float = 30.0) -> int:
        """Until the sentinels name a primary other than ``old_port``; returns its port."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            with contextlib.suppress(redis.RedisError):
                port = self.master_port()
                if port != old_port:
                    return port
            time.sleep(0.1)
        raise SentinelError(f"no failover away from port {old_port} within {timeout} s")

    def stop(self) -> None:
        for sentinel in self.sentinels:
            sentinel.stop()
        for server in (self.replica, self.primary):
            if server is not None and server.running:
                server.stop()

    def __enter__(self) -> LocalSentinel:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
