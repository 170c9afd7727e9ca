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
# One service of supervisord's programs, named by SERVICE= (the four, and the simulation), or a
# usage line and status 2.
CHECK_SERVICE = case "$(strip $(SERVICE))" in $(subst $(eval) ,|,$(SERVICES) sim)) ;; *) \
	echo "usage: make $@ SERVICE=<$(SERVICES) sim>$(if $(SERVICE), ($(SERVICE) is none of them))"; \
	exit 2;; esac
LINES ?= 200
# Each service starts with the caller's LADDER_* settings of the make up, start or restart that
# started it, recorded in $(LADDER_RUN_DIR)/env/<service>.json (scripts/service_env.py).
SERVICE_ENV := $(PY) $(ROOT)/scripts/service_env.py

export LADDER_PYTHON := $(PY)
export LADDER_ROOT := $(ROOT)
export LADDER_RUN_DIR

.PHONY: help up down ps stop start restart logs test test-fuzz test-stack test-faults test-cluster lint bench infra migrate venv rebuild
.PHONY: containers containers-down test-containers
.PHONY: cluster-up cluster-down cluster-ps cluster-kill cluster-start test-rehearsal

help: ## list the targets
	@grep -E '^[a-z-]+:.*## ' $(MAKEFILE_LIST) | awk -F':.*## ' '{printf "  make %-15s %s\n", $$1, $$2}'

$(VENV)/.installed: pyproject.toml
	@test -x $(VENV)/bin/pip || bash scripts/venv.sh $(VENV)
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
	@# Running already: a service whose recorded settings differ from the caller's is restarted
	@# with the caller's; one that does not run is started with them.
	@if $(SUPERVISORCTL) pid >/dev/null 2>&1; then \
		changed=$$($(SERVICE_ENV) write --changed $(SERVICES)) || exit 1; \
		running=" $$($(SUPERVISORCTL) status $(SERVICES) 2>/dev/null | awk '$$2 == "RUNNING" || $$2 == "STARTING" {print $$1}' | xargs) "; \
		restart=$$(for s in $$changed; do case "$$running" in *" $$s "*) echo $$s;; esac; done | xargs); \
		if [ -n "$$restart" ]; then \
			echo "settings differ from those they started with: restarting $$restart"; \
			$(SUPERVISORCTL) restart $$restart >/dev/null; \
		fi; \
		$(SUPERVISORCTL) start $(SERVICES) >/dev/null; \
	else \
		$(SERVICE_ENV) write $(SERVICES) && $(SUPERVISORD); \
	fi
	@$(PY) scripts/wait_ready.py
	@# What answered must be these services: a port held by another process (a cluster-up's API,
	@# one left by a killed supervisord) answers while ours fails to bind.
	@for _ in $$(seq 1 40); do \
		$(SUPERVISORCTL) status $(SERVICES) | grep -qE 'STARTING|BACKOFF' || break; sleep 0.25; \
	done; \
	if ! $(SUPERVISORCTL) status $(SERVICES) >/dev/null; then \
		$(SUPERVISORCTL) status $(SERVICES); \
		echo "not every service of make up runs: see make logs SERVICE=<name> (a port taken?)" >&2; \
		exit 1; \
	fi
	@echo "Ladder is up: $$($(PY) scripts/wait_ready.py --api-url)/docs"

down: ## stop what `make up` started
	@if $(SUPERVISORCTL) pid >/dev/null 2>&1; then \
		$(SUPERVISORCTL) shutdown >/dev/null; \
		for _ in $$(seq 1 300); do test -e $(LADDER_RUN_DIR)/supervisord.pid || break; sleep 0.1; done; \
		echo "Ladder stopped"; \
	else \
		echo "Ladder is not running"; \
	fi
	@rm -rf $(LADDER_RUN_DIR)/env
	@bash scripts/infra.sh stop-started

rebuild: venv ## recreate every board in Redis exactly from MySQL (safe while writes go on)
	$(PY) -m services.rebuild $(if $(BOARD),--board $(BOARD)) $(if $(RESTORED),--restored)

