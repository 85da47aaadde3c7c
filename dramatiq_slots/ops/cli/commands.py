"""The ``dramatiq-slots`` command: ``status`` shows the ledgers, ``release`` frees holds by hand,
``set-capacity``, ``reset-capacity``, ``pause`` and ``resume`` set the operators' controls.

::

    dramatiq-slots status                         # every ledger under the prefix, with its holders
    dramatiq-slots status --watch                 # redrawn every 2 s until Ctrl-C
    dramatiq-slots status --json                  # one JSON document
    dramatiq-slots status --key sync:42           # the ledger of one runtime key
    dramatiq-slots release queue:emails TOKEN     # asks first; --yes does not
    dramatiq-slots release queue:emails --all
    dramatiq-slots set-capacity queue:emails 2    # an override, on every worker (asks first)
    dramatiq-slots reset-capacity queue:emails    # back to the declared capacity
    dramatiq-slots pause queue:emails             # nothing new starts; resume starts it again
    dramatiq-slots resume --key sync:42

Everything it reads comes from :class:`~dramatiq_slots.inspection.Inspector`, on one
server, a Redis Cluster (``redis+cluster://``) or a Sentinel-managed primary
(``redis+sentinel://``); see :func:`connect`. The server is named by
:func:`~dramatiq_slots.ledger.redacted_address` only (host, port, database; a cluster's
node; a service and its sentinels): a URL's password is never printed, nor is the URL.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from typing import Any
from urllib.parse import parse_qs, unquote, urlencode, urlsplit

import redis
from redis.backoff import NoBackoff
from redis.cluster import RedisCluster
from redis.connection import parse_url
from redis.retry import Retry
from redis.sentinel import MasterNotFoundError, Sentinel

from ... import __version__
from ...errors import LedgerError
from ...ledger.controls import MAX_CAPACITY, Change
from ...ledger.keys import DEFAULT_KEY_PREFIX, KeySpace
from ...ledger.ledger import RedisClient, redacted_address
from ...middleware.slots import URL_ENV
from ..inspection import HolderView, Inspector, LedgerView, Released, age_text

PROG = "dramatiq-slots"

#: Where the ledger's Redis is read from when ``--url`` is not given, first found wins.
#: The workers' own variable first: a broker in REDIS_URL and a ledger elsewhere must not mislead.
URL_ENVIRONMENT = (URL_ENV, "REDIS_URL")
DEFAULT_URL = "redis://localhost:6379/0"

#: Socket and connect timeout (s) unless the URL sets its own (as the middleware does).
SOCKET_TIMEOUT = 5.0
DEFAULT_WATCH_INTERVAL = 2.0

#: ``redis+cluster://``: any node of a Redis Cluster; the scheme redis-py is given instead.
CLUSTER_SCHEMES = {"redis+cluster": "redis", "rediss+cluster": "rediss"}
#: ``redis+sentinel://``: a Sentinel-managed primary; whether it is reached over TLS.
SENTINEL_SCHEMES = {"redis+sentinel": False, "rediss+sentinel": True}
DEFAULT_SENTINEL_PORT = 26379
DEFAULT_CLUSTER_PORT = 6379
#: Query options of a sentinel URL that are the sentinels' own (the rest are the primary's).
SENTINEL_OPTIONS = {"sentinel_username": "username", "sentinel_password": "password"}
SENTINEL_URL_FORM = "redis+sentinel://[[USER]:PASSWORD@]HOST[:PORT][,HOST[:PORT]...]/SERVICE[/DB]"

EXIT_OK = 0
#: Nothing was done: no such hold, holds of live processes refused, removal not confirmed.
EXIT_NOTHING_DONE = 1
#: Usage error, bad ledger name or URL, Redis unreachable or refusing.
EXIT_ERROR = 2
EXIT_INTERRUPTED = 130

EXIT_CODES = f"""\
exit codes:
  {EXIT_OK}    done (status printed, holds removed; --watch ended by Ctrl-C)
  {EXIT_NOTHING_DONE}    nothing removed: no such hold, holds of live processes refused,
       or the removal not confirmed
  {EXIT_ERROR}    usage error, bad ledger name, prefix or URL; Redis unreachable or refusing
       (wrong password, ACL)
  {EXIT_INTERRUPTED}  interrupted (Ctrl-C) outside --watch
