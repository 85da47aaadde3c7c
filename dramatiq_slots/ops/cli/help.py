"""The command's help texts: what ``--help`` says after each command's options."""

from __future__ import annotations

from ...ledger.client import URL_ENV
from .connection import DEFAULT_SENTINEL_PORT, DEFAULT_URL
from .exits import EXIT_ERROR, EXIT_INTERRUPTED, EXIT_NOTHING_DONE, EXIT_OK

EXIT_CODES = f"""\
exit codes:
  {EXIT_OK}    done (status printed, holds removed, the message found; --watch or web ended
       by Ctrl-C)
  {EXIT_NOTHING_DONE}    nothing done: no such hold, holds of live processes refused, the removal
       not confirmed; why: the message is not known
  {EXIT_ERROR}    usage error, bad ledger name, prefix or URL; Redis unreachable or refusing
       (wrong password, ACL); web: the port cannot be listened on
  {EXIT_INTERRUPTED}  interrupted (Ctrl-C) outside --watch
"""

MAIN_EPILOG = f"""\
The ledger's Redis: --url, else the first line of --url-file, else the environment
variable {URL_ENV}, else REDIS_URL, else {DEFAULT_URL}. Give the
Redis and the key_prefix the workers use. A password in --url is seen by every local
user in the process list (a warning says so): use the environment or --url-file. URLs:
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
admitted and MESSAGE (actor(message id)), as its worker process reports them (within
0.5 s of the admission; - without a report: a dead worker's); LEFT, seconds until the
hold expires unless its heartbeat refreshes it; ALIVE, whether its process reports (a
live worker: a worker writes its report at boot, every beat and soon after a change, and
it expires 2.5 beat intervals later, so a killed worker shows "no" within about two
beats; a stopped one removes it); TOKEN, what release takes.
Capacity is the one in force: an operator's override (shown as "N (override; declared
M)", see set-capacity), else the one live workers declare (- when none does): a queue's
from any live worker that caps it, a runtime key's from the reported holds and waiting
messages of that key (each one's tier; "(tiers 1, 3)" when they differ).
"waiting N in line" counts the claims in the ledger's line, of which the live workers
report the parked ones (in the worker's memory, no thread held; the others are of workers
not reporting any more); "held back" ones wait in a worker's memory in no line (beyond
what a worker lines up). Below the holders, the waiting messages the workers report (10
of them): in line order where they are among the first 10 claims in line (PLACE), then
the others, the longest wait first.
"queue NAME" gives a capped queue's depth in the broker as a worker last read it (a
RedisBroker's): ready, not taken by any worker yet; taken by workers and not acked yet
(running, waiting for a slot, prefetched); delayed.
A runtime key shows its label beside its digest ("key:<digest> "LABEL"") where its
workers report one (Slots(key_labels=...), off by default).
PAUSED: an operator paused the ledger (see pause); a paused or overridden ledger is
listed even when it holds nothing. Under it, a line per control says who set it, how
long ago, why, and when it ends by itself (set with --for) or that it lasts until
changed. SETTLING: the ledger's Redis lost its data (or this is a first start), and
no newcomer is admitted until the running jobs have re-asserted their holds; a line
says why and for how long.

--json prints one document: {{"server", "prefix", "at", "ledgers": [{{"ledger", "kind",
"name", "short", "key_label", "capacity", "in_use", "waiting", "declared", "override",
"paused", "paused_at", "override_provenance", "pause_provenance", "settling":
{{"seconds_left", "lost", "text"}}, "read_at", "parked", "held_back",
"oldest_wait", "capacities", "home", "queue_depth": {{"ready", "taken", "delayed",
"unacked", "at_ms"}}, "waits": [{{"message_id", "actor", "queue", "how", "host", "pid",
"waited", "token", "capacity"}}], "line": [{{"token", "place", "wait"}}], "holders":
[{{"token", "host", "pid", "thread", "seconds_left", "age", "actor", "label",
"process_alive", "message_id", "queue", "capacity", "units", "group", "lingering"}}]}}]}};
"settling" is null unless the ledger settles ("lost": true after a data loss, false on a
first start, null when its epoch does not say); a
provenance is null or {{"by", "at", "reason", "until", "age", "seconds_left"}} (times by
the Redis clock, s; until and seconds_left null for a control without an expiry); with
--watch, one such document per line and refresh. Unknown values are null.

Put ledger names before --watch (--watch takes an optional number).

{EXIT_CODES}"""

WHY_EPILOG = f"""\
Where the answer comes from: the live workers' reports (each says what its process
holds and keeps waiting, and its newest deferrals and drops: the last 100 and 20) and
the ledgers (the place in line, the holders). A message just admitted or parked shows
within 0.5 s; one still in its queue in the broker, not taken by any worker, is not
known (the queue depths the workers read are shown then).

  running    on which host, pid and thread, for how long, and each ledger it holds
  in line    its claim in the ledger's line, its worker thread waiting (at place n of m,
             behind the claims ahead, the ledger's holders; why nothing is admitted
             while the ledger settles)
  parked     its claim in the line, the message in its worker's memory (no thread held)
  held back  in its worker's memory, in no line: its process has as many claims on the
             ledger as threads
  deferred   re-enqueued with a delay: when, by which ledger, and when it is due again
  dropped    dropped by its on_busy policy (acked, never run)

--json prints one document: {{"server", "prefix", "at", "state", "message_id", ...}},
the fields of the state (docs/operations.md lists them). Unknown values are null.

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


CONTROL_EPILOG = f"""\
{LEDGER_NAMES}
A control is kept in the ledger's Redis and wins over the capacity the code declares,
on every worker, for the next admission, release and beat of each (workers listening
for changes beat at once, so room a raise or a resume makes goes to the first messages
in line at once); it stays until it is changed again, through worker restarts and
deploys, or, with --for, until it expires: then it ends by itself on every worker (by
the Redis clock, within a beat; messages in line get the room it leaves). Each records
--by (default <OS user>@<hostname>), when, and --reason; status shows them. Workers log
one INFO line for each change and each expiry.

  set-capacity    admit at most N at once, across every worker; below the holds in use,
                  no running job is stopped: new admissions wait until fewer than N run
  reset-capacity  drop the override: the declared capacity is in force again
  pause           admit nothing new; running jobs finish, waiting messages keep their
                  places in line and are not deferred while it lasts
  resume          admit again

