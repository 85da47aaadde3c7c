"""The ``dramatiq-slots`` command: ``status`` shows the ledgers, ``why`` where one message is,
``release`` frees holds by hand, ``settle`` ends a settling after a loss of data,
``set-capacity``, ``reset-capacity``, ``pause`` and ``resume`` set the operators' controls,
``web`` serves the operators' page.

::

    dramatiq-slots status                         # every ledger under the prefix, with its holders
    dramatiq-slots status --watch                 # redrawn every 2 s until Ctrl-C
    dramatiq-slots status --json                  # one JSON document
    dramatiq-slots status --key sync:42           # the ledger of one runtime key
    dramatiq-slots why MESSAGE_ID                 # where one message is, and why it waits
    dramatiq-slots release queue:emails TOKEN     # asks first; --yes does not
    dramatiq-slots release queue:emails --all
    dramatiq-slots set-capacity queue:emails 2    # an override, on every worker (asks first)
    dramatiq-slots reset-capacity queue:emails    # back to the declared capacity
    dramatiq-slots pause queue:emails             # nothing new starts; resume starts it again
    dramatiq-slots pause queue:emails --for 1h --reason "db migration"  # ends by itself
    dramatiq-slots resume --key sync:42
    dramatiq-slots settle                         # end a settling after a loss of data (asks first)
    dramatiq-slots web                            # the operators' page on http://127.0.0.1:8000/slots/
    dramatiq-slots web --controls --user alice    # with the controls (sign in with the printed URL)

Everything it reads comes from :class:`~dramatiq_slots.ops.inspection.Inspector`, on one
server, a Redis Cluster (``redis+cluster://``) or a Sentinel-managed primary
(``redis+sentinel://``); see :mod:`.connection`. The server is named by
:func:`~dramatiq_slots.ledger.client.redacted_address` only (host, port, database; a cluster's
node; a service and its sentinels): a URL's password is never printed, nor is the URL.

The modules: :mod:`.arguments` (the command line) and :mod:`.help` (its texts),
:mod:`.connection` (URLs and clients), :mod:`.commands` (what each command does),
:mod:`.render` (what it prints), :mod:`.exits` (exit codes), :mod:`.web` (the page, served alone).
None imports dramatiq or the middleware: the command runs where only the ledger's Redis is reachable.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Sequence

from ...errors import ArgumentError
from ...ledger.keys import KeySpace
from .arguments import build_parser
from .commands import control_command, release_command, settle_command, status_command, why_command
from .connection import PASSWORD_ON_COMMAND_LINE, connect, pick_url, scrub, url_secrets
from .exits import EXIT_ERROR, EXIT_INTERRUPTED, EXIT_NOTHING_DONE, PROG, Failure, err
from .help import CONTROL_COMMANDS


def main(argv: Sequence[str] | None = None) -> int:
    """Run the command; returns its exit code (see ``--help``)."""
    parser = build_parser()
    args = parser.parse_args(argv)
    secrets: set[str] = set()
    try:
        url, source = pick_url(args.url, args.url_file)
        secrets = url_secrets(url)
        args.secrets = secrets
        if source == "--url" and secrets:
            err(PASSWORD_ON_COMMAND_LINE)
        try:
            KeySpace(args.prefix)
        except ArgumentError as e:
            raise Failure(f"bad --prefix: {e}") from e
        client = connect(url, source, cluster=args.cluster)
        try:
            if args.command == "status":
                return status_command(args, client)
            if args.command == "web":
                from .web import web_command  # the page's modules load for this command only

                return web_command(args, client, args.command_parser)
            if args.command == "why":
                return why_command(args, client)
            if args.command == "settle":
                return settle_command(args, client)
            if args.command in CONTROL_COMMANDS:
                return control_command(args, client, args.command_parser)
            return release_command(args, client, args.command_parser)
        finally:
            client.close()
    except (Failure, ArgumentError) as e:  # an ArgumentError: a bad ledger name, or key
        sys.stdout.flush()
        err(f"{PROG}: {scrub(str(e), secrets)}")
        return e.code if isinstance(e, Failure) else EXIT_ERROR
    except KeyboardInterrupt:
        err("")
        return EXIT_INTERRUPTED
    except BrokenPipeError:
        # `dramatiq-slots status | head`: the reader left; say nothing more.
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        return EXIT_NOTHING_DONE


__all__ = ["build_parser", "main"]