ps: ## each service and whether it runs
	@if $(SUPERVISORCTL) pid >/dev/null 2>&1; then \
		$(SUPERVISORCTL) status || true; \
	else \
		echo "Ladder is not running (make up starts it)"; \
	fi

stop: ## stop one service: make stop SERVICE=notifier
	@$(CHECK_SERVICE)
	$(SUPERVISORCTL) stop $(SERVICE)

# start_with_env: start each of $(1) that does not run, with the caller's settings recorded for it
# first; one that runs keeps the settings it started with (make restart changes them).
define start_with_env
for s in $(1); do \
	if $(SUPERVISORCTL) status $$s 2>/dev/null | awk '$$2 == "RUNNING" {up = 1} END {exit !up}'; then \
		echo "$$s runs already, with the settings it started with (make restart SERVICE=$$s gives it the caller's)"; \
	else \
		$(SERVICE_ENV) write $$s && $(SUPERVISORCTL) start $$s || exit 1; \
	fi; \
done
endef

start: ## start one service: make start SERVICE=notifier (with the caller's LADDER_* settings)
	@$(CHECK_SERVICE)
	@$(call start_with_env,$(SERVICE))

restart: ## restart one service: make restart SERVICE=api (with the caller's LADDER_* settings)
	@$(CHECK_SERVICE)
	@$(SUPERVISORCTL) pid >/dev/null 2>&1 || { echo "Ladder is not running (make up starts it)"; exit 1; }
	@$(SERVICE_ENV) write $(SERVICE)
	$(SUPERVISORCTL) restart $(SERVICE)

logs: ## a service's log: make logs SERVICE=api [LINES=200] [FOLLOW=1]
	@$(CHECK_SERVICE)
	@test -n "$(FOLLOW)" -o -e $(LADDER_RUN_DIR)/logs/$(SERVICE).log || { \
		echo "$(SERVICE) has no log yet: it has not run here$(if $(filter sim,$(SERVICE)), (make demo starts it))"; \
		exit 1; }
	@tail -n $(LINES) $(if $(FOLLOW),-F) $(LADDER_RUN_DIR)/logs/$(SERVICE).log

# The game simulation (sim/) feeding board arena: `make demo` runs it under supervisord beside
# the services (its program is not started by `make up`); `make sim` runs one in the foreground.
.PHONY: sim sim-set demo clean replay-dead

demo: up ## Ladder with the game simulation feeding it; prints the dashboard's address
	@$(call start_with_env,sim) >/dev/null
	@echo "The game simulation feeds board arena (make logs SERVICE=sim; make stop SERVICE=sim)."
	@echo "Change it live: make sim-set NAME=robot_share VALUE=1.0 (make sim-set lists them all)"
	@echo "Dashboard: $$($(PY) scripts/wait_ready.py --api-url)/"

sim: venv ## the game simulation in the foreground: make sim SIM_ARGS="--speed 10 --seed 7"
	$(PY) -m sim $(SIM_ARGS)

sim-set: venv ## change a running simulation: make sim-set NAME=robot_share VALUE=1.0
	@if [ -z "$(NAME)" ] && [ -z "$(VALUE)" ]; then $(PY) -m sim.set --help; \
	elif [ -z "$(NAME)" ] || [ -z "$(VALUE)" ]; then \
		echo "sim-set: give both NAME and VALUE (make sim-set lists them)" >&2; exit 2; \
	else $(PY) -m sim.set '$(NAME)' '$(VALUE)'; fi

# clean: services that run are stopped first (so that nothing is recreated halfway), then started
# again on a fresh schema and topology; with nothing running, nothing of the prefixes is left.
replay-dead: venv ## a consumer's dead letters back to its own queue (QUEUE=history)
	@test -n "$(QUEUE)" || { echo "usage: make replay-dead QUEUE=<history|aggregator|notifier>"; exit 2; }
	$(PY) scripts/replay_dead.py $(QUEUE)

