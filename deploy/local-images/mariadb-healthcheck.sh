#!/bin/bash
# ladder-local/mariadb: healthcheck.sh, with the checks of the official image's that
# deploy/compose.yml uses, as its `healthcheck` user (created by the entrypoint):
#   --connect             the server accepts a TCP connection
#   --innodb_initialized  InnoDB has finished starting (crash recovery included)
# Exit 0 only when every check given passes.
set -euo pipefail

CNF=/var/lib/mysql/.my-healthcheck.cnf
[[ -r $CNF ]] || {
    echo "healthcheck.sh: $CNF is missing: the server is not initialised yet" >&2
    exit 1
}
(($# > 0)) || set -- --connect

query() { mariadb --defaults-extra-file="$CNF" "$@" --batch --skip-column-names; }

for check in "$@"; do
    case $check in
    --connect)
        query --protocol=tcp -h127.0.0.1 -e 'SELECT 1' >/dev/null
        ;;
    --innodb_initialized)
        [[ $(query -e "SELECT 1 FROM information_schema.ENGINES WHERE engine = 'InnoDB'
            AND support IN ('YES', 'DEFAULT', 'ENABLED')") == 1 ]]
        ;;
    *)
        echo "healthcheck.sh: unknown check $check (--connect, --innodb_initialized)" >&2
        exit 2
        ;;
    esac
done
