"""What each command does: ``status``, ``why``, ``release``, ``settle``, and the controls
(``set-capacity``, ``reset-capacity``, ``pause``, ``resume``).

``release`` and the controls act on one ledger, shown and confirmed before they act:
:func:`one_ledger` and :func:`confirmed` are their shared steps (and :func:`resolved`, status's too).
"""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Callable
from dataclasses import asdict

from ...ledger.client import RedisClient, redacted_address
from ...ledger.controls import Provenance, default_by, duration_text
from ..inspection import Inspector, WhyUnknown
from .connection import scrub, talking_to
from .exits import EXIT_NOTHING_DONE, EXIT_OK, PROG, Failure, err
from .help import LIVE_REFUSAL
from .render import (
    clean,
    control_text,
    declared_text,
    holder_line,
    json_document,
    local_time,
    render_table,
    settling_line,
    status_ledgers,
    why_lines,
)

# -- the steps the commands share ------------------------------------------------------------


def ledger_of(
    inspector: Inspector, name: str | None, key: str | None = None, queue: str | None = None
) -> str:
    """The ledger key of a name as status prints it (or a full key), or of the runtime key ``key``
    (of the messages of ``queue``); an ArgumentError for any other (or when the server, which records
    where a queue's ledgers live, does not answer: a :class:`Failure`)."""
    if key is not None:
        return talking_to(inspector.client, lambda: inspector.key_ledger(key, queue=queue))
    return talking_to(inspector.client, lambda: inspector.resolve(name or ""))


def one_ledger(
    inspector: Inspector, parser: argparse.ArgumentParser, args: argparse.Namespace, name: str | None
) -> str:
    """The one ledger a command acts on: ``LEDGER``, or the ledger of ``--key TEXT`` (of the
    messages of ``--queue NAME``); a usage error for neither or both."""
    if (name is None) == (args.key is None):
        parser.error("give the LEDGER (as status prints it) or --key TEXT")
    return ledger_of(inspector, name, args.key, args.queue)


def confirmed(yes: bool, question: str, *, nothing: str, act: str) -> bool:
    """Whether to go ahead: ``--yes``, or a yes on the terminal (question on stderr, answer from
    stdin; only y/yes is a yes). Otherwise ``nothing`` is said on stderr (without a terminal: how
    ``--yes`` would ``act`` without asking)."""
    if yes:
        return True
    if not sys.stdin.isatty():
        err(f"{nothing}: stdin is not a terminal to confirm on; pass --yes to {act} without asking")
        return False
    sys.stderr.write(f"{question} [y/N] ")
    sys.stderr.flush()
    answer = sys.stdin.readline()
    if not answer.endswith("\n"):  # end of input: no answer
        sys.stderr.write("\n")
    if answer.strip().lower() in ("y", "yes"):
        return True
    err(nothing)
    return False


# -- status ------------------------------------------------------------------------------------


def status_command(args: argparse.Namespace, client: RedisClient) -> int:
    inspector = Inspector(client, key_prefix=args.prefix)
    address = redacted_address(client)
    keys_by_ledger = {ledger_of(inspector, None, text, args.queue): text for text in args.key}
    names: list[str] | None = None
    if args.ledgers or args.key:
        names = [ledger_of(inspector, name) for name in args.ledgers] + list(keys_by_ledger)

    def render(one_line: bool) -> str:
        views = talking_to(client, lambda: inspector.ledgers(names))
        at = time.time()
        if args.json:
            body = {"ledgers": status_ledgers(views)}
            return json_document(address, args.prefix, at, body, indent=None if one_line else 2) + "\n"
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


# -- why ------------------------------------------------------------------------------------------


def why_command(args: argparse.Namespace, client: RedisClient) -> int:
    inspector = Inspector(client, key_prefix=args.prefix)
    why = talking_to(client, lambda: inspector.why(args.message_id))
    if args.json:
        data = asdict(why)  # ``state`` first
        body = {"state": data.pop("state"), **data}
        sys.stdout.write(json_document(redacted_address(client), args.prefix, time.time(), body) + "\n")
    else:
        sys.stdout.write("\n".join(why_lines(why)) + "\n")
    sys.stdout.flush()
    return EXIT_NOTHING_DONE if isinstance(why, WhyUnknown) else EXIT_OK


# -- release --------------------------------------------------------------------------------------


