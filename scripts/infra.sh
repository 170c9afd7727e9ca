#!/usr/bin/env bash
# Redis, RabbitMQ and MariaDB on their default loopback ports, for `make up` and CI.
#
#   scripts/infra.sh ensure        make each answer: install its Debian package if missing,
#                                  start it (without systemd) if it does not answer
#   scripts/infra.sh status        print each server and whether it answers (exit 1 if one
#                                  does not)
#   scripts/infra.sh stop-started  stop only the servers that `ensure` started, newest first
#
# Servers that were already running are never started, stopped or restarted. Those that
# `ensure` starts are listed, one name a line, in $LADDER_RUN_DIR/infra-started (default:
# .run/ at the repository root); `stop-started` stops exactly those and removes the file.
# Installing and starting need root: the script uses sudo when it is not run as root.
#
# Ports: Redis 6379, AMQP 5672, MySQL 3306, all on 127.0.0.1 (the Ladder defaults).

set -euo pipefail

PATH="$PATH:/usr/local/sbin:/usr/sbin:/sbin"

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
RUN_DIR="${LADDER_RUN_DIR:-$ROOT/.run}"
STARTED_FILE="$RUN_DIR/infra-started"

HOST=127.0.0.1
SERVERS=(redis rabbitmq mariadb)
declare -A PORT=([redis]=6379 [rabbitmq]=5672 [mariadb]=3306)
declare -A PACKAGE=([redis]=redis-server [rabbitmq]=rabbitmq-server [mariadb]=mariadb-server)
declare -A PROGRAM=([redis]=redis-server [rabbitmq]=rabbitmq-server [mariadb]=mariadbd)
# Seconds to wait for a server to answer after starting it (or to go away after stopping it).
declare -A WAIT=([redis]=20 [rabbitmq]=60 [mariadb]=60)

REDIS_LOG=/var/log/redis/ci.log
REDIS_DIR="$RUN_DIR/redis" # its append-only file, across `make down` and `make up`
MARIADB_LOG=/var/log/mysql/ci.log

APT_UPDATED=0

SCRIPT_NAME=infra
source "$ROOT/scripts/common.sh" # log, die, as_root

# --- probes: a server answers when it speaks its protocol, not merely when a port is open ---

