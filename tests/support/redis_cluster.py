"""A throwaway Redis Cluster for the tests: 3 primaries and 3 replicas on free ports of 127.0.0.1.

Each node is a :class:`~.servers.Server` (Redis 7 or Valkey: ``--cluster-port``)
started with ``--cluster-enabled yes``
in its own data directory (kept across restarts, so a node comes back with
its ``nodes.conf``), and the cluster is formed by ``redis-cli --cluster
create`` (``valkey-cli`` for Valkey: the engine's own client, :attr:`~.servers.Engine.cli`),
as an operator would. A short ``cluster-node-timeout`` makes a
failover take a second or two. Nothing here touches a server it did not start.
"""

from __future__ import annotations

import shutil
import subprocess
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import redis
from redis.cluster import RedisCluster

from .ports import free_port
from .servers import Engine, Server, ServerError

#: Milliseconds a primary may be unreachable before its replica is promoted.
NODE_TIMEOUT_MS = 1_000


class ClusterError(RuntimeError):
    pass


class LocalCluster:
    """Six nodes (3 primaries, 3 replicas); a context manager that stops them all."""

    start_timeout = 60.0

    def __init__(self, engine: Engine) -> None:
        self.engine = engine
        self._root = Path(tempfile.mkdtemp(prefix="slots-cluster-"))
        self.nodes = [
            Server(
                engine,
                data_dir=self._root / f"node{i}",
                extra_args=(
                    "--cluster-enabled",
                    "yes",
                    "--cluster-config-file",
                    "nodes.conf",
                    "--cluster-node-timeout",
                    str(NODE_TIMEOUT_MS),
                    "--cluster-require-full-coverage",
                    "no",
                    # The bus port (by default the port + 10000, past 65535 for high free ports).
                    "--cluster-port",
                    str(free_port()),
                ),
            )
            for i in range(6)
        ]

    def start(self) -> LocalCluster:
        cli = self.engine.cli
        if cli is None:
            raise ClusterError(
                f"engine {self.engine.kind} ({self.engine.binary}) has no redis-cli or valkey-cli beside it "
                "to form the cluster"
            )
        for node in self.nodes:
            self._start_node(node)
        command = [cli, "--cluster", "create", *self.addresses(), "--cluster-replicas", "1", "--cluster-yes"]
        done = subprocess.run(command, capture_output=True, text=True, timeout=60)
        if done.returncode != 0:
            raise ClusterError(f"{cli} --cluster create failed:\n{done.stdout}\n{done.stderr}")
        self.wait_ok()
        self.wait_replicas_synced()
        return self

    @staticmethod
    def _start_node(node: Server, attempts: int = 5) -> None:
        """Start one node; when its port or its bus port was taken meanwhile, pick new ones."""
        for attempt in range(1, attempts + 1):
            try:
                node.start()
                return
            except ServerError:
                if attempt == attempts:
                    raise
                args = list(node.extra_args)
                args[args.index("--cluster-port") + 1] = str(free_port())
                node.extra_args = tuple(args)

    def wait_replicas_synced(self, timeout: float | None = None) -> None:
        """Until every running replica has its primary's data (``master_link_status:up``): a
        replica that never synced refuses to be promoted."""
        deadline = time.monotonic() + (self.start_timeout if timeout is None else timeout)
        while time.monotonic() < deadline:
            pending = []
            for node in self.nodes:
                if not node.running:
                    continue
                client = node.client(socket_timeout=1, socket_connect_timeout=1)
                try:
                    info = client.info("replication")
                    if info.get("role") == "slave" and info.get("master_link_status") != "up":
                        pending.append(node.port)
                except redis.RedisError:
                    pending.append(node.port)
                finally:
                    client.close()
            if not pending:
                return
            time.sleep(0.1)
        raise ClusterError(f"replicas not in sync within the deadline: {pending}")

    def addresses(self) -> list[str]:
        return [f"127.0.0.1:{node.port}" for node in self.nodes]

    def wait_ok(self, timeout: float | None = None) -> None:
        """Until every running node says ``cluster_state:ok`` and knows 3 primaries with slots."""
        deadline = time.monotonic() + (self.start_timeout if timeout is None else timeout)
        last = ""
        while time.monotonic() < deadline:
            states = []
            for node in self.nodes:
                if not node.running:
                    continue
                client = node.client(socket_timeout=1, socket_connect_timeout=1)
                try:
                    info = client.execute_command("CLUSTER", "INFO")
                    text = info.decode() if isinstance(info, bytes) else str(info)
                    states.append("cluster_state:ok" in text and "cluster_size:3" in text)
                    last = text
                except redis.RedisError as e:
                    states.append(False)
                    last = str(e)
                finally:
                    client.close()
            if states and all(states):
                return
            time.sleep(0.1)
        raise ClusterError(f"cluster not ok within the deadline; last CLUSTER INFO:\n{last}")

    def wait_served(self, key: str, timeout: float = 30.0) -> Server:
        """Until a running node is the primary of ``key``'s slot, in the view of every running
        node (after a failover: its replica promoted); returns that node."""
        deadline = time.monotonic() + timeout
        running = {node.port: node for node in self.nodes if node.running}
        while time.monotonic() < deadline:
            owners = set()
            for node in running.values():
                client = node.client(socket_timeout=1, socket_connect_timeout=1)
                try:
                    slot = int(client.execute_command("CLUSTER", "KEYSLOT", key))
                    for start, end, primary, *_ in client.execute_command("CLUSTER", "SLOTS"):
                        if int(start) <= slot <= int(end):
                            owners.add(int(primary[1]))
                except redis.RedisError:
                    owners.add(-1)
                finally:
                    client.close()
            if len(owners) == 1 and (port := owners.pop()) in running:
                return running[port]
            time.sleep(0.1)
        raise ClusterError(f"no running primary serves {key!r} within {timeout} s")

    def client(self, **kwargs: object) -> RedisCluster:
        """A ``RedisCluster`` client that knows every node."""
        kwargs.setdefault("socket_timeout", 5)
        kwargs.setdefault("socket_connect_timeout", 2)
        startup = [redis.cluster.ClusterNode("127.0.0.1", node.port) for node in self.nodes if node.running]
        return RedisCluster(startup_nodes=startup, **kwargs)  # type: ignore[arg-type]

    def primary_of(self, key: str) -> Server:
        """The node that serves ``key``'s slot now."""
        with self.client() as client:
            node = client.get_node_from_key(key)
        for server in self.nodes:
            if server.running and server.port == node.port:
                return server
        raise ClusterError(f"no running node serves {key!r}")

    def node_id(self, server: Server) -> str:
        """``server``'s cluster node id (``CLUSTER MYID``)."""
        with server.client(socket_timeout=5) as client:
            reply = client.execute_command("CLUSTER", "MYID")
        return reply.decode() if isinstance(reply, bytes) else str(reply)

    def primaries(self) -> list[Server]:
        """The running nodes that are primaries now (``ROLE``)."""
        found = []
        for node in self.nodes:
            if node.running:
                with node.client(socket_timeout=5) as client:
                    if client.execute_command("ROLE")[0] in (b"master", "master"):
                        found.append(node)
        return found

    def owner_of_slot(self, slot: int, asked: Server) -> Server:
        """The primary serving hash slot ``slot`` in ``asked``'s view (``CLUSTER SLOTS``)."""
        with asked.client(socket_timeout=5) as client:
            for start, end, primary, *_ in client.execute_command("CLUSTER", "SLOTS"):
                if int(start) <= slot <= int(end):
                    for server in self.nodes:
                        if server.running and server.port == int(primary[1]):
                            return server
        raise ClusterError(f"no running primary serves slot {slot} in the view of {asked!r}")

    def migrate_slot(
        self,
        slot: int,
        to: Server,
        *,
        batch: int = 100,
        midway: Callable[[], object] | None = None,
        timeout: float = 30.0,
    ) -> list[str]:
        """Move hash slot ``slot`` with its keys to the primary ``to``, by hand, the way
        ``redis-cli --cluster reshard`` does; returns the names of the keys it moved.

        ``CLUSTER SETSLOT <slot> IMPORTING`` on the target, ``MIGRATING`` on the source,
        ``MIGRATE`` the keys ``batch`` at a time (``CLUSTER GETKEYSINSLOT``) until the source
        has none left, then ``SETSLOT <slot> NODE <target>`` on the target, the source and
        every other primary (replicas follow their primary). Meanwhile clients get ``ASK``
        (a key already moved) or ``TRYAGAIN`` (a multi-key command whose keys are split),
        and ``MOVED`` afterwards. ``midway`` is called once, after the first ``MIGRATE``,
        while the slot is still migrating.
        """
        source = self.owner_of_slot(slot, to)
        if source is to:
            raise ClusterError(f"slot {slot} is already served by {to!r}")
        source_id, target_id = self.node_id(source), self.node_id(to)
        moved: list[str] = []
        deadline = time.monotonic() + timeout
        with source.client(socket_timeout=10) as src, to.client(socket_timeout=10) as dst:
            dst.execute_command("CLUSTER", "SETSLOT", slot, "IMPORTING", source_id)
            src.execute_command("CLUSTER", "SETSLOT", slot, "MIGRATING", target_id)
            while keys := src.execute_command("CLUSTER", "GETKEYSINSLOT", slot, batch):
                if time.monotonic() > deadline:
                    raise ClusterError(f"slot {slot} still has keys on {source!r} after {timeout} s")
                reply = src.execute_command("MIGRATE", "127.0.0.1", to.port, "", 0, 5_000, "KEYS", *keys)
                if reply in (b"OK", "OK", True):  # not NOKEY: they did not all expire meanwhile
                    moved += [key.decode() if isinstance(key, bytes) else str(key) for key in keys]
                if midway is not None:
                    midway()
                    midway = None
        others = [node for node in self.primaries() if node is not to and node is not source]
        for node in (to, source, *others):
            with node.client(socket_timeout=5) as client:
                client.execute_command("CLUSTER", "SETSLOT", slot, "NODE", target_id)
        return moved

    def stop(self) -> None:
        for node in self.nodes:
            if node.running:
                node.stop()
        shutil.rmtree(self._root, ignore_errors=True)

    def __enter__(self) -> LocalCluster:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
