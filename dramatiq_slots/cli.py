"""Deprecated: ``dramatiq_slots.cli`` moved; import its names from

- :mod:`dramatiq_slots.ops.cli.connection`
- :mod:`dramatiq_slots.ops.cli.render`
- :mod:`dramatiq_slots.ops.cli.help`
- :mod:`dramatiq_slots.ops.cli.exits`
- :mod:`dramatiq_slots.ops.cli.arguments`
- :mod:`dramatiq_slots.ops.cli.commands`
- :mod:`dramatiq_slots.ops.cli`

This shim, kept for code that imports the old path, re-exports them and warns.
"""

from __future__ import annotations

from ._moved import moved
from .ops.cli import main
from .ops.cli.arguments import (
    DEFAULT_WATCH_INTERVAL,
    add_connection_options,
    add_subcommand,
    build_parser,
    capacity_argument,
    positive_seconds,
)
from .ops.cli.commands import confirm, control_command, release_command, status_command, watch
from .ops.cli.connection import (
    CLUSTER_SCHEMES,
    DEFAULT_CLUSTER_PORT,
    DEFAULT_SENTINEL_PORT,
    DEFAULT_URL,
    SENTINEL_OPTIONS,
    SENTINEL_SCHEMES,
    SENTINEL_URL_FORM,
    SOCKET_TIMEOUT,
    URL_ENVIRONMENT,
    SentinelURL,
    cluster_client,
    connect,
    describe_redis_error,
    parse_sentinel_url,
    pick_url,
    redacted_cluster,
    scrub,
    sentinel_address,
    sentinel_client,
    talking_to,
    url_secrets,
)
from .ops.cli.exits import EXIT_ERROR, EXIT_INTERRUPTED, EXIT_NOTHING_DONE, EXIT_OK, PROG, Failure, err
from .ops.cli.help import (
    CONTROL_COMMANDS,
    CONTROL_EPILOG,
    EXIT_CODES,
    LEDGER_NAMES,
    LIVE_REFUSAL,
    MAIN_EPILOG,
    RELEASE_EPILOG,
    STATUS_EPILOG,
)
from .ops.cli.render import (
    HOLDER_COLUMNS,
    capacity_text,
    clean,
    control_line,
    holder_line,
    holder_row,
    ledger_heading,
    local_time,
    render_table,
    seconds_text,
    status_document,
)

moved(
    __name__,
    "dramatiq_slots.ops.cli.connection",
    "dramatiq_slots.ops.cli.render",
    "dramatiq_slots.ops.cli.help",
    "dramatiq_slots.ops.cli.exits",
    "dramatiq_slots.ops.cli.arguments",
    "dramatiq_slots.ops.cli.commands",
    "dramatiq_slots.ops.cli",
)

__all__ = [
    "CLUSTER_SCHEMES",
    "CONTROL_COMMANDS",
    "CONTROL_EPILOG",
    "DEFAULT_CLUSTER_PORT",
    "DEFAULT_SENTINEL_PORT",
    "DEFAULT_URL",
    "DEFAULT_WATCH_INTERVAL",
    "EXIT_CODES",
    "EXIT_ERROR",
    "EXIT_INTERRUPTED",
    "EXIT_NOTHING_DONE",
    "EXIT_OK",
    "HOLDER_COLUMNS",
    "LEDGER_NAMES",
    "LIVE_REFUSAL",
    "MAIN_EPILOG",
    "PROG",
    "RELEASE_EPILOG",
    "SENTINEL_OPTIONS",
    "SENTINEL_SCHEMES",
    "SENTINEL_URL_FORM",
    "SOCKET_TIMEOUT",
    "STATUS_EPILOG",
    "URL_ENVIRONMENT",
    "Failure",
    "SentinelURL",
    "add_connection_options",
    "add_subcommand",
    "build_parser",
    "capacity_argument",
    "capacity_text",
    "clean",
    "cluster_client",
    "confirm",
    "connect",
    "control_command",
    "control_line",
    "describe_redis_error",
    "err",
    "holder_line",
    "holder_row",
    "ledger_heading",
    "local_time",
    "main",
    "parse_sentinel_url",
    "pick_url",
    "positive_seconds",
    "redacted_cluster",
    "release_command",
    "render_table",
    "scrub",
    "seconds_text",
    "sentinel_address",
    "sentinel_client",
    "status_command",
    "status_document",
    "talking_to",
    "url_secrets",
    "watch",
]
