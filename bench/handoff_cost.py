"""What one admission and one handoff cost inside Redis, by the server's own counts.

``python bench/handoff_cost.py`` starts a throwaway ``redis-server`` (:class:`bench.support.Server`)
and, for each kind of line, drives the ledger's scripts directly (no workers): a ledger of
capacity 4 held full, ``--waiting`` claims in line, then ``--rounds`` times one ``leave`` that
hands its slot to the next claim in line, and one ``enter`` that joins the line again (so the
line stays as long). It reads ``INFO commandstats`` before and after each phase, and prints the
commands Redis ran per call (the scripts' own ``redis.call``s, counted by Redis, and the
``FCALL`` itself), and the server's CPU per call (``used_cpu_sys`` + ``used_cpu_user``,
microseconds: noisy on a shared machine, read it as an order of magnitude).

The lines (docs/design.md, "Who gets the next slot"):

plain
    claims without a group or units: first come, first served (what every ledger did before).
grouped
    every claim in one of ``--groups`` fair-share groups, round robin over them.
mixed
    half the claims in groups, half without (the claims without a group take turns as one more).
weighted
    claims of 2 units on a capacity of 4, without a group.

Also the uncontended case (``enter`` admitted at once, ``leave`` with nobody in line). The cost is
O(log n) in the claims waiting and O(log g) in the groups: ``--waiting 10,1000`` shows it flat.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[1]
if str(REPO_ROOT) not in sys.path:  # run as a script: make the repository importable
    sys.path.insert(0, str(REPO_ROOT))

import redis  # noqa: E402

from bench.support import Server  # noqa: E402
from dramatiq_slots.ledger import Ledger, Limit, Line  # noqa: E402
from dramatiq_slots.ledger.keys import group_digest  # noqa: E402
from dramatiq_slots.ledger.replies import member_suffix  # noqa: E402

CAPACITY = 4
TTL_MS = 600_000


def counts(client: redis.Redis) -> tuple[int, float]:
    """Commands Redis ran so far (every command, the scripts' own included), and its CPU (s)."""
    stats = client.info("commandstats")
    cpu = client.info("cpu")
    calls = sum(int(v["calls"]) for k, v in stats.items() if k.startswith("cmdstat_"))
    return calls, float(cpu["used_cpu_sys"]) + float(cpu["used_cpu_user"])


def measure(client: redis.Redis, run: Callable[[], None], calls: int) -> tuple[float, float]:
    """Commands and CPU (µs) per call of ``run`` (``calls`` of them), less the two INFOs."""
    before, cpu_before = counts(client)
    run()
    after, cpu_after = counts(client)
    return (after - before - 2) / calls, (cpu_after - cpu_before) * 1e6 / calls


def suffix_of(kind: str, n: int, groups: int) -> str:
    if kind == "grouped" or (kind == "mixed" and n % 2):
        return member_suffix(group=group_digest(f"tenant-{n % groups}"))
    if kind == "weighted":
        return member_suffix(units=2)
    return ""


def line_case(
    server: Server, kind: str, waiting: int, rounds: int, groups: int
) -> tuple[float, float, float, float]:
    """Per call: (leave commands, leave CPU µs, enter-join commands, enter-join CPU µs); at most
    half the line is served, so it never runs dry."""
    rounds = max(1, min(rounds, waiting // 2))
    client = redis.Redis(port=server.port)
    ledger = Ledger(client, key_prefix=f"cost-{kind}-{waiting}")
    limit = Limit(ledger.keys.queue("q"), CAPACITY)
    made = iter(range(10**9))

    def token() -> str:
        n = next(made)
        return f"bench:1:1:{n}{suffix_of(kind, n, groups)}"

    holders = []
    while client.zcard(limit.ledger) < CAPACITY:
        t = token()
        if ledger.enter(t, [limit], ttl_ms=TTL_MS).admitted:
            holders.append(t)
    place = iter(range(1, 10**9))
    for _ in range(waiting):
        assert not ledger.enter(token(), [limit], ttl_ms=TTL_MS, line=Line.JOIN, place=next(place)).admitted
    handed: list[str] = []

    def leaves() -> None:
        for _ in range(rounds):
            left = ledger.leave(holders.pop(0), [limit], ttl_ms=TTL_MS, age_ms=0, own_process="bench:1")
            handed.extend(h.token for h in left.handoffs)
            holders.extend(h.token for h in left.handoffs)

    def joins() -> None:
        for _ in range(rounds):
            ledger.enter(token(), [limit], ttl_ms=TTL_MS, line=Line.JOIN, place=next(place))

    leave_cost = measure(client, leaves, rounds)
    assert handed, "every leave handed its slot on"
    join_cost = measure(client, joins, rounds)
    client.close()
    return (*leave_cost, *join_cost)


def uncontended(server: Server, rounds: int) -> tuple[float, float, float, float]:
    """Per call: (enter admitted, its CPU µs, leave with nobody in line, its CPU µs), on a ledger
    with room for every claim."""
    client = redis.Redis(port=server.port)
    ledger = Ledger(client, key_prefix="cost-free")
    limit = Limit(ledger.keys.queue("q"), rounds + 1)
    tokens = [f"bench:1:1:{n}" for n in range(rounds)]

    def enters() -> None:
        for t in tokens:
            assert ledger.enter(t, [limit], ttl_ms=TTL_MS).admitted

    def leaves() -> None:
        for t in tokens:
            ledger.leave(t, [limit], ttl_ms=TTL_MS, age_ms=0)

    cost = (*measure(client, enters, rounds), *measure(client, leaves, rounds))
    client.close()
    return cost


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument(
        "--waiting", default="10,1000", help="claims in line, comma separated (default 10,1000)"
    )
    parser.add_argument("--rounds", type=int, default=200, help="handoffs measured per case (default 200)")
    parser.add_argument("--groups", type=int, default=10, help="fair-share groups (default 10)")
    args = parser.parse_args(argv)
    with Server() as server:
        print(f"redis-server {server.version}; capacity {CAPACITY}; {args.rounds} calls per figure")
        free = uncontended(server, args.rounds)
        print(
            f"uncontended: enter admitted {free[0]:.1f} commands ({free[1]:.0f} µs CPU), "
            f"leave nobody waits {free[2]:.1f} commands ({free[3]:.0f} µs CPU)"
        )
        print(
            f"{'line':<10}{'waiting':>9}{'leave+handoff cmds':>20}{'CPU µs':>8}{'join cmds':>11}{'CPU µs':>8}"
        )
        for waiting in (int(w) for w in args.waiting.split(",")):
            for kind in ("plain", "grouped", "mixed", "weighted"):
                leave, leave_cpu, join, join_cpu = line_case(server, kind, waiting, args.rounds, args.groups)
                print(f"{kind:<10}{waiting:>9}{leave:>20.1f}{leave_cpu:>8.0f}{join:>11.1f}{join_cpu:>8.0f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
