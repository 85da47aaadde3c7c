"""The command line: every command, its arguments and options, and their help."""

from __future__ import annotations

import argparse
from collections.abc import Callable
from typing import Any

from ... import __version__
from ...errors import ArgumentError
from ...ledger.client import URL_ENV
from ...ledger.controls import MAX_CAPACITY, checked_by, checked_reason, parse_duration
from ...ledger.keys import DEFAULT_KEY_PREFIX
from ..inspection import TIMED
from . import help as texts
from .connection import DEFAULT_URL
from .exits import PROG

DEFAULT_WATCH_INTERVAL = 2.0
DEFAULT_BIND = "127.0.0.1"
DEFAULT_PORT = 8000


#: ``--queue``: what a runtime key's text needs under a placement.
QUEUE_HELP = (
    "the queue of the --key messages (needed under a placement: a key is a limit of its queue's home)"
)


def number(
    kind: Callable[[str], Any], what: str, valid: Callable[[Any], bool], wrong: str
) -> Callable[[str], Any]:
    """An argparse type: the text as a ``kind``; a usage error ``not a <what>: '<text>'`` for one that
    is none, and ``wrong`` (its ``{text!r}`` the text) for one that is not ``valid``."""

    def parse(text: str) -> Any:
        try:
            value = kind(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"not a {what}: {text!r}") from None
        if not valid(value):
            raise argparse.ArgumentTypeError(wrong.format(text=text))
        return value

    return parse


positive_seconds = number(
    float,
    "number of seconds",
    lambda v: 0 < v < float("inf"),
    "must be a positive number of seconds, got {text!r}",
)
capacity_argument = number(
    int,
    "whole number",
    lambda v: 1 <= v <= MAX_CAPACITY,
    f"a capacity is from 1 to {MAX_CAPACITY}, got {{text!r}} (pause admits nothing new)",
)
port_argument = number(
    int, "port number", lambda v: 0 <= v <= 65535, "a port is from 0 to 65535 (0: any free one), got {text!r}"
)


def checked(check: Callable[[str], Any]) -> Callable[[str], Any]:
    """An argparse type from one of ``Controls``' checks: its ArgumentError is a usage error
    naming the flag."""

    def parse(text: str) -> Any:
        try:
            return check(text)
        except ArgumentError as e:
            raise argparse.ArgumentTypeError(str(e)) from None

    parse.__name__ = check.__name__
    return parse


def add_provenance(parser: argparse.ArgumentParser) -> None:
    """``--by`` and ``--reason``: who acts and why, as the release and the controls record them."""
    parser.add_argument(
        "--by",
        type=checked(checked_by),
        metavar="TEXT",
        help="who does it, as recorded and shown (default: <OS user>@<hostname>)",
    )
    parser.add_argument(
        "--reason", type=checked(checked_reason), metavar="TEXT", help="why, as recorded and shown"
    )


def add_key_options(parser: argparse.ArgumentParser, key_help: str, **key: Any) -> None:
    """``--key TEXT``, a runtime key's ledger (``key_help`` says how; ``key``: more of its options),
    and ``--queue NAME``, its messages' queue."""
    parser.add_argument("--key", metavar="TEXT", help=key_help, **key)
    parser.add_argument("--queue", metavar="NAME", help=QUEUE_HELP)


