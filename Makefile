# dramatiq-slots developer tasks. Tool settings live in pyproject.toml.
#
#   make test    lint + format check + mypy (package, tests, bench, example) + the whole pytest suite (the default)
#   make lint    ruff check and ruff format --check
#   make quick   pytest without the slow multi-process suites
#   make test-oldest-dramatiq  the quick suite (the contract tests of dramatiq_slots/borrowed.py
#                among them) on the oldest dramatiq pyproject.toml allows (own venv: .venv-oldest)
#   make demo    the example project on real worker groups, one SIGKILLed mid-run (own venv: .venv-demo)
#   make clean   remove the venvs, caches and build artifacts
#   make bench   the side-by-side benchmark, then how fast hosts follow a control (bench/controls.py)
#                and what reading many ledgers and prompt reports cost (bench/inspection.py)
#                (BENCH_ARGS=--quick for a smoke run; not part of test; BENCH_ARGS='--only W8' for
#                the 10,000-runtime-key load and leak check alone, without the other two)
#   make bench-cluster  the ledger on a 1- and a 3-primary Redis Cluster, with and without
#                placement="queue": capped jobs/s, each primary's CPU per job (about 2 minutes)
#   make bench-scale  grow one dimension at a time (processes per host, live runtime keys, waiting
#                messages) on real worker groups: commands, Redis CPU, admission latency and worker
#                memory per job, with verdicts, redrawing docs/scale.svg (bench/scale.py; about 4
#                minutes; SCALE_ARGS=--quick for a smoke run that draws nothing; not part of test)
#   make screenshots  the browser tests (headless Chromium), writing the web page's screenshots
#                into docs/images/ (commit them; docs/operations.md shows them)
#   make reliability  run the chaos suite and regenerate docs/reliability.md from its verdicts
#   make costs   rewrite docs/design.md's "What each operation costs" from Redis's own counts
#                (tests/test_costs_doc.py; make test fails while the table is not what the scripts do)
#   make soak    faults at random on real worker groups, judged from the whole history (not part of
#                test): SOAK_SECONDS (default 1200), SOAK_SEED (default: a random one, printed),
#                SOAK_REPORT=1 writes docs/soak.json and docs/reliability.md's soak section
#
# The venv (.venv: the package with its dev extra, i.e. the test extra plus ruff, mypy and
# pre-commit) is built with the python3 on PATH (3.10+), and rebuilt
# only when pyproject.toml changes (the stamp file inside it is older).

PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed-from-pyproject
CHECK_PYTHON = @$(PYTHON) -c 'import sys; sys.exit(0 if sys.version_info >= (3, 10) else "dramatiq-slots needs Python >= 3.10; $(PYTHON) is " + sys.version.split()[0])'

.DEFAULT_GOAL := test
.PHONY: test lint typecheck pytest quick venv clean demo bench bench-scale bench-cluster reliability costs soak test-oldest-dramatiq screenshots

$(STAMP): pyproject.toml
	$(CHECK_PYTHON)
	rm -rf $(VENV)
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -e '.[dev]'
	touch $(STAMP)

venv: $(STAMP)

lint: $(STAMP)
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .

typecheck: $(STAMP)
	$(BIN)/mypy

pytest: $(STAMP)
	$(BIN)/python -m pytest

test: lint typecheck pytest

quick: $(STAMP)
	$(BIN)/python -m pytest -m "not slow"

clean:
	rm -rf $(VENV) $(DEMO_VENV) $(OLDEST_VENV) .pytest_cache .mypy_cache .ruff_cache .hypothesis build dist *.egg-info
	find . -path ./.git -prune -o -name __pycache__ -type d -prune -exec rm -rf {} +

# The demo has a venv of its own (.venv-demo: the package with the example's extras, no test
# tools), rebuilt only when pyproject.toml changes, like .venv above.
DEMO_VENV ?= .venv-demo
DEMO_STAMP := $(DEMO_VENV)/.installed-from-pyproject

$(DEMO_STAMP): pyproject.toml
	$(CHECK_PYTHON)
	rm -rf $(DEMO_VENV)
	$(PYTHON) -m venv $(DEMO_VENV)
	$(DEMO_VENV)/bin/python -m pip install -e '.[example]'
	touch $(DEMO_STAMP)