--for takes whole days, hours, minutes and seconds: 90s, 15m, 1h, 2h30m, 1d. Setting a
control again replaces its --for, --by and --reason (a paused ledger stays paused since
its first pause).

The change is shown, then confirmed on the terminal, unless --yes. Without a terminal
on stdin and without --yes nothing is changed. The Redis user needs the operator's
rules (docs/operations.md); the workers' own user cannot write the controls.

{EXIT_CODES}"""

SETTLE_EPILOG = f"""\
After the ledger's Redis lost its data (restarted without persistence, failed over
to a replica without it, emptied), the first worker that finds it out keeps every
newcomer out for restart_settle (2.5 beat intervals, 25 s by default) while the jobs
that still run re-assert the holds the server forgot; status says how long is left.
End it sooner once every worker has (each re-asserts within a second of the server
answering again, and logs each hold it put back), or when you know no job ran. Ended
too soon, a worker that re-asserts later puts its ledger over its capacity until the
jobs drain. A brand-new deployment needs none of this: it admits at once.

What is settling is shown, then ending it is confirmed on the terminal, unless --yes.

{EXIT_CODES}"""

CONTROL_COMMANDS = {
    "set-capacity": "override the capacity of a ledger, on every worker",
    "reset-capacity": "drop the override: the declared capacity is in force again",
    "pause": "admit nothing new on a ledger (running jobs finish, waiting messages wait)",
    "resume": "admit again on a paused ledger",
}


WEB_EPILOG = f"""\
The page shows every ledger under the prefix (paged, searched by queue name or digest,
or by a runtime key's label): its capacities (declared, override, in force), pause,
settling, holds in use, holders, line and a chart of them since the page opened; a view
per ledger; the live worker processes; and where a message waits. It redraws every 2 s
without reloading. It is served at http://BIND:PORT/slots/ (PORT 0: any free port,
printed at start).

Reading is open to whoever reaches BIND:PORT (127.0.0.1 by default: this host only; bound
to a loopback address, the page answers only requests for a loopback name). The page never
shows a password or a message's arguments, nor a runtime key's text unless its workers
report a label for it (Slots(key_labels=...), off by default).

--controls --user NAME lets the page act: set-capacity, reset-capacity, pause, resume,
and release a dead worker's hold (never a live one's). At start the command prints a
sign-in URL with a token made for this run: open it once in your browser, which then acts
as NAME; without it nothing can be changed. Every change is a POST with a CSRF token. The
Redis user needs the operator's rules (docs/operations.md), as for the control commands.
To serve the page inside your own application, behind its users, mount SlotsWeb
(docs/operations.md, "The web page").

{EXIT_CODES}"""


#: Per command, in the order ``--help`` lists them: its summary (in that list), and the description
#: and epilog of its own ``--help``.
COMMANDS = {
    "status": (
        "show every ledger under the prefix and who holds it",
        "Show every ledger under the key prefix: its capacity, holds in use, claims waiting in line,\n"
        "and each holder.",
        STATUS_EPILOG,
    ),
    "why": (
        "say where one message is: running, waiting (where, behind whom), deferred",
        "Say where one message is, from what the ledgers and the live workers' reports hold:\n"
        "running with its holds; waiting for a ledger (in line, parked or held back, on which host,\n"
        "at which place, behind whom); deferred until when; dropped; or not known.",
        WHY_EPILOG,
    ),
    "release": (
        "free holds by hand (emergencies)",
        "Remove holds from a ledger by hand, for emergencies: a hold of a dead worker is freed now\n"
        "instead of when it expires.",
        RELEASE_EPILOG,
    ),
    "settle": (
        "end the settling that follows a loss of the ledger's data",
        "End now the settling of the ledgers that follows a loss of their Redis's data.",
        SETTLE_EPILOG,
    ),
    **{
        name: (summary, summary[0].upper() + summary[1:] + ".", CONTROL_EPILOG)
        for name, summary in CONTROL_COMMANDS.items()
    },
    "web": (
        "serve the operators' web page (read-only unless --controls)",
        "Serve the operators' web page: every ledger, its holders and line, the worker processes,\n"
        "refreshed live; with --controls, the controls too.",
        WEB_EPILOG,
    ),
}

LIVE_REFUSAL = (
    "a running job re-asserts a lost hold, so its process's next heartbeat would put it back: "
    "stop that worker or let its job end; --force removes it anyway, and its heartbeat will "
    "re-assert it at its next beat unless the job has ended"
)
