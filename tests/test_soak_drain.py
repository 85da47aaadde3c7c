"""The soak's drain finds a message stranded in a live worker's unacked set (``soak.run.unacked``),
on a real dramatiq Redis broker: a fetch that ran on the server and whose reply never arrived."""

from __future__ import annotations

import dramatiq
import redis
from dramatiq.brokers.redis import RedisBroker

from soak.run import unacked


def test_a_fetched_message_no_consumer_holds_is_found_in_its_workers_unacked_set(
    redis_server: object, redis_client: redis.Redis, key_prefix: str
) -> None:
    broker = RedisBroker(url=redis_server.url, namespace=key_prefix)  # type: ignore[attr-defined]
    try:

        @dramatiq.actor(broker=broker, queue_name="stranding")
        def job() -> None: ...

        stranded, waiting_in_line = job.send(), job.send()
        delayed = job.send_with_options(delay=60_000)
        assert unacked(redis_client, key_prefix, {stranded.message_id}) == set()
        # What the broker's kill left: the fetch script ran (moved into the worker's unacked
        # set), its reply was lost. Only one of the two is fetched; the other waits in the queue.
        broker.do_fetch("stranding", 1)
        broker.do_fetch("stranding.DQ", 1)
        every = {stranded.message_id, waiting_in_line.message_id, delayed.message_id, "not-sent"}
        assert unacked(redis_client, key_prefix, every) == {stranded.message_id, delayed.message_id}
        assert unacked(redis_client, key_prefix, {waiting_in_line.message_id}) == set()
    finally:
        for key in redis_client.scan_iter(match=f"{key_prefix}:*"):
            redis_client.delete(key)
        broker.close()
