#!/bin/bash
# ladder-local/mariadb: the entrypoint, doing what the official mariadb image's does for
# deploy/compose.yml. On an empty /var/lib/mysql (the volume) it initialises the server from
#   MARIADB_ROOT_PASSWORD   root's password (required)
#   MARIADB_ROOT_HOST       where root may log in from besides localhost ('%' if unset)
#   MARIADB_DATABASE        a database to create
#   MARIADB_USER, MARIADB_PASSWORD   a user with every privilege on that database
# and a `healthcheck` user for healthcheck.sh (its password in /var/lib/mysql/
# .my-healthcheck.cnf), on a server that listens on no network meanwhile. Then `mariadbd`
# runs as the mysql user; anything else runs as it is. The MYSQL_* names are read too.
set -euo pipefail

DATADIR=/var/lib/mysql
SOCKET=/run/mysqld/mysqld.sock

log() { printf '%s [Note] [Entrypoint]: %s\n' "$(date -u '+%F %T')" "$*"; }
die() {
    printf '%s [ERROR] [Entrypoint]: %s\n' "$(date -u '+%F %T')" "$*" >&2
    exit 1
}

setting() { # NAME: MARIADB_NAME, else MYSQL_NAME, else empty
    local mariadb="MARIADB_$1" mysql="MYSQL_$1"
    printf '%s' "${!mariadb:-${!mysql:-}}"
}

sql_string() { # a value as a quoted SQL string literal
    local value=${1//\\/\\\\}
    printf "'%s'" "${value//\'/\\\'}"
}

sql_name() { printf '`%s`' "${1//\`/\`\`}"; }

init_sql() {
    local root_password root_host database user password health
    root_password=$(setting ROOT_PASSWORD)
    root_host=$(setting ROOT_HOST)
    database=$(setting DATABASE)
    user=$(setting USER)
    password=$(setting PASSWORD)
    [[ -n $root_password ]] || die "MARIADB_ROOT_PASSWORD is not set: the server needs a root password"
    [[ -z $user || -n $password ]] || die "MARIADB_USER is set but MARIADB_PASSWORD is not"
    [[ $user != root ]] || die "MARIADB_USER must not be root"
    health=$(head -c 24 /dev/urandom | base64 | tr -dc 'A-Za-z0-9')
    printf '[mariadb-client]\nport=3306\nsocket=%s\nuser=healthcheck\npassword=%s\n' \
        "$SOCKET" "$health" >"$DATADIR/.my-healthcheck.cnf"
    chmod 0600 "$DATADIR/.my-healthcheck.cnf"
    printf 'SET @@SESSION.SQL_LOG_BIN=0;\n'
    printf 'DELETE FROM mysql.global_priv WHERE user = %s OR (user = %s AND host NOT IN (%s));\n' \
        "''" "'root'" "'localhost'"
    printf 'FLUSH PRIVILEGES;\n'
    printf 'ALTER USER root@localhost IDENTIFIED BY %s;\n' "$(sql_string "$root_password")"
    root_host=${root_host:-%}
    if [[ $root_host != localhost ]]; then
        printf 'CREATE USER root@%s IDENTIFIED BY %s;\n' "$(sql_string "$root_host")" \
            "$(sql_string "$root_password")"
        printf 'GRANT ALL ON *.* TO root@%s WITH GRANT OPTION;\n' "$(sql_string "$root_host")"
    fi
    local host
    for host in localhost 127.0.0.1 ::1; do
        printf 'CREATE USER healthcheck@%s IDENTIFIED BY %s;\n' "$(sql_string "$host")" \
            "$(sql_string "$health")"
        printf 'GRANT USAGE ON *.* TO healthcheck@%s;\n' "$(sql_string "$host")"
    done
    if [[ -n $database ]]; then
        printf 'CREATE DATABASE IF NOT EXISTS %s;\n' "$(sql_name "$database")"
    fi
    if [[ -n $user ]]; then
        printf "CREATE USER %s@'%%' IDENTIFIED BY %s;\n" "$(sql_string "$user")" \
            "$(sql_string "$password")"
        if [[ -n $database ]]; then
            printf "GRANT ALL ON %s.* TO %s@'%%';\n" "$(sql_name "$database")" \
                "$(sql_string "$user")"
        fi
    fi
}

initialise() {
    log "initialising the database directory $DATADIR"
    mariadb-install-db --user=mysql --datadir="$DATADIR" --skip-test-db \
        --auth-root-authentication-method=normal --skip-name-resolve >/dev/null
    log "starting a temporary server (no network) to create the users"
    setpriv --reuid=mysql --regid=mysql --init-groups \
        mariadbd --skip-networking --socket="$SOCKET" --datadir="$DATADIR" &
    local pid=$! tries
    for tries in $(seq 1 60); do
        mariadb-admin --socket="$SOCKET" -uroot ping >/dev/null 2>&1 && break
        kill -0 "$pid" 2>/dev/null || die "the temporary server exited"
        sleep 1
    done
    ((tries < 60)) || die "the temporary server did not answer in 60 s"
    init_sql | mariadb --socket="$SOCKET" -uroot --batch || die "creating the users failed"
    mariadb-admin --socket="$SOCKET" -uroot shutdown 2>/dev/null || kill "$pid"
    wait "$pid" || true
    log "initialised; starting the server"
}

if [[ ${1:-} == -* ]]; then
    set -- mariadbd "$@"
fi

if [[ ${1:-} == mariadbd || ${1:-} == mysqld ]] && [[ $(id -u) == 0 ]]; then
    mkdir -p /run/mysqld
    chown mysql:mysql /run/mysqld
    find "$DATADIR" \! -user mysql -exec chown mysql:mysql '{}' +
    if [[ ! -d $DATADIR/mysql ]]; then
        initialise
    fi
    exec setpriv --reuid=mysql --regid=mysql --init-groups "$@"
fi
exec "$@"
