#!/usr/bin/env bash
# Ladder beyond one machine, rehearsed on loopback: every process under one supervisord
# (deploy/cluster/supervisord.conf), which runs as root because the RabbitMQ nodes run as the
# rabbitmq user.
#
#   scripts/cluster.sh up            a Redis Cluster (primaries 7000-7002, replicas 7003-7005),
#                                    a RabbitMQ cluster (5673-5675, management UI 15673-15675,
#                                    user ladder-monitor as on `make up`), the history database
#                                    ladder_cluster on the MariaDB of `make up`, two API
#                                    processes (8000, 8001) and two of each consumer; returns
#                                    once every service answers /readyz
#   scripts/cluster.sh down          stop everything `up` started and remove its state: the
#                                    nodes' data and the database (the logs stay)
#   scripts/cluster.sh ps            each process: name, state, pid and uptime, a Redis node's
#                                    role, a RabbitMQ node's cluster view
#   scripts/cluster.sh kill NAME     SIGKILL one process (redis-7001, rabbit-5674, api-8001,
#                                    aggregator-2, ...); nothing restarts it
#   scripts/cluster.sh start NAME    start one process again (a Redis node rejoins as a replica
#                                    of whoever took its place, a RabbitMQ node rejoins)
#
# The services' settings are those of the caller's environment, except the three that point
# them at the rehearsal's servers (LADDER_REDIS_URL, LADDER_AMQP_URL, LADDER_MYSQL_URL), set
# here; LADDER_REDIS_WAIT_REPLICAS is 1 unless the caller sets it. LADDER_CLUSTER_DIR (default
# .run-cluster/ at the repository root) holds the state, the control socket and logs/.

set -euo pipefail

PATH="$PATH:/usr/local/sbin:/usr/sbin:/sbin"

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
SCRIPT_NAME=cluster
source "$ROOT/scripts/common.sh"          # log, die, as_root, wait_until
source "$ROOT/scripts/infra_management.sh" # ensure_rabbitmq_management

HOST=127.0.0.1
REDIS_PORTS=(7000 7001 7002 7003 7004 7005)
RABBIT_PORTS=(5673 5674 5675)
API_PORTS=(8000 8001)
HEALTH_PORTS=(9111 9112 9113 9121 9122 9123) # aggregator, history, notifier of pair 1 and 2
DATABASE=ladder_cluster

export LADDER_ROOT="$ROOT"
export LADDER_PYTHON="${LADDER_PYTHON:-$ROOT/.venv/bin/python}"
export LADDER_CLUSTER_DIR="${LADDER_CLUSTER_DIR:-$ROOT/.run-cluster}"
DIR="$LADDER_CLUSTER_DIR"
CONF="$ROOT/deploy/cluster/supervisord.conf"

redis_urls() {
    local port urls=()
    for port in "${REDIS_PORTS[@]:0:3}"; do urls+=("redis://$HOST:$port/0"); done
    (IFS=,; echo "${urls[*]}")
}

amqp_urls() {
    local port urls=()
    for port in "${RABBIT_PORTS[@]}"; do urls+=("amqp://guest:guest@$HOST:$port/"); done
    (IFS=,; echo "${urls[*]}")
}

# Every node of each cluster is named, so that a service (re)started while one is down finds
# the others.
export LADDER_REDIS_URL LADDER_AMQP_URL LADDER_MYSQL_URL
LADDER_REDIS_URL="$(redis_urls)"
LADDER_AMQP_URL="$(amqp_urls)"
LADDER_MYSQL_URL="mysql+asyncmy://root@$HOST:3306/$DATABASE"
export LADDER_REDIS_CLUSTER=true
export LADDER_REDIS_WAIT_REPLICAS="${LADDER_REDIS_WAIT_REPLICAS:-1}"

ctl() { "$(dirname "$LADDER_PYTHON")/supervisorctl" -c "$CONF" "$@"; }
running() { ctl pid >/dev/null 2>&1; }
rabbitmqctl_on() { local port=$1; shift; rabbitmqctl -q -n "ladder-rabbit-$port@localhost" "$@"; }

port_in_use() { (exec 3<>"/dev/tcp/$HOST/$1") 2>/dev/null; }

quietly() { "$@" >/dev/null 2>&1; }

wait_for() { # seconds, what, command...: until the command succeeds, or die naming what
    wait_until "$1" quietly "${@:3}" || die "waited $1 s for $2 (logs: $DIR/logs/)"
}