"""

MAIN_EPILOG = f"""\
The ledger's Redis: --url, else the environment variable {URL_ENV}, else
REDIS_URL, else {DEFAULT_URL}. Give the Redis and the key_prefix
the workers use. URLs:
  redis://[[USER]:PASSWORD@]HOST[:PORT][/DB]     one server (rediss://: TLS)
  unix://[[USER]:PASSWORD@]/PATH[?db=DB]          one server, on a Unix socket
  redis+cluster://[[USER]:PASSWORD@]HOST[:PORT]   any node of a Redis Cluster
                                                  (rediss+cluster://: TLS; or --cluster
                                                  with a redis:// or rediss:// URL)
  redis+sentinel://[[USER]:PASSWORD@]HOST[:PORT][,HOST[:PORT]...]/SERVICE[/DB]
                                                  the primary the sentinels name for
                                                  SERVICE (port {DEFAULT_SENTINEL_PORT} by default;
                                                  rediss+sentinel://: TLS to the primary)
A sentinel URL's USER and PASSWORD are the primary's; sentinels that want their own take
?sentinel_username=...&sentinel_password=... Other query options (socket_timeout,
ssl_ca_certs, ...) go to the server's connections, as in a redis:// URL.
Messages name the server by host:port/db (a cluster by the node given, a sentinel-managed
primary by its service and sentinels), never with its password.

{EXIT_CODES}"""

LEDGER_NAMES = """\
ledger names, as status prints them:
  queue:<queue name>      the capacity ledger of a queue
  key:<32 hex digits>     the ledger of a runtime-unique key (its digest; --key TEXT hashes a key)
  {<prefix>}:queue:...    a full ledger key
"""

STATUS_EPILOG = f"""\
{LEDGER_NAMES}
Columns of a holder: HOST, PID and THREAD from its claim token; AGE since the hold was
taken and MESSAGE (actor(message id)), as its worker process reports them (- without
a report); LEFT, seconds until the hold expires unless its heartbeat refreshes it;
ALIVE, whether its process reports (a live worker: a worker writes its report at
boot and every beat, and it expires 2.5 beat intervals later, so a killed worker shows
"no" within about two beats; a stopped one removes it); TOKEN, what release takes.
Capacity is the one in force: an operator's override (shown as "N (override; declared
M)", see set-capacity), else the one live workers declare (- when none does): a queue's
from any live worker that caps it, a runtime key's from the reported holds of that key.
PAUSED: an operator paused the ledger (see pause); a paused or overridden ledger is
listed even when it holds nothing.

--json prints one document: {{"server", "prefix", "at", "ledgers": [{{"ledger", "kind",
"name", "short", "capacity", "in_use", "waiting", "declared", "override", "paused",
"paused_at", "holders": [{{"token", "host", "pid",
"thread", "seconds_left", "age", "actor", "label", "process_alive"}}]}}]}}; with --watch,
one such document per line and refresh. Unknown values are null.

Put ledger names before --watch (--watch takes an optional number).

{EXIT_CODES}"""

RELEASE_EPILOG = f"""\
{LEDGER_NAMES}
A hold whose worker process is alive belongs to a running job, and that process's
next heartbeat puts a lost hold back: releasing it frees nothing for long. Such holds
are refused unless --force; stop that worker or let its job end first.
Alive means that the process's report exists when the hold is removed: the reports
are read again just before, so a worker whose late beat came back meanwhile is
spared. A report outlives a beat up to 1.5 beat intervals late; a worker silent for
longer (killed, or cut off from Redis) counts as dead, and if it comes back it
re-asserts what was removed.
Holds of dead processes expire by themselves after hold_ttl; release frees them now,
handing each freed slot to the first message in line when the capacity is known.

The holds are listed, then removal is confirmed on the terminal, unless --yes.
Without a terminal on stdin and without --yes nothing is removed.

{EXIT_CODES}"""


class Failure(Exception):
    """An error for the user: one line on stderr, and an exit code."""

    def __init__(self, message: str, code: int = EXIT_ERROR) -> None:
        super().__init__(message)
        self.code = code


# -- text ----------------------------------------------------------------------------------


def clean(text: object) -> str:
    """``text`` safe for a terminal: control characters shown as escapes.

    Names, hosts and message labels come from Redis, where any client may
    have written them; none may move the cursor or retitle a terminal.
    """
    return "".join(c if c.isprintable() else repr(c)[1:-1] for c in str(text))


def url_secrets(url: str) -> set[str]:
    """Every form of the password a URL carries (userinfo, ``?password=``, ``?sentinel_password=``),
    to keep out of messages."""
    found: set[str] = set()
    match = re.search(r"://([^/?#]*)@", url)
    if match:
        _, sep, password = match.group(1).partition(":")
        if sep and password:
            found |= {password, unquote(password)}
    try:
        query = urlsplit(url).query
    except ValueError:
        query = url.partition("?")[2]
    for name, values in parse_qs(query).items():
        if name == "password" or name.endswith("_password"):  # sentinel_password too
            found.update(values)
    return {s for s in found if s}


def scrub(text: str, secrets: set[str]) -> str:
    """``text`` with every secret replaced by ``***``, longest first."""
    for secret in sorted(secrets, key=len, reverse=True):
        text = text.replace(secret, "***")
    return text


def seconds_text(seconds: float) -> str:
    return f"{seconds:.1f}s"


def local_time(at: float) -> str:
    return time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(at))


# -- connecting ------------------------------------------------------------------------------


def pick_url(given: str | None) -> tuple[str, str]:
    """``(url, where it came from)``: ``--url``, else the environment, else the default."""
    if given:
        return given, "--url"
    for name in URL_ENVIRONMENT:
        value = os.environ.get(name)
        if value:
            return value, name
    return DEFAULT_URL, "the default URL"


def connect(url: str, source: str, *, cluster: bool = False) -> RedisClient:
    """A client for ``url``; :class:`Failure` for a URL it cannot use.

    Nothing is sent yet, except to a cluster: its client asks a node for the
    slot map when it is made. ``cluster``: a ``redis://`` URL names a cluster node.
    """
    scheme = url.partition("://")[0].lower()
    if scheme in SENTINEL_SCHEMES:
        if cluster:
            raise Failure(f"--cluster takes a redis:// or rediss:// URL, not a sentinel URL (from {source})")
        return sentinel_client(url, source)
    if scheme in CLUSTER_SCHEMES or cluster:
        return cluster_client(url, source)
    try:
        client: redis.Redis = redis.Redis.from_url(
            url, socket_timeout=SOCKET_TIMEOUT, socket_connect_timeout=SOCKET_TIMEOUT
        )
    except (ValueError, TypeError) as e:
        # Never echo the URL: it may carry a password.
        raise Failure(f"bad Redis URL (from {source}): {e}") from e
    return client


def cluster_client(url: str, source: str) -> RedisCluster:
    """A cluster client from any node's URL (``redis+cluster://``, or ``redis://`` with ``--cluster``)."""
    scheme, _, rest = url.partition("://")
    plain_scheme = CLUSTER_SCHEMES.get(scheme.lower(), scheme.lower())
    if plain_scheme not in ("redis", "rediss"):
        raise Failure(
            f"bad Redis URL (from {source}): a Redis Cluster is named by a node's "
            "redis+cluster://, rediss+cluster://, redis:// or rediss:// URL"
        )
    plain = f"{plain_scheme}://{rest}"
    try:
        options = parse_url(plain)  # type: ignore[no-untyped-call]
        if options.get("db", 0) != 0:
            raise ValueError("a Redis Cluster has database 0 only")
        parts = urlsplit(plain)
        address = redacted_cluster(parts.hostname or "localhost", parts.port or DEFAULT_CLUSTER_PORT)
    except ValueError as e:
        raise Failure(f"bad Redis URL (from {source}): {e}") from e
    try:
        client: RedisCluster = RedisCluster.from_url(
            plain, socket_timeout=SOCKET_TIMEOUT, socket_connect_timeout=SOCKET_TIMEOUT
        )
    except (ValueError, TypeError) as e:
        raise Failure(f"bad Redis URL (from {source}): {e}") from e
    except (redis.RedisError, redis.exceptions.RedisClusterException) as e:
        # The client reads the slot map as it is made: this is the first conversation.
        raise Failure(describe_redis_error(e, address)) from e
    return client


def redacted_cluster(host: str, port: int) -> str:
    """How :func:`~dramatiq_slots.ledger.redacted_address` names a cluster reached through one node."""
    return f"cluster via [{host}]:{port}" if ":" in host else f"cluster via {host}:{port}"


def sentinel_client(url: str, source: str) -> redis.Redis:
    """The client of the primary the sentinels of a ``redis+sentinel://`` URL name for its service.

    The URL's user and password are the primary's; ``?sentinel_username=`` and
    ``?sentinel_password=`` the sentinels'. Other query options are the primary's,
    read as in a ``redis://`` URL.
    """
    try:
        parsed = parse_sentinel_url(url)
    except ValueError as e:
        # Never echo the URL: it may carry a password.
        raise Failure(f"bad Redis URL (from {source}): {e}") from e
    timeouts = {"socket_timeout": SOCKET_TIMEOUT, "socket_connect_timeout": SOCKET_TIMEOUT}
    # One try per sentinel: the next one is the retry (redis-py's default backs off for seconds).
    once = {"retry": Retry(NoBackoff(), 0)}
    manager = Sentinel(  # type: ignore[no-untyped-call]
        parsed.sentinels, sentinel_kwargs={**timeouts, **once, **parsed.sentinel_options}
    )
    client: redis.Redis = manager.master_for(  # type: ignore[no-untyped-call]
        parsed.service, **{**timeouts, **parsed.primary_options}
    )
    return client


@dataclass(frozen=True)
class SentinelURL:
    """What a ``redis+sentinel://`` URL says."""

    sentinels: list[tuple[str, int]]
    service: str
    #: For the primary's connections (user, password, db, TLS, query options).
    primary_options: dict[str, Any]
    #: For the sentinels' connections (``?sentinel_username=``, ``?sentinel_password=``).
    sentinel_options: dict[str, str]


def parse_sentinel_url(url: str) -> SentinelURL:
    """What a sentinel URL says; ValueError, never quoting the URL, for one that is malformed."""
    # Split by hand: a list of hosts with a bracketed IPv6 one is not one netloc, and patched
    # Pythons' urlsplit refuses it ("Invalid IPv6 URL").
    scheme, _, rest = url.partition("://")
    rest = rest.partition("#")[0]
    rest, _, query_text = rest.partition("?")
    netloc, _, path_text = rest.partition("/")
    userinfo, _, hosts = netloc.rpartition("@")
    sentinels = [sentinel_address(text) for text in hosts.split(",")]
    path = path_text.removesuffix("/").split("/")
    service = unquote(path[0])
    if not service:
        raise ValueError(
            f"a sentinel URL names the primary's service after its sentinels: {SENTINEL_URL_FORM}"
        )
    if len(path) > 2:
        raise ValueError(f"a sentinel URL has a service and at most a database after it: {SENTINEL_URL_FORM}")
    query = parse_qs(query_text)
    sentinel_options = {
        SENTINEL_OPTIONS[name]: query.pop(name)[-1] for name in list(query) if name in SENTINEL_OPTIONS
    }
    # The primary's options are read as redis-py reads a redis:// URL's (types, db).
    primary_options: dict[str, Any] = parse_url(  # type: ignore[no-untyped-call]
        "redis://localhost?" + urlencode(query, doseq=True)
    )
    primary_options.pop("host", None)
    if len(path) == 2 and "db" not in primary_options:
        if not (path[1].isascii() and path[1].isdigit()):
            raise ValueError(f"a sentinel URL's database after the service is a number: {SENTINEL_URL_FORM}")
        primary_options["db"] = int(path[1])
    username, colon, password = userinfo.partition(":")
    if username:
        primary_options["username"] = unquote(username)
    if colon and password:
        primary_options["password"] = unquote(password)
    if SENTINEL_SCHEMES[scheme.lower()]:
        primary_options["ssl"] = True
    return SentinelURL(sentinels, service, primary_options, sentinel_options)


def sentinel_address(text: str) -> tuple[str, int]:
    """``(host, port)`` of one ``HOST[:PORT]`` (``[IPv6]:PORT``) of a sentinel URL."""
    if text.startswith("["):
        host, _, rest = text[1:].partition("]")
        port = rest[1:] if rest.startswith(":") else rest
    else:
        host, _, port = text.partition(":")
    if not host:
        raise ValueError(f"a sentinel URL names each sentinel by HOST[:PORT]: {SENTINEL_URL_FORM}")
    if not port:
        return unquote(host), DEFAULT_SENTINEL_PORT
    if not (port.isascii() and port.isdigit() and 0 < int(port) < 65536):
        raise ValueError(f"a sentinel's port is a number from 1 to 65535: {SENTINEL_URL_FORM}")
    return unquote(host), int(port)


def describe_redis_error(error: BaseException, address: str) -> str:
    """One line for a failed Redis conversation, naming the server by its redacted address."""
    if isinstance(error, LedgerError) and error.__cause__ is not None:
        error = error.__cause__
    if isinstance(error, redis.exceptions.RedisClusterException) and isinstance(
        error.__cause__, redis.RedisError
    ):
        error = error.__cause__  # no node could be asked for the slot map: why
    if isinstance(error, MasterNotFoundError):
        # Its text lists every sentinel client's repr: too long for one line, and says no more.
        why = (
            "a sentinel could not be asked (unreachable, or refusing its credentials), and none that "
            "answered named a primary of that service that is up"
            if " : " in str(error)
            else "the sentinels know no primary of that service that is up"
        )
        return f"no primary found at {address}: {why} (MasterNotFoundError)"
    detail = f"{type(error).__name__}: {error}"
    if isinstance(error, redis.AuthenticationError):
        return f"Redis at {address} refused the credentials ({detail})"
    if isinstance(error, redis.exceptions.NoPermissionError):
        return (
            f"Redis at {address} refused a command to this user ({detail}); status needs SCAN, "
            "GET and the ledger's commands"
        )
    if isinstance(error, (redis.ConnectionError, redis.TimeoutError)):
        return f"cannot reach Redis at {address} ({detail})"
    return f"Redis at {address} failed ({detail})"


def talking_to(client: RedisClient, action: Callable[[], Any]) -> Any:
    """``action()``, with Redis errors turned into a :class:`Failure` naming the server."""
    try:
        return action()
    except (redis.RedisError, redis.exceptions.RedisClusterException, LedgerError) as e:
        raise Failure(describe_redis_error(e, redacted_address(client))) from e


# -- status ------------------------------------------------------------------------------------


HOLDER_COLUMNS = ("HOST", "PID", "THREAD", "AGE", "LEFT", "MESSAGE", "ALIVE", "TOKEN")


def holder_row(holder: HolderView) -> tuple[str, ...]:
    return (
        clean(holder.host),
        "-" if holder.pid is None else str(holder.pid),
        "-" if holder.thread is None else str(holder.thread),
        age_text(holder.age),
        seconds_text(holder.seconds_left),
        "-" if holder.label is None else clean(holder.label),
        "yes" if holder.process_alive else "no",
        clean(holder.token),
    )


def capacity_text(view: LedgerView) -> str:
    """``5``, ``2 (override; declared 5)``, ``-``: the capacity in force and where it comes from."""
    if view.override is None:
        return "-" if view.capacity is None else str(view.capacity)
    declared = "" if view.declared is None else f"; declared {view.declared}"
    return f"{view.override} (override{declared})"


def ledger_heading(view: LedgerView, keys_by_ledger: dict[str, str]) -> str:
    heading = (
        f"{clean(view.short)}  capacity {capacity_text(view)}  in use {view.in_use}  waiting {view.waiting}"
    )
    if view.paused:
        since = "" if view.paused_at is None else f" since {local_time(view.paused_at)}"
        heading += f"  PAUSED{since}"
    if view.ledger in keys_by_ledger:
        heading += f"  (key {clean(keys_by_ledger[view.ledger])})"
    return heading


def render_table(
    views: Sequence[LedgerView], *, address: str, prefix: str, at: float, keys_by_ledger: dict[str, str]
) -> str:
    """The status table: a header line, then one block per ledger with a line per holder."""
    lines = [f"{local_time(at)}  {clean(address)}  prefix {clean(prefix)}"]
    if not views:
        lines.append(f"no ledger holds anything under prefix {clean(prefix)}")
        return "\n".join(lines) + "\n"
    rows = [holder_row(h) for v in views for h in v.holders]
    widths = [max(len(r[i]) for r in [HOLDER_COLUMNS, *rows]) for i in range(len(HOLDER_COLUMNS))]

    def line(cells: Sequence[str]) -> str:
        return "  " + "  ".join(c.ljust(w) for c, w in zip(cells, widths, strict=True)).rstrip()

    for view in views:
        lines += ["", ledger_heading(view, keys_by_ledger)]
        if view.holders:
            lines.append(line(HOLDER_COLUMNS))
            lines += [line(holder_row(h)) for h in view.holders]
        else:
            lines.append("  (no holds)")
    return "\n".join(lines) + "\n"


def status_document(views: Sequence[LedgerView], *, address: str, prefix: str, at: float) -> dict[str, Any]:
    """What ``status --json`` prints: every key always present, null when unknown."""
    ledgers = []
    for view in views:
        data = asdict(view)
        holders = data.pop("holders")
        ledgers.append({**data, "short": view.short, "holders": holders})
    return {"server": address, "prefix": prefix, "at": round(at, 3), "ledgers": ledgers}


def status_command(args: argparse.Namespace, client: RedisClient) -> int:
    inspector = Inspector(client, key_prefix=args.prefix)
    address = redacted_address(client)
    keys_by_ledger = {inspector.key_ledger(text): text for text in args.key}
    names: list[str] | None = None
    if args.ledgers or args.key:
        try:
            names = [inspector.resolve(name) for name in args.ledgers]
        except ValueError as e:
            raise Failure(str(e)) from e
        names += list(keys_by_ledger)

    def render(one_line: bool) -> str:
        views = talking_to(client, lambda: inspector.ledgers(names))
        at = time.time()
        if args.json:
            document = status_document(views, address=address, prefix=args.prefix, at=at)
            text = json.dumps(document, indent=None if one_line else 2)
            return text + "\n"
        return render_table(views, address=address, prefix=args.prefix, at=at, keys_by_ledger=keys_by_ledger)

    if args.watch is None:
        sys.stdout.write(render(one_line=False))
        sys.stdout.flush()  # here, where a closed pipe (`| head`) is handled
        return EXIT_OK
    clear = sys.stdout.isatty() and not args.json
    return watch(render, args.watch, clear=clear, json_lines=args.json, secrets=args.secrets)


def watch(
    render: Callable[[bool], str], interval: float, *, clear: bool, json_lines: bool, secrets: set[str]
) -> int:
    """Redraw every ``interval`` s until Ctrl-C (exit 0).

    The first refresh failing is an error (a wrong URL, most likely); later
    ones are shown and retried, so a failover does not end the watch.
    """
    first = True
    try:
        while True:
            try:
                text = render(True)
            except Failure as e:
                if first:
                    raise
                message = f"{local_time(time.time())}  {scrub(str(e), secrets)}"
                if json_lines:
                    sys.stderr.write(f"{PROG}: {message}\n")
                    sys.stderr.flush()
                    text = ""
                else:
                    text = message + "\n"
            if clear:
                sys.stdout.write("\x1b[H\x1b[2J")
            elif not first and not json_lines:
                sys.stdout.write("\n")
            sys.stdout.write(text)
            sys.stdout.flush()
            first = False
            time.sleep(interval)
    except KeyboardInterrupt:
        return EXIT_OK


# -- release --------------------------------------------------------------------------------------


LIVE_REFUSAL = (
    "a running job re-asserts a lost hold, so its process's next heartbeat would put it back: "
    "stop that worker or let its job end; --force removes it anyway, and its heartbeat will "
    "re-assert it at its next beat unless the job has ended"
)


def holder_line(holder: HolderView) -> str:
    pid = "?" if holder.pid is None else holder.pid
    label = "message unknown" if holder.label is None else clean(holder.label)
    alive = "process alive" if holder.process_alive else "process not reporting"
    return (
        f"  {clean(holder.token)}  ({clean(holder.host)} pid {pid}, {label}, {alive}, "
        f"age {age_text(holder.age)}, {seconds_text(holder.seconds_left)} left)"
    )


def confirm(question: str) -> bool:
    """Ask on the terminal (question on stderr, answer from stdin); only y/yes is a yes."""
    sys.stderr.write(f"{question} [y/N] ")
    sys.stderr.flush()
    answer = sys.stdin.readline()
    if not answer.endswith("\n"):  # end of input: no answer
        sys.stderr.write("\n")
    return answer.strip().lower() in ("y", "yes")


def release_command(args: argparse.Namespace, client: RedisClient, parser: argparse.ArgumentParser) -> int:
    inspector = Inspector(client, key_prefix=args.prefix)
    words: list[str] = list(args.names)
    if args.key is not None:
        ledger, tokens = inspector.key_ledger(args.key), words
    elif words:
        try:
            ledger = inspector.resolve(words[0])
        except ValueError as e:
            raise Failure(str(e)) from e
        tokens = words[1:]
    else:
        parser.error("give the LEDGER (as status prints it) or --key TEXT")
    if args.all and tokens:
        parser.error("give TOKENs or --all, not both")
    if not args.all and not tokens:
        parser.error("give the TOKEN(s) of the holds to remove, or --all")

    view: LedgerView = talking_to(client, lambda: inspector.ledgers([ledger])[0])
    name = clean(view.short)
    present = {h.token: h for h in view.holders}
    if args.all:
        chosen = list(view.holders)
    else:
        wanted = list(dict.fromkeys(tokens))
        for token in wanted:
            if token not in present:
                err(f"no hold {clean(token)} in {name}")
        chosen = [present[t] for t in wanted if t in present]
    if not chosen:
        err(f"nothing to remove from {name}" + (" (it holds nothing)" if args.all else ""))
        return EXIT_NOTHING_DONE

    live = [h for h in chosen if h.process_alive]
    if live and not args.force:
        err(f"refusing to release {len(live)} hold(s) of live worker processes from {name}:")
        for holder in live:
            err(holder_line(holder))
        err(LIVE_REFUSAL)
        chosen = [h for h in chosen if not h.process_alive]
        if not chosen:
            return EXIT_NOTHING_DONE

    print(f"{len(chosen)} hold(s) to remove from {name}:")
    for holder in chosen:
        print(holder_line(holder))
    sys.stdout.flush()
    if not args.yes:
        if not sys.stdin.isatty():
            err("nothing removed: stdin is not a terminal to confirm on; pass --yes to remove without asking")
            return EXIT_NOTHING_DONE
        if not confirm(f"Remove {len(chosen)} hold(s)?"):
            err("nothing removed")
            return EXIT_NOTHING_DONE

    released: Released = talking_to(
        client, lambda: inspector.release(ledger, [h.token for h in chosen], force=args.force)
    )
    removed = set(released.removed)
    for holder in released.spared:
        err(
            f"not removed: {clean(holder.token)} from {name}: its process reports again, it is alive "
            "(its late beat came back); --force removes it anyway"
        )
    spared = {h.token for h in released.spared}
    for holder in chosen:
        if holder.token in spared:
            continue
        if holder.token in removed:
            print(f"removed hold {clean(holder.token)} from {name}")
            if holder.process_alive:
                err(
                    f"warning: the process of {clean(holder.token)} is alive: its heartbeat will re-assert "
                    "the hold at its next beat unless the job has ended"
                )
        else:
            err(f"hold {clean(holder.token)} was already gone from {name}")
    return EXIT_OK if removed else EXIT_NOTHING_DONE


# -- controls ------------------------------------------------------------------------------------


CONTROL_EPILOG = f"""\
{LEDGER_NAMES}
A control is kept in the ledger's Redis and wins over the capacity the code declares,
on every worker, for the next admission, release and beat of each (workers listening
for changes beat at once, so room a raise or a resume makes goes to the first messages
in line at once); it stays until it is changed again, through worker restarts and
deploys. Workers log one INFO line for each change.

  set-capacity    admit at most N at once, across every worker; below the holds in use,
                  no running job is stopped: new admissions wait until fewer than N run
  reset-capacity  drop the override: the declared capacity is in force again
  pause           admit nothing new; running jobs finish, waiting messages keep their
                  places in line and are not deferred while it lasts
  resume          admit again

The change is shown, then confirmed on the terminal, unless --yes. Without a terminal
on stdin and without --yes nothing is changed. The Redis user needs the operator's
rules (docs/operations.md); the workers' own user cannot write the controls.

{EXIT_CODES}"""

CONTROL_COMMANDS = {
    "set-capacity": "override the capacity of a ledger, on every worker",
    "reset-capacity": "drop the override: the declared capacity is in force again",
    "pause": "admit nothing new on a ledger (running jobs finish, waiting messages wait)",
    "resume": "admit again on a paused ledger",
}


def control_line(view: LedgerView) -> str:
    """One ledger's controls and use, for the control commands."""
    paused = "  PAUSED" if view.paused else ""
    return (
        f"{clean(view.short)}: capacity {capacity_text(view)}, in use {view.in_use}, "
        f"waiting {view.waiting}{paused}"
    )


def control_command(args: argparse.Namespace, client: RedisClient, parser: argparse.ArgumentParser) -> int:
    inspector = Inspector(client, key_prefix=args.prefix)
    controls = inspector.controls
    if (args.ledger is None) == (args.key is None):
        parser.error("give the LEDGER (as status prints it) or --key TEXT")
    if args.key is not None:
        ledger = inspector.key_ledger(args.key)
    else:
        try:
            ledger = inspector.resolve(args.ledger)
        except ValueError as e:
            raise Failure(str(e)) from e
    view: LedgerView = talking_to(client, lambda: inspector.ledgers([ledger])[0])
    name = clean(view.short)
    command = args.command
    if command == "set-capacity":
        wanted = f"capacity {args.capacity} (override)"
        done = view.override == args.capacity
        if args.capacity < view.in_use:
            wanted += (
                f"; {view.in_use} run now: none is stopped, new admissions wait until fewer than "
                f"{args.capacity} run"
            )
    elif command == "reset-capacity":
        declared = "-" if view.declared is None else str(view.declared)
        wanted, done = f"the declared capacity ({declared}) in force", view.override is None
    elif command == "pause":
        wanted, done = "paused: nothing new is admitted", view.paused
    else:
        wanted, done = "admitting again", not view.paused
    print(control_line(view))
    if done:
        print(f"nothing to change: {name} is already so")
        return EXIT_NOTHING_DONE
    print(f"after: {wanted}")
    sys.stdout.flush()
    if not args.yes:
        if not sys.stdin.isatty():
            err(
                "nothing changed: stdin is not a terminal to confirm on; pass --yes to change it "
                "without asking"
            )
            return EXIT_NOTHING_DONE
        if not confirm(f"{command} {name}?"):
            err("nothing changed")
            return EXIT_NOTHING_DONE

    def apply() -> Change:
        if command == "set-capacity":
            return controls.set_capacity(ledger, args.capacity)
        if command == "reset-capacity":
            return controls.reset_capacity(ledger)
        if command == "pause":
            return controls.pause(ledger)
        return controls.resume(ledger)

    change: Change = talking_to(client, apply)
    after: LedgerView = talking_to(client, lambda: inspector.ledgers([ledger])[0])
    print(control_line(after))
    if not change.changed:
        err(f"{name} was already so (changed meanwhile by someone else)")
        return EXIT_NOTHING_DONE
    return EXIT_OK


def err(message: str) -> None:
    print(message, file=sys.stderr)


# -- arguments ----------------------------------------------------------------------------------


def positive_seconds(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number of seconds: {text!r}") from None
    if not value > 0 or value == float("inf"):
        raise argparse.ArgumentTypeError(f"must be a positive number of seconds, got {text!r}")
    return value


def capacity_argument(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a whole number: {text!r}") from None
    if not 1 <= value <= MAX_CAPACITY:
        raise argparse.ArgumentTypeError(
            f"a capacity is from 1 to {MAX_CAPACITY}, got {text!r} (pause admits nothing new)"
        )
    return value


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


def add_subcommand(commands: Any, name: str, **kwargs: Any) -> argparse.ArgumentParser:
    """One subcommand: its own ``--url``/``--prefix``/``--cluster``, raw help text, no abbreviations."""
    parser: argparse.ArgumentParser = commands.add_parser(
        name, formatter_class=argparse.RawDescriptionHelpFormatter, allow_abbrev=False, **kwargs
    )
    add_connection_options(parser, top=False)
    parser.set_defaults(command_parser=parser)
    return parser


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog=PROG,
        description=(
            "Show and free the holds of dramatiq-slots ledgers (queue capacities, runtime keys), and "
            "set their operators' controls."
        ),
        epilog=MAIN_EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
        allow_abbrev=False,
    )
    parser.add_argument("--version", action="version", version=f"%(prog)s {__version__}")
    add_connection_options(parser, top=True)
    commands = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)

    status = add_subcommand(
        commands,
        "status",
        help="show every ledger under the prefix and who holds it",
        description=(
            "Show every ledger under the key prefix: its capacity, holds in use, claims waiting in line,\n"
            "and each holder."
        ),
        epilog=STATUS_EPILOG,
    )
    status.add_argument(
        "ledgers", nargs="*", metavar="LEDGER", help="show only these ledgers (queue:<name>, key:<digest>)"
    )
    status.add_argument(
        "--key",
        action="append",
        default=[],
        metavar="TEXT",
        help="show the ledger of this runtime key (what unique_at_runtime_key returns); repeatable",
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

    release = add_subcommand(
        commands,
        "release",
        help="free holds by hand (emergencies)",
        description=(
            "Remove holds from a ledger by hand, for emergencies: a hold of a dead worker is freed now\n"
            "instead of when it expires."
        ),
        usage=(
            "%(prog)s [-h] [--url URL] [--cluster] [--prefix PREFIX] [--yes] [--force]\n"
            "       (LEDGER | --key TEXT) (TOKEN [TOKEN ...] | --all)"
        ),
        epilog=RELEASE_EPILOG,
    )
    release.add_argument(
        "names",
        nargs="*",
        metavar="LEDGER TOKEN",
        help="the ledger as status prints it (queue:<name>, key:<digest>) or a full key, "
        "then the tokens of the holds to remove",
    )
    release.add_argument(
        "--key", metavar="TEXT", help="the ledger of this runtime key (then every word is a TOKEN)"
    )
    release.add_argument("--all", action="store_true", help="remove every hold of the ledger")
    release.add_argument("-y", "--yes", action="store_true", help="do not ask for confirmation")
    release.add_argument(
        "--force", action="store_true", help="remove holds of live worker processes too (see below)"
    )

    for command, summary in CONTROL_COMMANDS.items():
        control = add_subcommand(
            commands,
            command,
            help=summary,
            description=summary[0].upper() + summary[1:] + ".",
            usage="%(prog)s [-h] [--url URL] [--cluster] [--prefix PREFIX] [--yes] (LEDGER | --key TEXT)"
            + (" N" if command == "set-capacity" else ""),
            epilog=CONTROL_EPILOG,
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
        control.add_argument(
            "--key", metavar="TEXT", help="the ledger of this runtime key (instead of LEDGER)"
        )
        control.add_argument("-y", "--yes", action="store_true", help="do not ask for confirmation")
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Run the command; returns its exit code (see ``--help``)."""
    parser = build_parser()
    args = parser.parse_args(argv)
    url, source = pick_url(args.url)
    secrets = url_secrets(url)
    args.secrets = secrets
    try:
        try:
            KeySpace(args.prefix)
        except ValueError as e:
            raise Failure(f"bad --prefix: {e}") from e
        client = connect(url, source, cluster=args.cluster)
        try:
            if args.command == "status":
                return status_command(args, client)
            if args.command in CONTROL_COMMANDS:
                return control_command(args, client, args.command_parser)
            return release_command(args, client, args.command_parser)
        finally:
            client.close()
    except Failure as e:
        sys.stdout.flush()
        err(f"{PROG}: {scrub(str(e), secrets)}")
        return e.code
    except KeyboardInterrupt:
        err("")
        return EXIT_INTERRUPTED
    except BrokenPipeError:
        # `dramatiq-slots status | head`: the reader left; say nothing more.
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        return EXIT_NOTHING_DONE


__all__ = ["build_parser", "main"]
