# chatsite — `make run` serves the app locally; `make test` runs the whole suite.
SHELL := /bin/bash
PY ?= python3
VENV := .venv
BIN := $(VENV)/bin
PORT ?= 8000
STAMP := $(VENV)/.installed
APP_STAMP := $(VENV)/.installed-app

.PHONY: run test test-python test-js lint typecheck install migrate vendor-check bench bench-full \
        cluster screenshots test-real-upstream clean superuser

$(BIN)/python:
	$(PY) -m venv $(VENV)

# `make run` installs the app alone (quicker on a fresh machine); the tests' and benchmarks'
# tools (a browser driver, plotting) come with `make test`, `make install` and the rest.
$(APP_STAMP): pyproject.toml | $(BIN)/python
	@echo "Installing chatsite into $(VENV) (the first time takes a minute or two)..."
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet -e .
	touch $(APP_STAMP)

$(STAMP): pyproject.toml | $(BIN)/python
	@echo "Installing chatsite with its test and benchmark tools into $(VENV) (the first time takes a few minutes)..."
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet -e '.[test,bench]'
	touch $(STAMP) $(APP_STAMP)

install: $(STAMP)

migrate: $(APP_STAMP)
	DJANGO_DEBUG=1 $(BIN)/python manage.py migrate --noinput

# One daphne process, SQLite, no Redis, the built-in demo model: nothing else to start.
run: migrate
	@echo "chatsite on http://127.0.0.1:$(PORT)/ (Ctrl-C stops it)"
	DJANGO_DEBUG=1 PORT=$(PORT) $(BIN)/daphne -b 127.0.0.1 -p $(PORT) chatsite.asgi:application

# An admin account in `make run`'s database, with `make run`'s settings (DJANGO_DEBUG=1: no
# DJANGO_SECRET_KEY needed locally); asks for a username, e-mail and password.
superuser: migrate
	DJANGO_DEBUG=1 $(BIN)/python manage.py createsuperuser

lint: $(STAMP)
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/lint-imports

typecheck: $(STAMP)
	DJANGO_DEBUG=1 $(BIN)/mypy chat chatsite

vendor-check: $(STAMP)
	$(BIN)/python scripts/vendor_static.py --check

test-js:
	node --test tests/js/

# One pass in $(JOBS) workers (pytest-xdist), a whole file per worker at a time, the slowest
# files first (tests/conftest.py SLOW_FIRST; xdist's own reordering by test count is off): the
# browser tests run beside the others, each file with its own Chromium and servers.
# JOBS=0 runs everything in this process. docs/decisions/test-parallelism.md.
JOBS ?= 2
test-python: $(STAMP)
	$(BIN)/pytest -m "not real_upstream" -n $(JOBS) --dist loadfile --no-loadscope-reorder \
	  --durations=20 $(PYTEST_ARGS)

# Everything: style, the house's import contracts, types, vendored files, the JS modules and
# the Python suite (incl. browser).
test: lint typecheck vendor-check test-js test-python

test-real-upstream: $(STAMP)
	bash scripts/real_upstream.sh

# Quick: the harness at a small size (its smoke test runs in `make test`); never the peer.
bench: $(STAMP)
	$(BIN)/python -m bench.run --quick

# The published numbers, with the peer (LiteLLM proxy) beside chatsite: installed into
# bench/.peer-venv on first use (minutes), skipped with a one-line message if it cannot be.
bench-full: $(STAMP)
	$(BIN)/python -m bench.run --full

cluster: $(STAMP)
	bash deploy/cluster.sh

screenshots: $(STAMP)
	SCREENSHOTS=1 $(BIN)/pytest tests/browser/test_screenshots.py -q

clean:
	rm -rf $(VENV) bench/.peer-venv staticfiles .pytest_cache .mypy_cache .ruff_cache