clean: venv ## remove all Ladder made: its keys, queues, exchanges and history database
	@running=""; \
	if $(SUPERVISORCTL) pid >/dev/null 2>&1; then \
		running=$$($(SUPERVISORCTL) status $(SERVICES) sim 2>/dev/null | awk '$$2 == "RUNNING" {print $$1}' | xargs); \
		if [ -n "$$running" ]; then $(SUPERVISORCTL) stop $$running >/dev/null; fi; \
	fi; \
	$(PY) scripts/clean.py; rc=$$?; \
	if [ $$rc -ne 0 ]; then \
		echo "clean failed (status $$rc); the services it stopped are started again"; \
		if [ -n "$$running" ]; then $(SUPERVISORCTL) start $$running >/dev/null; fi; \
		exit $$rc; \
	fi; \
	if [ -n "$$running" ]; then \
		$(PY) -m services.history.migrate && \
		$(SUPERVISORCTL) start $$running >/dev/null && \
		$(PY) scripts/wait_ready.py && \
		echo "clean: started again: $$running"; \
	fi

# The suite of `make test`: every test but those of the targets after it.
SUITE := not faults and not stack and not cluster and not containers and not fuzz and not rehearsal

# The suite runs on TEST_WORKERS processes (pytest-xdist, each test file on one of them; 0 runs it
# in pytest's own), then the tests marked `timing`, whose assertions bound wall-clock time, alone.
# `$(call suite,ENV)` runs both parts with the environment ENV. pytest's exit status 5 says that
# no test was selected, as when PYTEST_ARGS names files with no test of one of the parts.
TEST_WORKERS ?= 2
define suite
$(1) $(PY) -m pytest -m "($(SUITE)) and not timing" -n $(TEST_WORKERS) --dist loadfile \
	--durations=15 $(PYTEST_ARGS) || [ $$? = 5 ]
$(1) $(PY) -m pytest -m "($(SUITE)) and timing" --durations=5 $(PYTEST_ARGS) || [ $$? = 5 ]
endef

# test: valgrind counts the Redis instructions a write costs (tests/bench); without it that one
# test is skipped, saying why (and fails under LADDER_REQUIRE_TOOLS=1, as .ci/run sets it).
test: venv infra ## the test suite against real Redis, RabbitMQ and MariaDB (then make test-stack, make test-faults)
	@command -v callgrind_control >/dev/null \
		|| { apt-get update -qq && apt-get install -y -qq valgrind; } \
		|| { sudo apt-get update -qq && sudo apt-get install -y -qq valgrind; } \
		|| echo "valgrind could not be installed: the instruction count test will be skipped" \
			"(failed under LADDER_REQUIRE_TOOLS=1)"
	$(call suite)

test-fuzz: venv infra ## Schemathesis over every operation of /openapi.json (about 4 min)
	$(PY) -m pytest -m "fuzz and not stack" $(PYTEST_ARGS)

test-stack: venv infra ## the tests that run the four services as processes (end to end, the browser, seasons)
	$(PY) -m pytest -m "stack and not faults and not containers and not rehearsal" --durations=10 $(PYTEST_ARGS)

# infra: the fault suite starts private servers of its own, but from the same Debian packages.
test-faults: venv infra ## only the fault suite (servers and services stopped, killed under load)
	$(PY) -m pytest -m faults tests/faults -rP $(PYTEST_ARGS)

# test-cluster: tests/cluster (each module or test starts a private six-node Redis Cluster on free
# ports; test_rabbit.py a private three-node RabbitMQ cluster, tests/rabbit_cluster.py), then the
# whole `make test` selection with the tests' Redis a Redis Cluster (LADDER_TEST_REDIS_CLUSTER=1):
# a private one started once for the session, or the running one LADDER_TEST_REDIS_URL names (as
# make test-rehearsal does with `make cluster-up`'s 7000); the same tests hold on one Redis and on
# a cluster (docs/operations.md, "On a Redis Cluster"). CLUSTER_SUITE=0 runs tests/cluster alone:
# .ci/run does, since make test-rehearsal runs the same whole suite on a Redis Cluster after it.
CLUSTER_SUITE ?= 1
test-cluster: venv infra ## the Redis Cluster tests, then the whole suite of `make test` on a cluster
	$(PY) -m pytest -m cluster tests/cluster -rP $(PYTEST_ARGS)
ifeq ($(CLUSTER_SUITE),0)
	@echo "CLUSTER_SUITE=0: the whole suite on a cluster is left to make test-rehearsal"