# The oldest dramatiq pyproject.toml allows (the X of its "dramatiq>=X"), in a venv of its own
# (.venv-oldest: the package with its test extra, dramatiq pinned at X), rebuilt only when
# pyproject.toml changes, like .venv above; .venv gets the newest dramatiq. CI runs both.
OLDEST_VENV ?= .venv-oldest
OLDEST_STAMP := $(OLDEST_VENV)/.installed-from-pyproject
OLDEST_DRAMATIQ := $(shell sed -n 's/^ *"dramatiq>=\([0-9.]*\)",$$/\1/p' pyproject.toml)

$(OLDEST_STAMP): pyproject.toml
	$(CHECK_PYTHON)
	@test -n "$(OLDEST_DRAMATIQ)" || { echo 'no "dramatiq>=X" in pyproject.toml dependencies' >&2; exit 1; }
	rm -rf $(OLDEST_VENV)
	$(PYTHON) -m venv $(OLDEST_VENV)
	$(OLDEST_VENV)/bin/python -m pip install -e '.[test]' 'dramatiq[rabbitmq,watch]==$(OLDEST_DRAMATIQ)'
	touch $(OLDEST_STAMP)

test-oldest-dramatiq: $(OLDEST_STAMP)
	@$(OLDEST_VENV)/bin/python -c 'import dramatiq; print("dramatiq", dramatiq.__version__, "(the oldest pyproject.toml allows: $(OLDEST_DRAMATIQ))")'
	$(OLDEST_VENV)/bin/python -m pytest -m "not slow"

# REDIS_URL unset: a private server on a free port, stopped afterwards; set: that server (the
# demo's own keys only, deleted afterwards).
demo: $(DEMO_STAMP)
	$(DEMO_VENV)/bin/python -m example_project.demo

# bench/inspection.py's smoke run (a variable: a comma inside $(if ...) would end its argument).
INSPECTION_QUICK := --ledgers 100,1000 --repeat 5
bench: $(STAMP)
	$(BIN)/python bench/run.py $(BENCH_ARGS)
ifeq ($(findstring --only,$(BENCH_ARGS)),)
	$(BIN)/python bench/controls.py $(if $(findstring --quick,$(BENCH_ARGS)),--cycles 2)
	$(BIN)/python bench/inspection.py $(if $(findstring --quick,$(BENCH_ARGS)),$(INSPECTION_QUICK))
	$(BIN)/python -m bench.path_cost $(if $(findstring --quick,$(BENCH_ARGS)),--messages 500 --repeats 1)
	$(BIN)/python -m bench.path_cost --threads 8 $(if $(findstring --quick,$(BENCH_ARGS)),--messages 500 --repeats 1)
endif

bench-scale: $(STAMP)
	$(BIN)/python bench/scale.py $(SCALE_ARGS)

bench-cluster: $(STAMP)
	$(BIN)/python bench/cluster_placement.py $(CLUSTER_ARGS)

costs: $(STAMP)
	DRAMATIQ_SLOTS_WRITE_COSTS=1 $(BIN)/python -m pytest -q tests/test_costs_doc.py

reliability: $(STAMP)
	rm -f .chaos-results.jsonl
	SLOTS_CHAOS_RESULTS=$(CURDIR)/.chaos-results.jsonl $(BIN)/python -m pytest -m chaos -q
	$(BIN)/python -m tests.support.chaos_report .chaos-results.jsonl docs/reliability.md
	rm -f .chaos-results.jsonl

# The browser tests alone, their screenshots written to docs/images/ (they need Debian's chromium and
# chromium-driver; without them they skip, and nothing is written).
screenshots: $(STAMP)
	mkdir -p docs/images
	SLOTS_SCREENSHOTS=$(CURDIR)/docs/images $(BIN)/python -m pytest -m browser -q tests/test_web_browser.py

SOAK_SECONDS ?= 1200
soak: $(STAMP)
	$(BIN)/python -m soak.run --seconds $(SOAK_SECONDS) $(if $(SOAK_SEED),--seed $(SOAK_SEED)) \
		$(if $(SOAK_REPORT),--report docs/reliability.md)