def release_command(args: argparse.Namespace, client: RedisClient, parser: argparse.ArgumentParser) -> int:
    inspector = Inspector(client, key_prefix=args.prefix)
    words: list[str] = list(args.names)
    # With --key every word is a TOKEN; without it, the first is the LEDGER.
    ledger = one_ledger(inspector, parser, args, words[0] if words and args.key is None else None)
    tokens = words if args.key is not None else words[1:]
    if args.all and tokens:
        parser.error("give TOKENs or --all, not both")
    if not args.all and not tokens:
        parser.error("give the TOKEN(s) of the holds to remove, or --all")

    view = talking_to(client, lambda: inspector.ledgers([ledger])[0])
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
    if not confirmed(args.yes, f"Remove {len(chosen)} hold(s)?", nothing="nothing removed", act="remove"):
        return EXIT_NOTHING_DONE

    released = talking_to(
        client,
        lambda: inspector.release(
            ledger, [h.token for h in chosen], force=args.force, by=args.by, reason=args.reason
        ),
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
    if released.unrecorded is not None:
        raise Failure(f"the removal was not recorded ({released.unrecorded}): the operators' ACL records it")
    return EXIT_OK if removed else EXIT_NOTHING_DONE


# -- settle --------------------------------------------------------------------------------------


def settle_command(args: argparse.Namespace, client: RedisClient) -> int:
    inspector = Inspector(client, key_prefix=args.prefix)
    settling = talking_to(client, inspector.settling)
    if not settling:
        print(f"nothing settles under prefix {clean(args.prefix)}: newcomers are admitted")
        return EXIT_NOTHING_DONE
    for epoch, now in settling.items():
        print(f"{clean(epoch)}: {settling_line(now)}")
    sys.stdout.flush()
    if not confirmed(args.yes, "End it now?", nothing="nothing changed", act="end it"):
        return EXIT_NOTHING_DONE
    ledger = inspector.ledger
    left = talking_to(client, lambda: ledger.settle([ledger.keys.tag_of(epoch) for epoch in settling]))
    print(f"settled: newcomers are admitted ({left / 1000:.1f} s of settling were left)")
    return EXIT_OK


# -- controls ------------------------------------------------------------------------------------


def control_command(args: argparse.Namespace, client: RedisClient, parser: argparse.ArgumentParser) -> int:
    inspector = Inspector(client, key_prefix=args.prefix)
    ledger = one_ledger(inspector, parser, args, args.ledger)
    by: str = args.by if args.by is not None else default_by()
    reason: str | None = args.reason
    for_ms: int | None = getattr(args, "for_ms", None)
    view = talking_to(client, lambda: inspector.ledgers([ledger])[0])
    name = clean(view.short)
    command = args.command
    if command == "set-capacity":
        wanted = f"capacity {args.capacity} (override)"
        done = view.override == args.capacity and unchanged(view.override_provenance, by, reason, for_ms)
        if args.capacity < view.in_use:
            wanted += (
                f"; {view.in_use} run now: none is stopped, new admissions wait until fewer than "
                f"{args.capacity} run"
            )
    elif command == "reset-capacity":
        wanted, done = f"{declared_text(view)} in force", view.override is None
    elif command == "pause":
        wanted = "paused: nothing new is admitted"
        done = view.paused and unchanged(view.pause_provenance, by, reason, for_ms)
    else:
        wanted, done = "admitting again", not view.paused
    print(control_text(view))
    if done:
        print(f"nothing to change: {name} is already so")
        return EXIT_NOTHING_DONE
    lasting = f" for {duration_text(for_ms / 1000)}" if for_ms is not None else ""
    print(f"after: {wanted}; {setting_text(by, reason, lasting)}")
    sys.stdout.flush()
    question = f"{command} {name}{lasting} as {clean(by)}?"
    if not confirmed(args.yes, question, nothing="nothing changed", act="change it"):
        return EXIT_NOTHING_DONE

    capacity: int = getattr(args, "capacity", 0)
    change = talking_to(
        client,
        lambda: inspector.control(command, ledger, capacity=capacity, by=by, reason=reason, for_ms=for_ms),
    )
    after = talking_to(client, lambda: inspector.ledgers([ledger])[0])
    print(control_text(after))
    if command == "reset-capacity" and change.changed:
        print(f"in force now: {declared_text(after)}")
    if not change.changed:
        err(f"{name} was already so (changed meanwhile by someone else)")
        return EXIT_NOTHING_DONE
    return EXIT_OK


def unchanged(provenance: Provenance | None, by: str, reason: str | None, for_ms: int | None) -> bool:
    """Whether setting a control again as ``by`` would change nothing: same ``by`` and ``reason``,
    and no expiry before or now."""
    return (
        provenance is not None
        and for_ms is None
        and provenance.until is None
        and (provenance.by, provenance.reason) == (by, reason)
    )


def setting_text(by: str, reason: str | None, lasting: str) -> str:
    """``by alice@h for 1h, then it ends by itself (reason: db migration)``: what the change records."""
    text = f"by {clean(by)}"
    if lasting:
        text += f"{lasting}, then it ends by itself"
    if reason is not None:
        text += f" (reason: {clean(reason)})"
    return text
