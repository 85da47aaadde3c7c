"""The order pipeline's actors: plain dramatiq, plus two options from dramatiq_slots.

``place_order(order_id, account_id)``
    The entry point: books the order, then hands the slow parts to the two
    actors below. Not limited.
``call_partner_api(order_id)``
    Books the shipment with the shipping partner, whose API allows
    ``PARTNER_API_CAPACITY`` (3) concurrent calls per customer and answers
    HTTP 429 beyond that. ``queue_capacity`` caps the ``partner_api`` queue
    across every worker process on every host, however many you start.
``sync_account(account_id)``
    Recomputes an account's balance from its orders. Two syncs of the same
    account at once would race on its row; syncs of different accounts may
    run side by side. ``unique_at_runtime_key`` is a callable that names the
    account, so the key is ``account:<id>``.
``nightly_sales_report(day)``, ``nightly_stock_report(day)``
    Two reports that both scan the warehouse tables; either may run, never
    both at once. They share the literal key ``"nightly_report"``.

A message that cannot start yet waits in line, parked in its worker (no
thread held); after ``max_wait`` it is deferred (put back on its queue with a
delay): neither counts as a retry.
The bodies ``time.sleep`` where a real app would wait on the network or a
database.
"""

from __future__ import annotations

import logging
import random
import time

import dramatiq

from . import settings
from .broker import broker

logger = logging.getLogger("example_project.tasks")

__all__ = [
    "broker",
    "call_partner_api",
    "nightly_sales_report",
    "nightly_stock_report",
    "place_order",
    "sync_account",
]


def _io(low: float, high: float) -> None:
    """Stands in for a call to another system that takes ``low`` to ``high`` seconds."""
    time.sleep(random.uniform(low, high))  # noqa: S311 -- a made-up latency, not a secret


@dramatiq.actor(queue_name="orders")
def place_order(order_id: int, account_id: int) -> None:
    _io(0.05, 0.1)  # INSERT INTO orders ...
    call_partner_api.send(order_id)
    sync_account.send(account_id)


@dramatiq.actor(
    queue_name="partner_api",
    queue_capacity=settings.PARTNER_API_CAPACITY,
    defer_min_backoff=1_000,
    max_retries=5,
)
def call_partner_api(order_id: int) -> None:
    _io(0.3, 0.6)  # POST https://partner.example/shipments
    logger.info("order %s: shipment booked", order_id)


@dramatiq.actor(queue_name="accounts", unique_at_runtime_key=lambda account_id: f"account:{account_id}")
def sync_account(account_id: int) -> None:
    _io(0.2, 0.5)  # SELECT ... FOR UPDATE; recompute; UPDATE accounts ...
    logger.info("account %s: synced", account_id)


@dramatiq.actor(queue_name="reports", unique_at_runtime_key="nightly_report", time_limit=600_000)
def nightly_sales_report(day: str) -> None:
    _io(0.8, 1.0)  # the sales query over the warehouse tables
    logger.info("sales report for %s written", day)


@dramatiq.actor(queue_name="reports", unique_at_runtime_key="nightly_report", time_limit=600_000)
def nightly_stock_report(day: str) -> None:
    _io(0.8, 1.0)  # the stock query over the same tables
    logger.info("stock report for %s written", day)
