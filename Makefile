# Fairgate: `make demo` runs the product on the embedded default; `make test` runs the suite.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed-stamp
HOST ?= 127.0.0.1
PORT ?= 8000

.PHONY: demo test test-fast venv migrate lint import-graph bench clean assets surge wheel screenshots

venv: $(STAMP) assets

# The console's browser libraries (Chart.js) from npm, pinned by package-lock.json; served from
# node_modules/ by Django's staticfiles. Its dev dependency, oidc-provider, is the real OpenID
# provider of the sign-in tests. Reinstalled only when the lock file changes.
ASSETS_STAMP := node_modules/.assets-stamp
assets: $(ASSETS_STAMP)

$(ASSETS_STAMP): package.json package-lock.json
	npm ci --no-audit --no-fund --loglevel=error
	touch $(ASSETS_STAMP)

$(STAMP): pyproject.toml
	$(PYTHON) -c 'import sys; assert sys.version_info[:2] == (3, 11), "Fairgate needs Python 3.11"'
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -e '.[dev]'
	touch $(STAMP)

# The installable package (docs/install.md): dist/fairgate-*.whl and its sdist. The wheel's build step
# (setup.py) takes the console's Chart.js from npm by package-lock.json; tests/live/test_wheel_install.py
# installs such a wheel in a fresh virtual environment and serves a chat from it.
wheel: venv
	rm -rf dist
	$(PY) -m build --outdir dist .

migrate: venv
	$(PY) manage.py migrate --noinput

# The simulated GPU backend on :9100 (the example config's `sim-gpu`), a Celery worker and beat on
# the file broker in var/celery (no server to install: alerts, sweeps), and the gateway, in one go;
# Ctrl-C stops them all.
DEMO_CELERY := CELERY_BROKER_URL=filesystem://localhost/
demo: migrate assets
	$(PY) manage.py demo_setup --url http://$(HOST):$(PORT)
	$(PY) manage.py simbackend --port 9100 & SIM_PID=$$!; \
	$(DEMO_CELERY) $(VENV)/bin/celery -A config worker --loglevel WARNING --concurrency 1 & WORKER_PID=$$!; \
	$(DEMO_CELERY) $(VENV)/bin/celery -A config beat --loglevel WARNING --schedule var/celerybeat-schedule & BEAT_PID=$$!; \
	trap 'kill $$SIM_PID $$WORKER_PID $$BEAT_PID 2>/dev/null' EXIT INT TERM; \
	$(DEMO_CELERY) $(PY) manage.py serve --host $(HOST) --port $(PORT)

# House rules kept by tools: lint, format, types (mypy's set), the import contracts (pyproject.toml), and no model change
# without its migration. `make test` (and so CI) runs it first. mypy's Django plugin imports
# config.settings, which refuses to load without a SECRET_KEY once DATABASE_URL/REDIS_URL are set:
# mypy gets a placeholder when none is set (it only reads the settings' types).
lint: venv
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .
	SECRET_KEY=$${SECRET_KEY:-mypy} $(VENV)/bin/mypy
	$(VENV)/bin/lint-imports
	$(PY) manage.py makemigrations --check --dry-run
	$(PY) scripts/import_graph.py --check
	$(PY) -m pytest -q -p no:cacheprovider tests/unit/test_docs_paths.py

# The imports between the top-level packages, their cycles, the product's module circles and its
# modules over 450 lines (`make lint` fails on either of the last two).
import-graph: venv
	$(PY) scripts/import_graph.py

# Where REDIS_URL is set the suite runs with the shared scheduler (the default there); the
# scheduling live tests (the queue, the API, the upstream limits and circuits) then run once more
# with the embedded one, so both modes are tested. Without REDIS_URL the suite is embedded.
EMBEDDED_TESTS := tests/live/gateway/test_live_queue.py tests/live/gateway/test_live_api.py tests/live/gateway/test_live_upstream.py

test: venv assets lint
	$(PY) -m pytest $(PYTEST_ARGS)
	@if [ -n "$$REDIS_URL" ]; then \
	  echo "--- the scheduling live tests with FAIRGATE_SCHEDULER=embedded"; \
	  FAIRGATE_SCHEDULER=embedded $(PY) -m pytest $(EMBEDDED_TESTS) $(PYTEST_ARGS); \
	else echo "(REDIS_URL unset: the suite ran with the embedded scheduler only)"; fi

# The console's screenshots committed at docs/screenshots/ (the member's queue under live traffic on a
# desktop and a phone, finance, policy), taken by the browser tests of issue 49 against a real stack
# (tests/live/console/test_live_trust.py; the services' env as for `make test`). Tests run without
# FAIRGATE_SCREENSHOTS write theirs to artifacts/ (ignored), never into the tree.
screenshots: venv assets
	FAIRGATE_SCREENSHOTS=$(CURDIR)/docs/screenshots $(PY) -m pytest -q -p no:cacheprovider tests/live/console/test_live_trust.py

# The unit level only (no database, no servers): about half a minute.
test-fast: venv
	$(PY) -m pytest tests/unit $(PYTEST_ARGS)

# The field report's surge replayed live against a `fifo` gateway, a Fairgate one, and Fairgate with
# the batch uploaded through the Batch API (a Celery worker on kombu's file broker), side by side,
# after a Fairgate one with the same chat traffic and no batch (the baseline of each window's p95)
# (the field event: 12,400 batch requests on 48 slots, 20x time compression; about 45 minutes). Writes bench/REPORT-gateway.md.
SURGE_BATCH_COUNT ?= 12400
SURGE_TIME_SCALE ?= 20
surge: venv
	$(PY) -m bench.surge_compare --batch-count $(SURGE_BATCH_COUNT) --time-scale $(SURGE_TIME_SCALE) --write-report

clean:
	rm -rf $(VENV) var/*.sqlite3* .pytest_cache
