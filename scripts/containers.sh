#!/usr/bin/env bash
# Ladder in containers, one per service (deploy/compose.yml with deploy/compose.debug.yml):
#
#   scripts/containers.sh up             make containers: engine, secrets, images, then every
#                                        container healthy; prints the addresses
#   scripts/containers.sh down           make containers-down: containers, networks, volumes
#   scripts/containers.sh compose ARG... the compose command of this stack (ps, logs, exec ...)
#   scripts/containers.sh engine         only make sure a Docker engine answers
#
# The engine: the one DOCKER_HOST (or the default socket) reaches; else the one this script
# started before; else Debian's docker.io is installed if need be and started without systemd,
# with its data, state and socket under LADDER_DOCKER_DIR (/var/lib/ladder-docker), and with
# no default bridge and no iptables rules (compose makes its own networks). Compose v2 where
# installed, else Debian's docker-compose 1.29.
#
# Secrets come from the environment, then from LADDER_CONTAINERS_ENV_FILE (deploy/.env); any
# still missing is generated (random, URL-safe) into that file, mode 0600, and named.
# Images: the official ones (or LADDER_REDIS_IMAGE etc.) where present or pullable; else
# scripts/local_images.sh builds local ones from Debian packages.
#
# LADDER_COMPOSE_PROJECT (ladder), LADDER_PUBLISH_API_PORT (8000), LADDER_PUBLISH_UI_PORT
# (15672) and LADDER_CONTAINERS_TIMEOUT (300 s: to become healthy, and for any one engine
# call) change the defaults.

set -euo pipefail

PATH="$PATH:/usr/local/sbin:/usr/sbin:/sbin"
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
STATE="${LADDER_DOCKER_DIR:-/var/lib/ladder-docker}"
OUR_SOCKET="$STATE/docker.sock"
ENV_FILE="${LADDER_CONTAINERS_ENV_FILE:-$ROOT/deploy/.env}"
PROJECT="${LADDER_COMPOSE_PROJECT:-ladder}"
API_PORT="${LADDER_PUBLISH_API_PORT:-8000}"
UI_PORT="${LADDER_PUBLISH_UI_PORT:-15672}"
TIMEOUT="${LADDER_CONTAINERS_TIMEOUT:-300}"
export LADDER_PUBLISH_API_PORT="$API_PORT" LADDER_PUBLISH_UI_PORT="$UI_PORT"

SECRETS=(LADDER_SERVER_KEYS LADDER_ADMIN_KEYS LADDER_JWT_SECRET REDIS_PASSWORD
    AMQP_ADMIN_PASSWORD AMQP_API_PASSWORD AMQP_AGGREGATOR_PASSWORD AMQP_HISTORY_PASSWORD
    AMQP_NOTIFIER_PASSWORD LADDER_BROKER_MONITOR_PASSWORD MYSQL_ROOT_PASSWORD MYSQL_PASSWORD)
# Image variable → [official image]=local image name (scripts/local_images.sh)
declare -A OFFICIAL=([LADDER_REDIS_IMAGE]=redis:7.2 [LADDER_RABBITMQ_IMAGE]=rabbitmq:3.13-management
    [LADDER_MARIADB_IMAGE]=mariadb:10.11 [LADDER_PYTHON_IMAGE]=python:3.11-slim)
declare -A LOCAL=([LADDER_REDIS_IMAGE]=redis [LADDER_RABBITMQ_IMAGE]=rabbitmq
    [LADDER_MARIADB_IMAGE]=mariadb [LADDER_PYTHON_IMAGE]=python)

SCRIPT_NAME=containers
source "$ROOT/scripts/common.sh" # log, die, as_root

# --- the engine ---

engine_answers() { timeout 20 docker info >/dev/null 2>&1; }

install_packages() {
    command -v apt-get >/dev/null || die "no apt-get: install $* by hand"
    log "installing $* (Debian packages)"
    as_root apt-get update -q >&2
    as_root env DEBIAN_FRONTEND=noninteractive apt-get install -y -q "$@" >&2
}