check_ports() {
    local port busy=()
    for port in "${REDIS_PORTS[@]}" "${RABBIT_PORTS[@]}" "${API_PORTS[@]}" "${HEALTH_PORTS[@]}"; do
        port_in_use "$port" && busy+=("$port")
    done
    for port in "${REDIS_PORTS[@]}"; do port_in_use $((port + 10000)) && busy+=($((port + 10000))); done
    for port in "${RABBIT_PORTS[@]}"; do
        port_in_use $((port + 10000)) && busy+=($((port + 10000))) # the management UI
        port_in_use $((port + 20000)) && busy+=($((port + 20000))) # Erlang distribution
    done
    if ((${#busy[@]})); then
        die "ports in use: ${busy[*]} (a Ladder of \`make up\` holds 8000: \`make down\` stops it)"
    fi
}

prepare() {
    local port
    [[ $EUID -eq 0 ]] || die "run as root: the RabbitMQ nodes run as the rabbitmq user"
    command -v redis-server >/dev/null && command -v rabbitmqctl >/dev/null ||
        die "redis-server and rabbitmq-server are needed (make infra installs them)"
    mkdir -p "$DIR/logs"
    for port in "${REDIS_PORTS[@]}"; do mkdir -p "$DIR/redis/$port"; done
    for port in "${RABBIT_PORTS[@]}"; do
        mkdir -p "$DIR/rabbit/$port/mnesia" "$DIR/rabbit/$port/log"
        # Each node's management UI and HTTP API on its AMQP port plus 10000 (15673 for 5673).
        printf 'listeners.tcp.local = %s:%s\nmanagement.tcp.ip = %s\nmanagement.tcp.port = %s\n' \
            "$HOST" "$port" "$HOST" $((port + 10000)) >"$DIR/rabbit/$port/rabbitmq.conf"
        printf '[rabbitmq_management].\n' >"$DIR/rabbit/$port/enabled_plugins"
    done
    chown -R rabbitmq:rabbitmq "$DIR/rabbit"
    runuser -u rabbitmq -- test -w "$DIR/rabbit/${RABBIT_PORTS[0]}/mnesia" ||
        die "the rabbitmq user cannot write under $DIR: set LADDER_CLUSTER_DIR to a path it can reach"
}

redis_cli() { redis-cli -h "$HOST" -p "$1" "${@:2}"; }

redis_formed() {
    local port info
    for port in "${REDIS_PORTS[@]}"; do
        info="$(redis_cli "$port" cluster info 2>/dev/null)" || return 1
        grep -q '^cluster_state:ok' <<<"$info" || return 1
        grep -q "^cluster_known_nodes:${#REDIS_PORTS[@]}" <<<"$info" || return 1
    done
    # A replica that has not synced once cannot take its primary's place.
    for port in "${REDIS_PORTS[@]}"; do
        if redis_cli "$port" role | head -1 | grep -q slave; then
            redis_cli "$port" info replication | grep -q '^master_link_status:up' || return 1
        fi
    done
}

form_redis() {
    local port nodes=()
    for port in "${REDIS_PORTS[@]}"; do
        wait_for 30 "redis-$port" redis_cli "$port" ping
        nodes+=("$HOST:$port")
    done
    if redis_cli "${REDIS_PORTS[0]}" cluster info | grep -q '^cluster_known_nodes:1\b'; then
        log "forming the Redis Cluster: primaries ${REDIS_PORTS[*]:0:3}, replicas ${REDIS_PORTS[*]:3:3}"
        redis-cli --cluster create "${nodes[@]}" --cluster-replicas 1 --cluster-yes >"$DIR/logs/redis-create.log"
    fi
    wait_for 60 "the Redis Cluster to be ok with its replicas in sync" redis_formed
}

# A RabbitMQ node's own view of its cluster: "MEMBERS RUNNING" (how many nodes it counts as
# members, and as running), or "joined" when it counts the first node among its members.
rabbit_view() { # port, what (counts|joined)
    rabbitmqctl_on "$1" cluster_status --formatter json </dev/null |
        "$LADDER_PYTHON" -c '
import json, sys
status = json.load(sys.stdin)
if sys.argv[1] == "counts":
    print(len(status["disk_nodes"]), len(status["running_nodes"]))
else:
    sys.exit(sys.argv[2] not in status["disk_nodes"])
' "$2" "ladder-rabbit-${RABBIT_PORTS[0]}@localhost"
}

form_rabbit() {
    local port first="${RABBIT_PORTS[0]}"
    for port in "${RABBIT_PORTS[@]}"; do
        wait_for 120 "rabbit-$port" rabbitmqctl_on "$port" await_startup
    done
    for port in "${RABBIT_PORTS[@]:1}"; do
        rabbit_view "$port" joined && continue
        log "joining rabbit-$port to rabbit-$first"
        rabbitmqctl_on "$port" stop_app
        rabbitmqctl_on "$port" join_cluster "ladder-rabbit-$first@localhost"
        rabbitmqctl_on "$port" start_app
        wait_for 60 "rabbit-$port to join" rabbit_view "$port" joined
    done
    # The read-only user of `make up`'s broker, ladder-monitor, on the cluster (users are the
    # cluster's, so one node is told). rabbitmq-plugins refuses a node whose enabled plugins
    # file is not the one it was given: the node's own, not the system broker's.
    MANAGEMENT_PORT=$((first + 10000)) RABBITMQ_NODENAME="ladder-rabbit-$first@localhost" \
        RABBITMQ_ENABLED_PLUGINS_FILE="$DIR/rabbit/$first/enabled_plugins" \
        ensure_rabbitmq_management
}

ready_urls() {
    local port urls=()
    for port in "${API_PORTS[@]}"; do urls+=("http://$HOST:$port/readyz"); done
    for port in "${HEALTH_PORTS[@]}"; do urls+=("http://$HOST:$port/readyz"); done
    echo "${urls[@]}"
}

up() {
    if ! running; then
        check_ports
        prepare
        "$(dirname "$LADDER_PYTHON")/supervisord" -c "$CONF"
    else
        ctl start redis:* rabbit:* >/dev/null || true
    fi
    form_redis
    form_rabbit
    "$LADDER_PYTHON" -m services.history.migrate
    ctl start api:* aggregator:* history:* notifier:* >/dev/null || true
    # shellcheck disable=SC2046
    "$LADDER_PYTHON" "$ROOT/scripts/wait_ready.py" $(ready_urls) ||
        die "not every service is ready: make cluster-ps, and the logs in $DIR/logs/"
    echo "Ladder's cluster rehearsal is up: APIs http://$HOST:8000/docs and http://$HOST:8001/docs"
    echo "  Redis Cluster $LADDER_REDIS_URL (+ replicas), RabbitMQ $LADDER_AMQP_URL"
    echo "  make cluster-ps lists every process; make cluster-kill PROCESS=redis-7000 kills one"
}

down() {
    if running; then
        ctl shutdown >/dev/null
        wait_for 90 "supervisord to stop everything" test ! -e "$DIR/supervisord.pid"
        echo "cluster rehearsal stopped"
    else
        echo "the cluster rehearsal is not running"
    fi
    # A node left behind (supervisord killed by hand) would keep its ports.
    pkill -KILL -f "redis-server $HOST:70(0[0-5]) \[cluster\]" 2>/dev/null || true
    pkill -KILL -f 'ladder-rabbit-567[3-5]@localhost' 2>/dev/null || true
    mysql -h "$HOST" -u root -e "DROP DATABASE IF EXISTS \`$DATABASE\`" 2>/dev/null ||
        log "could not drop database $DATABASE (is MariaDB up?)"
    rm -rf "$DIR/redis" "$DIR/rabbit"
}

# A process's full supervisord name (redis:redis-7000) from its own (redis-7000).
full_name() {
    [[ $1 =~ ^(redis|rabbit|api|aggregator|history|notifier)-[0-9]+$ ]] ||
        die "no process '$1': make cluster-ps lists them"
    echo "${1%-*}:$1"
}

list_processes() {
    running || { echo "the cluster rehearsal is not running (make cluster-up starts it)"; return 0; }
    local line name state role lines members live
    # Read whole first: rabbitmqctl and redis-cli below would read the rest of a piped status.
    mapfile -t lines < <(ctl status || true)
    for line in "${lines[@]}"; do
        name="${line%% *}"
        name="${name#*:}"
        state="$(awk '{print $2}' <<<"$line")"
        role=""
        if [[ $state == RUNNING && $name == redis-* ]]; then
            role="  role=$(redis_cli "${name#redis-}" role 2>/dev/null | head -1 |
                sed 's/master/primary/; s/slave/replica/')"
        elif [[ $state == RUNNING && $name == rabbit-* ]]; then
            read -r members live < <(rabbit_view "${name#rabbit-}" counts 2>/dev/null || echo "? ?")
            role="  cluster: $live of $members nodes running"
        fi
        printf '%-14s %s%s\n' "$name" "$(cut -d' ' -f2- <<<"$line" | sed 's/^ *//')" "$role"
    done
}

kill_one() {
    [[ -n ${1:-} ]] || die "usage: make cluster-kill PROCESS=<name> (make cluster-ps lists them)"
    running || die "the cluster rehearsal is not running"
    local full pid
    full="$(full_name "$1")"
    pid="$(ctl pid "$full")"
    [[ $pid =~ ^[1-9][0-9]*$ ]] || die "$1 is not running"
    # Its whole process group: a RabbitMQ node is a shell, erl and the BEAM.
    kill -KILL -- "-$pid"
    echo "$1 (pid $pid) killed with SIGKILL; make cluster-start PROCESS=$1 starts it again"
}

start_one() {
    [[ -n ${1:-} ]] || die "usage: make cluster-start PROCESS=<name>"
    running || die "the cluster rehearsal is not running (make cluster-up starts it)"
    ctl start "$(full_name "$1")"
}

case "${1:-}" in
up) up ;;
down) down ;;
ps) list_processes ;;
kill) kill_one "${2:-}" ;;
start) start_one "${2:-}" ;;
*)
    echo "usage: $0 up|down|ps|kill NAME|start NAME" >&2
    exit 2
    ;;
esac
