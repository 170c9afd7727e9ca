# Ladder: the single entry point. `make up` runs it, `make test` tests it.
SHELL := /bin/bash
.DEFAULT_GOAL := help

ROOT := $(abspath .)
VENV ?= $(ROOT)/.venv
PY := $(VENV)/bin/python
LADDER_RUN_DIR ?= $(ROOT)/.run
SUPERVISORD := $(VENV)/bin/supervisord -c $(ROOT)/deploy/supervisord.conf
SUPERVISORCTL := $(VENV)/bin/supervisorctl -c $(ROOT)/deploy/supervisord.conf
SERVICES := api aggregator history notifier
LINES ?= 200

export LADDER_PYTHON := $(PY)
export LADDER_ROOT := $(ROOT)
export LADDER_RUN_DIR

.PHONY: help up down ps stop start restart logs test test-faults lint infra migrate venv rebuild

help: ## list the targets
	@grep -E '^[a-z-]+:.*## ' $(MAKEFILE_LIST) | awk -F':.*## ' '{printf "  make %-10s %s\n", $$1, $$2}'

$(VENV)/.installed: pyproject.toml
	@test -x $(PY) || python3 -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -e '.[dev]'
	@touch $@

venv: $(VENV)/.installed ## the virtual environment, with pinned dependencies

infra: ## make sure Redis, RabbitMQ and MariaDB answer on loopback (installs them if need be)
	@bash scripts/infra.sh ensure

migrate: venv ## create the history database and run its migrations
	$(PY) -m services.history.migrate

up: venv infra migrate ## run Ladder: the four services under supervisord; returns once all are ready
	@mkdir -p $(LADDER_RUN_DIR)/logs
	@if $(SUPERVISORCTL) pid >/dev/null 2>&1; then \
		$(SUPERVISORCTL) start all >/dev/null; \
	else \
		$(SUPERVISORD); \
	fi
	@$(PY) scripts/wait_ready.py
	@echo "Ladder is up: http://$${LADDER_API_HOST:-127.0.0.1}:$${LADDER_API_PORT:-8000}/docs"

down: ## stop what `make up` started
	@if $(SUPERVISORCTL) pid >/dev/null 2>&1; then \
		$(SUPERVISORCTL) shutdown >/dev/null; \
		for _ in $$(seq 1 300); do test -e $(LADDER_RUN_DIR)/supervisord.pid || break; sleep 0.1; done; \
		echo "Ladder stopped"; \
	else \
		echo "Ladder is not running"; \
	fi
	@bash scripts/infra.sh stop-started

rebuild: venv ## recreate every board in Redis exactly from MySQL (safe while writes go on)
	$(PY) -m services.history.rebuild $(if $(BOARD),--board $(BOARD))

ps: ## each service and whether it runs
	@if $(SUPERVISORCTL) pid >/dev/null 2>&1; then \
		$(SUPERVISORCTL) status || true; \
	else \
		echo "Ladder is not running (make up starts it)"; \
	fi

stop: ## stop one service: make stop SERVICE=notifier
	@test -n "$(SERVICE)" || { echo "usage: make stop SERVICE=<$(SERVICES)>"; exit 2; }
	$(SUPERVISORCTL) stop $(SERVICE)

start: ## start one service: make start SERVICE=notifier
	@test -n "$(SERVICE)" || { echo "usage: make start SERVICE=<$(SERVICES)>"; exit 2; }
	$(SUPERVISORCTL) start $(SERVICE)

restart: ## restart one service: make restart SERVICE=api
	@test -n "$(SERVICE)" || { echo "usage: make restart SERVICE=<$(SERVICES)>"; exit 2; }
	$(SUPERVISORCTL) restart $(SERVICE)

logs: ## a service's log: make logs SERVICE=api [LINES=200] [FOLLOW=1]
	@test -n "$(SERVICE)" || { echo "usage: make logs SERVICE=<$(SERVICES)>"; exit 2; }
	@tail -n $(LINES) $(if $(FOLLOW),-F) $(LADDER_RUN_DIR)/logs/$(SERVICE).log

test: venv infra ## the test suite against real Redis, RabbitMQ and MariaDB (faults: make test-faults)
	$(PY) -m pytest -m "not faults" $(PYTEST_ARGS)

# infra: the fault suite starts private servers of its own, but from the same Debian packages.
test-faults: venv infra ## only the fault suite (servers and services stopped, killed under load)
	$(PY) -m pytest -m faults tests/faults -rP $(PYTEST_ARGS)

lint: venv ## ruff and mypy
	$(VENV)/bin/ruff check services shared tests scripts
	$(VENV)/bin/ruff format --check services shared tests scripts
	$(VENV)/bin/mypy services shared