else
	$(call suite,LADDER_TEST_REDIS_CLUSTER=1)
endif

# The cluster rehearsal: every process of Ladder beyond one machine, on loopback, under its own
# supervisord (scripts/cluster.sh and deploy/cluster/supervisord.conf say what runs where;
# docs/operations.md, "Rehearsing a cluster"). It needs the ports of `make up`'s API: one runs at
# a time.
cluster-up: venv infra ## Redis Cluster 7000-7005, RabbitMQ cluster 5673-5675, APIs 8000/8001, two of each consumer
	@bash scripts/cluster.sh up

cluster-down: ## stop what `make cluster-up` started and remove its data and database
	@bash scripts/cluster.sh down

cluster-ps: ## each process of the cluster rehearsal: name STATE pid uptime (and a node's role)
	@bash scripts/cluster.sh ps

cluster-kill: ## SIGKILL one process of the rehearsal: make cluster-kill PROCESS=redis-7000
	@bash scripts/cluster.sh kill '$(PROCESS)'

cluster-start: ## start one process of the rehearsal again: make cluster-start PROCESS=redis-7000
	@bash scripts/cluster.sh start '$(PROCESS)'

# test-rehearsal: the whole suite with the tests' Redis the rehearsal's cluster and their broker
# its nodes (each test keeps its own prefixes, database, exchange and queues), then the faults
# of tests/rehearsal, which kill the rehearsal's processes and start them again.
REHEARSAL_TEST_ENV := LADDER_TEST_REDIS_CLUSTER=1 LADDER_TEST_REDIS_URL=redis://127.0.0.1:7000/0 \
	LADDER_TEST_AMQP_URL=amqp://guest:guest@127.0.0.1:5673/ \
	LADDER_TEST_MANAGEMENT_URL=http://127.0.0.1:15673

test-rehearsal: venv infra ## the whole suite against `make cluster-up` (started if need be), then faults on it
	@bash scripts/cluster.sh ps | grep -q RUNNING || bash scripts/cluster.sh up
	$(call suite,$(REHEARSAL_TEST_ENV))
	$(PY) -m pytest -m rehearsal tests/rehearsal -rP $(PYTEST_ARGS)

# Containers: deploy/compose.yml, one container per service (scripts/containers.sh says how the
# engine, the secrets and the images are found; docs/operations.md, "Containers").
containers: ## Ladder in containers (deploy/compose.yml); returns once every container is healthy
	@bash scripts/containers.sh up

containers-down: ## stop the containers and remove them, their networks and volumes
	@bash scripts/containers.sh down

test-containers: venv ## end to end against a containerised stack of its own (project and ports)
	$(PY) -m pytest -m containers tests/containers -rP $(PYTEST_ARGS)

# bench: Ladder is started only if it does not answer, and then with a credential rate
# (LADDER_KEY_RATE, 5000 a second by default) the load would otherwise run into.
bench: venv infra ## the benchmarks: prints their table and writes BENCHMARKS.md (about 10 min)
	@{ command -v wrk && command -v valgrind; } >/dev/null \
		|| { apt-get update -qq && apt-get install -y -qq wrk valgrind; } \
		|| { sudo apt-get update -qq && sudo apt-get install -y -qq wrk valgrind; }
	@if $(PY) -m bench --check; then $(PY) -m bench; else \
		LADDER_KEY_RATE=$${LADDER_KEY_RATE:-1000000} $(MAKE) --no-print-directory up || exit 1; \
		$(PY) -m bench; rc=$$?; \
		echo "stopping the Ladder services the bench started (its raised LADDER_KEY_RATE goes with them)"; \
		$(SUPERVISORCTL) shutdown >/dev/null; \
		for _ in $$(seq 1 300); do test -e $(LADDER_RUN_DIR)/supervisord.pid || break; sleep 0.1; done; \
		rm -rf $(LADDER_RUN_DIR)/env; \
		exit $$rc; \
	fi

lint: venv ## ruff and mypy
	$(VENV)/bin/ruff check services shared sim bench tests scripts
	$(VENV)/bin/ruff format --check services shared sim bench tests scripts
	$(VENV)/bin/mypy services shared sim bench