start_engine() {
    local missing=()
    command -v dockerd >/dev/null || missing+=(docker.io)
    command -v debootstrap >/dev/null || missing+=(debootstrap)
    if ! docker compose version >/dev/null 2>&1 && ! command -v docker-compose >/dev/null; then
        missing+=(docker-compose)
    fi
    ((${#missing[@]} == 0)) || install_packages "${missing[@]}"
    as_root mkdir -p "$STATE/data" "$STATE/exec"
    log "starting dockerd (data in $STATE; socket $OUR_SOCKET; log $STATE/dockerd.log)"
    # No default bridge and no iptables: the machine may allow neither. Compose's own networks
    # (bridges it creates), their DNS and ports published on the host work without them. vfs
    # storage works on any filesystem (overlay may not nest here).
    (
        exec </dev/null >>"$STATE/dockerd.log" 2>&1
        as_root setsid dockerd --iptables=false --ip6tables=false --bridge=none \
            --storage-driver=vfs --data-root="$STATE/data" --exec-root="$STATE/exec" \
            --pidfile="$STATE/dockerd.pid" -H "unix://$OUR_SOCKET" &
    )
    export DOCKER_HOST="unix://$OUR_SOCKET"
    local deadline=$((SECONDS + 60))
    until engine_answers; do
        ((SECONDS < deadline)) || die "dockerd does not answer after 60 s; see $STATE/dockerd.log"
        sleep 1
    done
}

ensure_engine() {
    command -v docker >/dev/null || install_packages docker.io
    if engine_answers; then
        return 0
    fi
    if [[ -S $OUR_SOCKET ]] && DOCKER_HOST="unix://$OUR_SOCKET" engine_answers; then
        export DOCKER_HOST="unix://$OUR_SOCKET"
        return 0
    fi
    start_engine
}

# --- compose ---

COMPOSE=()
COMPOSE_NAME=""

find_compose() {
    if docker compose version >/dev/null 2>&1; then
        COMPOSE=(docker compose)
    elif command -v docker-compose >/dev/null; then
        COMPOSE=(docker-compose)
    else
        install_packages docker-compose
        COMPOSE=(docker-compose)
    fi
    COMPOSE_NAME="${COMPOSE[*]}"
    # Compose 1.x gives up on any engine call after 60 s by default; with vfs storage, creating
    # a container copies its image's whole tree, and a slow disk takes minutes for a stack.
    export COMPOSE_HTTP_TIMEOUT="${COMPOSE_HTTP_TIMEOUT:-$TIMEOUT}"
    export DOCKER_CLIENT_TIMEOUT="${DOCKER_CLIENT_TIMEOUT:-$TIMEOUT}"
    COMPOSE+=(-p "$PROJECT" -f "$ROOT/deploy/compose.yml" -f "$ROOT/deploy/compose.debug.yml")
}

compose() { "${COMPOSE[@]}" "$@"; }

# --- secrets ---

env_file_value() { # NAME: its value in ENV_FILE, empty if none
    [[ -r $ENV_FILE ]] || return 0
    sed -n "s/^[[:space:]]*$1=//p" "$ENV_FILE" | tail -n 1 | sed 's/^"\(.*\)"$/\1/'
}

load_secrets() { # generate: 1 to make the missing ones, 0 to fill them with a stand-in
    local generate=$1 name value made=()
    for name in "${SECRETS[@]}"; do
        value=${!name:-}
        [[ -n $value ]] || value=$(env_file_value "$name")
        if [[ -z $value ]]; then
            if ((generate)); then
                value=$(openssl rand -hex 32)
                if [[ ! -e $ENV_FILE ]]; then
                    (umask 077 && printf '# Generated by scripts/containers.sh\n' >"$ENV_FILE")
                fi
                printf '%s=%s\n' "$name" "$value" >>"$ENV_FILE"
                made+=("$name")
            else
                value=unused # compose interpolates every variable even to stop
            fi
        fi
        export "$name=$value"
    done
    [[ ! -e $ENV_FILE ]] || chmod 0600 "$ENV_FILE"
    if ((${#made[@]})); then
        log "generated strong random secrets into $ENV_FILE (mode 0600, git-ignored):" \
            "${made[*]}"
    fi
}

# --- images ---

REGISTRY=unknown

registry_answers() {
    if [[ $REGISTRY == unknown ]]; then
        if timeout 60 docker pull -q "$1" >/dev/null 2>&1; then REGISTRY=yes; else REGISTRY=no; fi
        [[ $REGISTRY == yes ]] || log "no registry answers (pulling $1 failed): local images"
    fi
    [[ $REGISTRY == yes ]]
}

choose_images() {
    local variable official local_names=()
    for variable in LADDER_REDIS_IMAGE LADDER_RABBITMQ_IMAGE LADDER_MARIADB_IMAGE \
        LADDER_PYTHON_IMAGE; do
        [[ -z ${!variable:-} ]] || continue # the caller's choice
        official=${OFFICIAL[$variable]}
        if docker image inspect "$official" >/dev/null 2>&1; then
            continue
        fi
        if [[ $REGISTRY != no ]] && registry_answers "$official"; then
            docker pull -q "$official" >/dev/null || die "could not pull $official"
            continue
        fi
        local_names+=("${LOCAL[$variable]}")
        export "$variable=$(bash "$ROOT/scripts/local_images.sh" tag "${LOCAL[$variable]}")"
    done
    if ((${#local_names[@]})); then
        bash "$ROOT/scripts/local_images.sh" build "${local_names[@]}"
    fi
}

# Without building or pulling: the images `up` chose (for down, and the compose pass-through).
known_images() {
    local variable
    for variable in "${!OFFICIAL[@]}"; do
        [[ -z ${!variable:-} ]] || continue
        docker image inspect "${OFFICIAL[$variable]}" >/dev/null 2>&1 && continue
        export "$variable=$(bash "$ROOT/scripts/local_images.sh" tag "${LOCAL[$variable]}")"
    done
}

# --- ports ---

port_taken() {
    # shellcheck disable=SC2016  # expanded by the inner bash
    timeout 3 bash -c 'exec 3<>"/dev/tcp/127.0.0.1/$0"' "$1" 2>/dev/null
}

ours_publish() { # PORT: a container of this project publishes it already
    compose ps -q 2>/dev/null | xargs -r docker inspect -f \
        '{{range $p, $b := .NetworkSettings.Ports}}{{range $b}}{{.HostPort}} {{end}}{{end}}' |
        tr ' ' '\n' | grep -qx "$1"
}

check_port() { # PORT VARIABLE WHAT
    if port_taken "$1" && ! ours_publish "$1"; then
        local free=$(($1 + 1))
        while port_taken "$free"; do free=$((free + 1)); done
        die "port $1 ($3) is taken on this machine (\`make up\` uses 8000 and its broker's UI" \
            "15672): stop what holds it, or choose another, e.g. $2=$free make containers"
    fi
}

# --- health ---

state_of() { # container id → "name status health exitcode restarts"
    docker inspect -f '{{index .Config.Labels "com.docker.compose.service"}} {{.State.Status}}
        {{- if .State.Health}} {{.State.Health.Status}}{{else}} none{{end}} {{.State.ExitCode}}
        {{- " "}}{{.RestartCount}}' "$1"
}

# 0 when every container is healthy (the migration: exited 0), 1 while some are not yet, 2
# when one has failed (printed to FAILED).
FAILED=""
all_healthy() {
    local ids id name status health code restarts waiting=0
    mapfile -t ids < <(compose ps -q)
    ((${#ids[@]} > 0)) || return 1
    for id in "${ids[@]}"; do
        read -r name status health code restarts < <(state_of "$id")
        if [[ $name == migrate ]]; then
            [[ $status == exited && $code != 0 ]] && FAILED=$name && return 2
            [[ $status == exited ]] || waiting=1
            continue
        fi
        # A service that keeps exiting at start is restarted by its policy: a few times is
        # enough to call it failed, without waiting for the health checks to give up.
        if [[ $status == exited || $status == dead || $health == unhealthy ]] ||
            ((restarts >= 3)); then
            FAILED=$name
            return 2
        fi
        [[ $health == healthy ]] || waiting=1
    done
    return "$waiting"
}

wait_healthy() {
    local deadline=$((SECONDS + TIMEOUT)) rc
    while :; do
        rc=0
        all_healthy || rc=$?
        ((rc != 0)) || return 0
        if ((rc == 2)); then
            compose logs --tail 25 "$FAILED" >&2 || true
            die "$FAILED failed (its log above; scripts/containers.sh compose ps)"
        fi
        if ((SECONDS >= deadline)); then
            compose ps >&2 || true
            compose logs --tail 30 >&2 || true
            die "not every container is healthy after $TIMEOUT s (the logs above)"
        fi
        sleep 2
    done
}

# `compose up` converges on the declared state, so a call that gave up half way (the engine
# slower than the client's patience) is finished by the next one.
start_containers() {
    local attempt
    for attempt in 1 2 3; do
        compose up -d --no-build --remove-orphans >&2 && return 0
        ((attempt < 3)) || break
        log "compose up failed (attempt $attempt of 3); trying again in 10 s"
        sleep 10
    done
    compose ps >&2 || true
    die "compose up failed three times (its errors above)"
}

# --- commands ---

up() {
    ensure_engine
    find_compose
    load_secrets 1
    check_port "$API_PORT" LADDER_PUBLISH_API_PORT "the API"
    check_port "$UI_PORT" LADDER_PUBLISH_UI_PORT "the RabbitMQ management UI"
    choose_images
    log "building the Ladder image (base ${LADDER_PYTHON_IMAGE:-${OFFICIAL[LADDER_PYTHON_IMAGE]}})"
    # The five Ladder services share one image: built once, not once each.
    compose build api >&2
    # The image a rebuild replaced, untagged now: vfs keeps every one of its layers whole.
    docker image prune -f --filter label=ladder.image=ladder >/dev/null
    log "starting project $PROJECT ($COMPOSE_NAME)"
    start_containers
    wait_healthy
    log "every container is healthy"
    printf 'Ladder API:           http://127.0.0.1:%s/docs\n' "$API_PORT"
    printf 'RabbitMQ management:  http://127.0.0.1:%s/ (ladder-monitor; passwords in %s)\n' \
        "$UI_PORT" "$ENV_FILE"
    [[ ${DOCKER_HOST:-} != "unix://$OUR_SOCKET" ]] ||
        printf 'Docker engine:        export DOCKER_HOST=%s\n' "$DOCKER_HOST"
}

# An engine that answers already (the machine's, or the one this script started), with neither
# installed nor started: 1 if none runs.
engine_running() {
    command -v docker >/dev/null || return 1
    engine_answers && return 0
    [[ -S $OUR_SOCKET ]] && DOCKER_HOST="unix://$OUR_SOCKET" engine_answers || return 1
    export DOCKER_HOST="unix://$OUR_SOCKET"
}

# The engine this script started (on its own socket), once no container is left on it; its
# images stay in $STATE for the next `up`.
stop_our_engine() {
    [[ ${DOCKER_HOST:-} == "unix://$OUR_SOCKET" && -f $STATE/dockerd.pid ]] || return 0
    [[ -z $(docker ps -aq) ]] || return 0
    log "stopping the Docker engine it started (images kept in $STATE)"
    local pid
    pid=$(as_root cat "$STATE/dockerd.pid")
    as_root kill "$pid" 2>/dev/null || return 0
    # Until the process is gone, not only until it stops answering: an engine started again
    # before its pid file is removed refuses to start ("pid file found").
    local deadline=$((SECONDS + 30))
    while as_root kill -0 "$pid" 2>/dev/null && ((SECONDS < deadline)); do sleep 1; done
}

down() {
    if ! engine_running; then
        log "no Docker engine runs: no project $PROJECT to remove"
        return 0
    fi
    find_compose
    load_secrets 0
    known_images
    compose down --volumes --remove-orphans >&2
    log "project $PROJECT removed: its containers, networks and volumes"
    stop_our_engine
}

main() {
    case ${1:-} in
    up) up ;;
    down) down ;;
    engine)
        ensure_engine
        printf 'DOCKER_HOST=%s\n' "${DOCKER_HOST:-unix:///var/run/docker.sock}"
        ;;
    compose)
        shift
        ensure_engine
        find_compose
        load_secrets 0
        known_images
        compose "$@"
        ;;
    *)
        sed -n '2,23s/^# \{0,1\}//p' "${BASH_SOURCE[0]}" >&2
        exit 2
        ;;
    esac
}

main "$@"