def add_connection_options(parser: argparse.ArgumentParser, *, top: bool) -> None:
    """``--url`` and ``--prefix``, on the command and again on each subcommand.

    On a subcommand their default is SUPPRESS, so one given before the
    subcommand is not overwritten by the subcommand's own default.
    """
    default: Any = None if top else argparse.SUPPRESS
    parser.add_argument(
        "--url",
        default=default,
        metavar="URL",
        help=f"the ledger's Redis: redis://, rediss://, unix://, redis+cluster://, redis+sentinel:// "
        f"(see below; default: ${URL_ENV}, else $REDIS_URL, else {DEFAULT_URL})",
    )
    parser.add_argument(
        "--url-file",
        default=default,
        metavar="PATH",
        help="read the URL from the first line of this file (a password on the command line is seen "
        "by every local user: use this or the environment)",
    )
    parser.add_argument(
        "--cluster",
        action="store_true",
        default=False if top else argparse.SUPPRESS,
        help="the URL (redis:// or rediss://) names a node of a Redis Cluster, like redis+cluster://",
    )
    parser.add_argument(
        "--prefix",
        default=DEFAULT_KEY_PREFIX if top else argparse.SUPPRESS,
        metavar="PREFIX",
        help=f"the workers' key_prefix (default: {DEFAULT_KEY_PREFIX})",
    )


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog=PROG,
        description=(
            "Show and free the holds of dramatiq-slots ledgers (queue capacities, runtime keys), and "
            "set their operators' controls; serve the operators' web page."
        ),
        epilog=texts.MAIN_EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
        allow_abbrev=False,
    )
    parser.add_argument("--version", action="version", version=f"%(prog)s {__version__}")
    add_connection_options(parser, top=True)
    commands = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    # Each command: its texts (help.py), its own --url/--prefix/--cluster, no abbreviations.
    parsers: dict[str, argparse.ArgumentParser] = {}
    for name, (summary, description, epilog) in texts.COMMANDS.items():
        parsers[name] = commands.add_parser(
            name,
            help=summary,
            description=description,
            epilog=epilog,
            formatter_class=argparse.RawDescriptionHelpFormatter,
            allow_abbrev=False,
        )
        add_connection_options(parsers[name], top=False)
        parsers[name].set_defaults(command_parser=parsers[name])

    status = parsers["status"]
    status.add_argument(
        "ledgers", nargs="*", metavar="LEDGER", help="show only these ledgers (queue:<name>, key:<digest>)"
    )
    add_key_options(
        status,
        "show the ledger of this runtime key (what unique_at_runtime_key returns); repeatable",
        action="append",
        default=[],
    )
    status.add_argument("--json", action="store_true", help="print JSON instead of a table")
    status.add_argument(
        "--watch",
        nargs="?",
        type=positive_seconds,
        const=DEFAULT_WATCH_INTERVAL,
        default=None,
        metavar="SECONDS",
        help=f"redraw every SECONDS (default {DEFAULT_WATCH_INTERVAL:g}) until Ctrl-C",
    )

    why = parsers["why"]
    why.add_argument("message_id", metavar="MESSAGE_ID", help="the message's id (message.message_id)")
    why.add_argument("--json", action="store_true", help="print JSON instead of text")

    release = parsers["release"]
    release.usage = (
        "%(prog)s [-h] [--url URL] [--cluster] [--prefix PREFIX] [--yes] [--force]\n"
        "       [--by TEXT] [--reason TEXT] (LEDGER | --key TEXT) (TOKEN [TOKEN ...] | --all)"
    )
    release.add_argument(
        "names",
        nargs="*",
        metavar="LEDGER TOKEN",
        help="the ledger as status prints it (queue:<name>, key:<digest>) or a full key, "
        "then the tokens of the holds to remove",
    )
    add_key_options(release, "the ledger of this runtime key (then every word is a TOKEN)")
    release.add_argument("--all", action="store_true", help="remove every hold of the ledger")
    add_provenance(release)
    release.add_argument("-y", "--yes", action="store_true", help="do not ask for confirmation")
    release.add_argument(
        "--force", action="store_true", help="remove holds of live worker processes too (see below)"
    )

    parsers["settle"].add_argument("-y", "--yes", action="store_true", help="do not ask for confirmation")

    for command in texts.CONTROL_COMMANDS:
        sets = command in TIMED
        control = parsers[command]
        control.usage = (
            "%(prog)s [-h] [--url URL] [--cluster] [--prefix PREFIX] [--yes]\n       [--by TEXT]"
            + (" [--reason TEXT] [--for DURATION]" if sets else " [--reason TEXT]")
            + " (LEDGER | --key TEXT)"
            + (" N" if command == "set-capacity" else "")
        )
        control.add_argument(
            "ledger",
            nargs="?",
            metavar="LEDGER",
            help="the ledger as status prints it (queue:<name>, key:<digest>)",
        )
        if command == "set-capacity":
            control.add_argument(
                "capacity", type=capacity_argument, metavar="N", help="the new capacity (>= 1)"
            )
        add_key_options(control, "the ledger of this runtime key (instead of LEDGER)")
        control.add_argument("-y", "--yes", action="store_true", help="do not ask for confirmation")
        add_provenance(control)
        if sets:
            control.add_argument(
                "--for",
                dest="for_ms",
                type=checked(parse_duration),
                metavar="DURATION",
                help="end by itself after DURATION (90s, 15m, 1h, 2h30m, 1d), by the Redis clock",
            )

    web = parsers["web"]
    web.add_argument(
        "--bind",
        default=DEFAULT_BIND,
        metavar="HOST",
        help=f"the address to listen on (default {DEFAULT_BIND}: this host only)",
    )
    web.add_argument(
        "--port",
        type=port_argument,
        default=DEFAULT_PORT,
        metavar="PORT",
        help=f"the port to listen on (default {DEFAULT_PORT}; 0: any free port)",
    )
    web.add_argument(
        "--controls",
        action="store_true",
        help="let the page act (set capacity, reset, pause, resume, release a dead worker's hold); "
        "needs --user",
    )
    web.add_argument(
        "--user",
        metavar="NAME",
        help="the operator the page acts as with --controls (after signing in with the printed URL)",
    )
    return parser