redis_answers() {
    local reply
    # shellcheck disable=SC2016  # expanded by the inner bash
    reply=$(timeout 3 bash -c 'exec 3<>"/dev/tcp/$0/$1" && printf "PING\r\n" >&3 &&
        IFS= read -r line <&3 && printf "%s" "$line"' "$HOST" "${PORT[redis]}" 2>/dev/null) ||
        return 1
    [[ $reply == "+PONG"* ]]
}

rabbitmq_answers() {
    local first
    # An AMQP 0-9-1 protocol header; a broker answers with a method frame (type 1).
    # shellcheck disable=SC2016  # expanded by the inner bash
    first=$(timeout 3 bash -c 'exec 3<>"/dev/tcp/$0/$1" && printf "AMQP\0\0\11\1" >&3 &&
        head -c 1 <&3 | od -An -tx1' "$HOST" "${PORT[rabbitmq]}" 2>/dev/null) || return 1
    [[ ${first//[[:space:]]/} == 01 ]]
}

mariadb_answers() {
    # 0 while the server runs, even when it refuses the user (access denied).
    if command -v mysqladmin >/dev/null 2>&1 &&
        mysqladmin --no-defaults --protocol=tcp -h"$HOST" -P"${PORT[mariadb]}" -uroot \
            --connect-timeout=3 --silent ping >/dev/null 2>&1; then
        return 0
    fi
    # Where the server sends an error in place of its greeting ("Host '127.0.0.1' is not
    # allowed to connect": no root@127.0.0.1 yet), and where there is no client yet, read the
    # first packet: a greeting (protocol 10, 0x0a) or an error packet (0xff) means it runs.
    local hex
    # shellcheck disable=SC2016  # expanded by the inner bash
    hex=$(timeout 3 bash -c 'exec 3<>"/dev/tcp/$0/$1" && head -c 5 <&3 | od -An -tx1' \
        "$HOST" "${PORT[mariadb]}" 2>/dev/null) || return 1
    hex=${hex//[[:space:]]/}
    [[ ${hex:8:2} == 0a || ${hex:8:2} == ff ]]
}

answers() { "${1}_answers"; }

# Runs a command that leaves a daemon behind, with none of our descriptors beyond 0-2: a
# daemon that inherited the lock (fd 9) or a caller's pipe would keep the lock held and keep
# `scripts/infra.sh ensure | tee log` (CI) waiting for an end of file that never comes.
leaving_daemon() {
    (
        local fd
        for fd in /proc/"$BASHPID"/fd/*; do
            fd=${fd##*/}
            if [[ $fd =~ ^[0-9]+$ ]] && ((fd > 2)); then
                eval "exec $fd>&-"
            fi
        done
        "$@"
    ) </dev/null
}

port_open() {
    # shellcheck disable=SC2016  # expanded by the inner bash
    timeout 3 bash -c 'exec 3<>"/dev/tcp/$0/$1"' "$HOST" "$1" 2>/dev/null
}

fails() { ! "$@"; } # command...: lets wait_until wait for a server to stop answering

# --- installing ---

installed() { command -v "${PROGRAM[$1]}" >/dev/null 2>&1; }

install() {
    local name=$1
    command -v apt-get >/dev/null 2>&1 ||
        die "$name is not installed and there is no apt-get: install ${PACKAGE[$name]} by hand"
    if ((!APT_UPDATED)); then
        log "apt-get update"
        as_root apt-get update -q >&2
        APT_UPDATED=1
    fi
    log "installing ${PACKAGE[$name]}"
    # Its install scripts may start the server.
    leaving_daemon as_root env DEBIAN_FRONTEND=noninteractive \
        apt-get install -y -q "${PACKAGE[$name]}" >&2
    installed "$name" || die "${PACKAGE[$name]} is installed but ${PROGRAM[$name]} is not found"
}

# --- starting: loopback only, no systemd ---

# The Redis that `ensure` starts (REDIS_ARGS, without --daemonize) keeps an append-only file,
# fsynced every second: the outbox holds accepted events that only Redis has until they are
# relayed (docs/reliability.md, "Redis durability").
redis_args() {
    REDIS_ARGS=(--bind 127.0.0.1 -::1 --port "${PORT[redis]}" --save "" --appendonly yes
        --appendfsync everysec --dir "$REDIS_DIR" --logfile "$REDIS_LOG")
}

start_redis() {
    as_root mkdir -p "$REDIS_DIR" "$(dirname "$REDIS_LOG")"
    log "starting redis-server on $HOST:${PORT[redis]} (AOF in $REDIS_DIR; log: $REDIS_LOG)"
    redis_args
    leaving_daemon as_root redis-server --daemonize yes "${REDIS_ARGS[@]}"
    wait_until "${WAIT[redis]}" redis_answers ||
        die "redis-server does not answer after ${WAIT[redis]} s; see $REDIS_LOG"
}

# A Redis that was running already is left as it is; say so if it keeps no append-only file.
check_redis_persistence() {
    [[ $(timeout 3 redis-cli -h "$HOST" -p "${PORT[redis]}" config get appendonly 2>/dev/null |
        tail -n 1) == no ]] || return 0
    log "warning: the Redis on $HOST:${PORT[redis]} runs without an append-only file:" \
        "a restart of it loses the accepted events not yet relayed (docs/reliability.md)"
}

rabbitmqctl_answers() { as_root rabbitmqctl status >/dev/null 2>&1; }

start_rabbitmq() {
    log "starting rabbitmq-server (AMQP on $HOST:${PORT[rabbitmq]}; logs: /var/log/rabbitmq)"
    # Run as root, Debian's wrapper switches to the rabbitmq user; su keeps the environment.
    # A listener configured in /etc/rabbitmq/rabbitmq.conf takes precedence over this variable.
    leaving_daemon as_root env RABBITMQ_NODE_IP_ADDRESS="$HOST" rabbitmq-server -detached >&2
    wait_until "${WAIT[rabbitmq]}" rabbitmqctl_answers ||
        die "rabbitmqctl status does not answer after ${WAIT[rabbitmq]} s; see /var/log/rabbitmq"
    wait_until 30 rabbitmq_answers ||
        die "RabbitMQ runs but AMQP does not answer on $HOST:${PORT[rabbitmq]}"
}

mariadb_datadir() {
    local datadir
    datadir=$(my_print_defaults --mysqld 2>/dev/null | sed -n 's/^--datadir=//p' | tail -n 1)
    printf '%s\n' "${datadir:-/var/lib/mysql}"
}

start_mariadb() {
    local datadir
    datadir=$(mariadb_datadir)
    # MariaDB refuses to run as root; it drops to the mysql user, which owns the socket dir.
    as_root mkdir -p /run/mysqld "$(dirname "$MARIADB_LOG")"
    as_root chown mysql /run/mysqld "$(dirname "$MARIADB_LOG")"
    if ! as_root test -d "$datadir/mysql"; then
        log "initialising the MariaDB data directory $datadir"
        local out
        if ! out=$(as_root mariadb-install-db --user=mysql --datadir="$datadir" \
            --skip-test-db 2>&1); then
            printf '%s\n' "$out" >&2
            die "mariadb-install-db failed"
        fi
    fi
    # start-stop-daemon would take a running mariadbd for this one and do nothing.
    if as_root start-stop-daemon --status --exec "$(command -v mariadbd)"; then
        die "a mariadbd process runs but does not answer on $HOST:${PORT[mariadb]}" \
            "(skip-networking? another port?): fix or stop it first"
    fi
    log "starting mariadbd (data: $datadir; log: $MARIADB_LOG or its log-error setting)"
    leaving_daemon as_root start-stop-daemon --start --oknodo --background \
        --output "$MARIADB_LOG" \
        --exec "$(command -v mariadbd)" -- --user=mysql
    wait_until "${WAIT[mariadb]}" mariadb_answers ||
        die "mariadbd does not answer on $HOST:${PORT[mariadb]} after ${WAIT[mariadb]} s;" \
            "see $MARIADB_LOG and /var/log/mysql"
}

# The Ladder default URL is mysql+asyncmy://root@127.0.0.1:3306/ladder: root, no password, TCP.
mariadb_root_connects() {
    env -u MYSQL_PWD mysql --no-defaults --protocol=tcp -h"$HOST" -P"${PORT[mariadb]}" -uroot \
        --connect-timeout=5 -e 'select 1' >/dev/null 2>&1
}

# Root on the local server over its unix socket, as the OS root user (unix_socket auth).
MYSQL_SOCKET_ARGS=(--protocol=socket -uroot)

mariadb_sql() { as_root mysql "${MYSQL_SOCKET_ARGS[@]}" --batch --skip-column-names -e "$1"; }

ensure_mariadb_root() {
    if ! command -v mysql >/dev/null 2>&1; then
        log "warning: no mysql client; cannot check that root connects from $HOST" \
            "without a password"
        return 0
    fi
    mariadb_root_connects && return 0
    log "root cannot connect from $HOST without a password; allowing it (over the unix socket)"
    # Only accounts without a password are touched: a password someone set is never replaced.
    mariadb_sql "CREATE USER IF NOT EXISTS 'root'@'$HOST' IDENTIFIED BY '';
        GRANT ALL PRIVILEGES ON *.* TO 'root'@'$HOST' WITH GRANT OPTION;" ||
        die "could not reach MariaDB as root over its unix socket to allow root@$HOST"
    mariadb_root_connects && return 0
    # Without skip-name-resolve (Debian's default) the server knows 127.0.0.1 as 'localhost',
    # and root@localhost, which accepts only the unix socket, is the account that answers.
    local localhost_password
    localhost_password=$(mariadb_sql "SELECT authentication_string FROM mysql.user
        WHERE user = 'root' AND host = 'localhost'") ||
        die "could not read root@localhost over the unix socket"
    if [[ $localhost_password == "" || $localhost_password == invalid ]]; then
        log "letting root@localhost in without a password as well (the unix socket still works)"
        mariadb_sql "ALTER USER 'root'@'localhost'
            IDENTIFIED VIA unix_socket OR mysql_native_password USING PASSWORD('');" ||
            die "could not change root@localhost over the unix socket"
    fi
    mariadb_root_connects ||
        die "root still cannot connect from $HOST without a password: root@$HOST or" \
            "root@localhost has a password; remove it, or point LADDER_MYSQL_URL at an" \
            "account that works"
}

source "$ROOT/scripts/infra_management.sh" # the broker's management UI, in `ensure`

# --- stopping what ensure started ---

stop_redis() {
    log "stopping redis-server on $HOST:${PORT[redis]}"
    redis-cli -h "$HOST" -p "${PORT[redis]}" shutdown nosave >/dev/null 2>&1 || true
}

stop_rabbitmq() {
    log "stopping rabbitmq-server"
    as_root rabbitmqctl shutdown >&2 || true
    # The Erlang port mapper the node brought up, unless another Erlang node still uses it.
    if command -v epmd >/dev/null 2>&1 && ! epmd -names 2>/dev/null | grep -q '^name '; then
        epmd -kill >/dev/null 2>&1 || true
    fi
}

stop_mariadb() {
    log "stopping mariadbd"
    as_root mysqladmin "${MYSQL_SOCKET_ARGS[@]}" shutdown >&2 ||
        as_root start-stop-daemon --stop --oknodo --retry TERM/60/KILL/5 \
            --exec "$(command -v mariadbd)" >&2
}

# --- the run dir: what we started, one run at a time ---

lock_run_dir() {
    mkdir -p "$RUN_DIR"
    exec 9>"$RUN_DIR/infra.lock"
    flock -w 600 9 || die "another scripts/infra.sh holds $RUN_DIR/infra.lock"
}

started_by_us() { [[ -f $STARTED_FILE ]] && grep -qx "$1" "$STARTED_FILE"; }

record_started() { started_by_us "$1" || printf '%s\n' "$1" >>"$STARTED_FILE"; }

# --- commands ---

ensure() {
    lock_run_dir
    local name
    for name in "${SERVERS[@]}"; do
        if answers "$name"; then
            log "$name answers on $HOST:${PORT[$name]}"
            [[ $name != redis ]] || started_by_us redis || check_redis_persistence
            continue
        fi
        if port_open "${PORT[$name]}"; then
            # Something holds the port: a server still starting (loading its data), most
            # likely. Starting a second one would fail; give the first its time instead.
            log "$HOST:${PORT[$name]} is open but $name does not answer yet; waiting"
            wait_until "${WAIT[$name]}" answers "$name" ||
                die "$HOST:${PORT[$name]} is taken by something that does not answer as $name"
            log "$name answers on $HOST:${PORT[$name]}"
            continue
        fi
        # Not called as `a || b`: set -e does not reach into a function run in a condition.
        if ! installed "$name"; then
            install "$name"
        fi
        # A package's install scripts may have started it already.
        if ! answers "$name"; then
            "start_$name"
        fi
        record_started "$name"
        log "$name started; answers on $HOST:${PORT[$name]}"
    done
    ensure_mariadb_root
    ensure_rabbitmq_management
}

status() {
    local name state note rc=0
    for name in "${SERVERS[@]}"; do
        if answers "$name"; then
            state=up
        else
            state=down
            rc=1
        fi
        note=""
        started_by_us "$name" && note=" (started by scripts/infra.sh)"
        printf '%-9s %s:%-5s %s%s\n' "$name" "$HOST" "${PORT[$name]}" "$state" "$note"
    done
    return "$rc"
}

stop_started() {
    lock_run_dir
    if [[ ! -f $STARTED_FILE ]]; then
        log "nothing to stop: scripts/infra.sh started no server ($STARTED_FILE is absent)"
        return 0
    fi
    local started=() name i
    mapfile -t started <"$STARTED_FILE"
    for ((i = ${#started[@]} - 1; i >= 0; i--)); do
        name=${started[i]}
        case $name in
        redis | rabbitmq | mariadb) ;;
        "") continue ;;
        *)
            log "warning: ignoring unknown server '$name' in $STARTED_FILE"
            continue
            ;;
        esac
        if ! answers "$name"; then
            log "$name no longer answers; nothing to stop"
            continue
        fi
        "stop_$name"
        wait_until "${WAIT[$name]}" fails answers "$name" ||
            die "$name still answers on $HOST:${PORT[$name]} after ${WAIT[$name]} s"
        log "$name stopped"
    done
    rm -f "$STARTED_FILE"
}

usage() { sed -n '2,16s/^# \{0,1\}//p' "${BASH_SOURCE[0]}"; }

main() {
    case ${1:-} in
    ensure) ensure ;;
    status) status ;;
    stop-started) stop_started ;;
    -h | --help | help) usage ;;
    *)
        usage >&2
        exit 2
        ;;
    esac
}

# Sourcing the script (to try one function) defines everything and runs nothing.
if [[ ${BASH_SOURCE[0]} == "$0" ]]; then
    main "$@"
fi
