#!/usr/bin/env bash
# Images for deploy/compose.yml built on this machine from Debian packages, for where no
# registry answers (scripts/containers.sh decides; see docs/operations.md, "Containers").
#
#   scripts/local_images.sh build [NAME...]   build those missing or out of date (default: all)
#   scripts/local_images.sh tag NAME          print the image's tag
#   scripts/local_images.sh remove            remove the images and the cached Debian root
#
# NAME is python, redis, rabbitmq or mariadb. Each image is one layer (`docker import` of a
# Debian bookworm root made by debootstrap, plus the packages), since the engine's storage copies
# every layer whole. Each behaves as the official image does for what compose.yml relies on:
# its entrypoint, environment variables, health command and data volume (deploy/local-images/).
# Each trusts the host's CA bundle (TLS may go through a proxy that signs with its own CA).
# The tags are local (ladder-local/...), never an official image's name. An image is rebuilt
# when its recipe (this script, deploy/local-images/, the CA bundle) has changed.
#
# Needs root (debootstrap, chroot), a running engine (DOCKER_HOST), and the Debian mirror that
# apt uses here (LADDER_DEBIAN_MIRROR overrides it). LADDER_DOCKER_DIR (/var/lib/ladder-docker)
# holds the cached Debian root.

set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
SELF="$ROOT/scripts/local_images.sh"
FILES="$ROOT/deploy/local-images"
STATE="${LADDER_DOCKER_DIR:-/var/lib/ladder-docker}"
BASE="$STATE/rootfs/bookworm"
SUITE=bookworm
CA_BUNDLE=/etc/ssl/certs/ca-certificates.crt

NAMES=(python redis rabbitmq mariadb)
declare -A TAG=(
    [python]=ladder-local/python:3.11
    [redis]=ladder-local/redis:7
    [rabbitmq]=ladder-local/rabbitmq:3-management
    [mariadb]=ladder-local/mariadb:10.11
)
declare -A PACKAGES=(
    [python]="python3 python3-venv"
    [redis]="redis-server"
    [rabbitmq]="rabbitmq-server openssl"
    [mariadb]="mariadb-server mariadb-client"
)

SCRIPT_NAME=local-images
source "$ROOT/scripts/common.sh" # log, die, as_root

known() { [[ -v TAG[$1] ]] || die "unknown image '$1' (one of: ${NAMES[*]})"; }

mirror() {
    if [[ -n ${LADDER_DEBIAN_MIRROR:-} ]]; then
        printf '%s\n' "$LADDER_DEBIAN_MIRROR"
        return
    fi
    # The first Debian archive apt is configured with (deb822 sources, then one-line ones).
    local found
    found=$(cat /etc/apt/sources.list.d/*.sources 2>/dev/null |
        awk '/^URIs:/ && $2 ~ /\/debian\/?$/ {print $2; exit}')
    if [[ -z $found ]]; then
        found=$(cat /etc/apt/sources.list /etc/apt/sources.list.d/*.list 2>/dev/null |
            awk '$1 == "deb" && $0 !~ /security/ {for (i = 2; i <= NF; i++)
                if ($i ~ /^https?:/) {print $i; exit}}')
    fi
    printf '%s\n' "${found:-http://deb.debian.org/debian}"
}

recipe() { # NAME: what the image is made from, hashed; a change rebuilds it
    {
        printf '%s %s %s\n' "$1" "${PACKAGES[$1]}" "$SUITE"
        cat "$SELF" "$FILES"/* "$CA_BUNDLE"
    } | sha256sum | cut -c1-16
}

current() { # NAME: the image exists and was built from today's recipe
    local label
    label=$(docker image inspect -f '{{index .Config.Labels "ladder.recipe"}}' "${TAG[$1]}" \
        2>/dev/null) || return 1
    [[ $label == "$(recipe "$1")" ]]
}

base_rootfs() {
    [[ -x $BASE/usr/bin/apt-get ]] && return 0
    command -v debootstrap >/dev/null || die "debootstrap is not installed"
    local url
    url=$(mirror)
    log "debootstrap $SUITE from $url into $BASE (about a minute)"
    rm -rf "$BASE.partial"
    mkdir -p "$(dirname "$BASE")"
    debootstrap --variant=minbase --include=ca-certificates "$SUITE" "$BASE.partial" "$url" \
        >"$STATE/debootstrap.log" 2>&1 || die "debootstrap failed; see $STATE/debootstrap.log"
    mv "$BASE.partial" "$BASE"
}

# --- what each image adds to its root (run with the root as the working directory) ---

setup_python() {
    chroot . python3 -m venv /opt/python
    CHANGES+=(
        "ENV PATH=/opt/python/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
        "ENV PIP_CERT=$CA_BUNDLE"
        "CMD [\"python\"]"
    )
}

setup_redis() {
    mkdir -p data
    chroot . chown redis:redis /data
    install -m 0755 "$FILES/redis-entrypoint.sh" usr/local/bin/docker-entrypoint.sh
    CHANGES+=("VOLUME /data" "WORKDIR /data" "EXPOSE 6379"
        'ENTRYPOINT ["docker-entrypoint.sh"]' 'CMD ["redis-server"]')
}

setup_rabbitmq() {
    rm -rf var/lib/rabbitmq/mnesia
    printf '[rabbitmq_management].\n' >etc/rabbitmq/enabled_plugins
    chroot . chown -R rabbitmq:rabbitmq /etc/rabbitmq /var/lib/rabbitmq
    install -m 0755 "$FILES/rabbitmq-entrypoint.sh" usr/local/bin/docker-entrypoint.sh
    CHANGES+=("ENV RABBITMQ_LOGS=-" "VOLUME /var/lib/rabbitmq" "EXPOSE 5672 15672"
        'ENTRYPOINT ["docker-entrypoint.sh"]' 'CMD ["rabbitmq-server"]')
}

setup_mariadb() {
    # Debian's install made a data directory; the entrypoint makes the image's own, with the
    # users the environment asks for.
    rm -rf var/lib/mysql
    mkdir -p var/lib/mysql run/mysqld
    chroot . chown mysql:mysql /var/lib/mysql /run/mysqld
    install -m 0644 "$FILES/mariadb.cnf" etc/mysql/mariadb.conf.d/99-ladder-local.cnf
    install -m 0755 "$FILES/mariadb-entrypoint.sh" usr/local/bin/docker-entrypoint.sh
    install -m 0755 "$FILES/mariadb-healthcheck.sh" usr/local/bin/healthcheck.sh
    CHANGES+=("VOLUME /var/lib/mysql" "EXPOSE 3306"
        'ENTRYPOINT ["docker-entrypoint.sh"]' 'CMD ["mariadbd"]')
}

build_one() { # NAME
    local name=$1 work
    work=$(mktemp -d "$STATE/rootfs/$name.XXXXXX")
    # shellcheck disable=SC2064  # the path is fixed now
    trap "rm -rf '$work'" EXIT
    cp -a "$BASE/." "$work/"
    cd "$work"
    # Packages' install scripts start no server in a root that is being built.
    printf '#!/bin/sh\nexit 101\n' >usr/sbin/policy-rc.d
    chmod 0755 usr/sbin/policy-rc.d
    # shellcheck disable=SC2086  # a list of package names
    chroot . env DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends \
        ${PACKAGES[$name]}
    CHANGES=("ENV LANG=C.UTF-8" "ENV SSL_CERT_FILE=$CA_BUNDLE"
        "LABEL ladder.recipe=$(recipe "$name")")
    "setup_$name"
    chroot . apt-get clean
    rm -rf usr/sbin/policy-rc.d var/lib/apt/lists/* var/cache/apt/* var/log/apt/* \
        usr/share/doc/* usr/share/man/* usr/share/info/* tmp/* root/.cache
    install -m 0644 "$CA_BUNDLE" "etc/ssl/certs/ca-certificates.crt"
    local args=() change
    for change in "${CHANGES[@]}"; do
        args+=(--change "$change")
    done
    tar --numeric-owner -C . -c . | docker import "${args[@]}" - "${TAG[$name]}" >/dev/null
}

build() {
    local names=("$@") name todo=() pids=() failed=()
    ((${#names[@]})) || names=("${NAMES[@]}")
    for name in "${names[@]}"; do
        known "$name"
        current "$name" || todo+=("$name")
    done
    ((${#todo[@]})) || return 0
    [[ $EUID -eq 0 ]] || die "building images needs root (debootstrap, chroot)"
    [[ -r $CA_BUNDLE ]] || die "no CA bundle at $CA_BUNDLE"
    base_rootfs
    # Apt's lists as debootstrap left them serve every image; refresh them once.
    chroot "$BASE" apt-get update -q >"$STATE/apt-update.log" 2>&1 ||
        die "apt-get update in $BASE failed; see $STATE/apt-update.log"
    for name in "${todo[@]}"; do
        log "building ${TAG[$name]} (Debian: ${PACKAGES[$name]}); log: $STATE/$name.log"
        (build_one "$name") >"$STATE/$name.log" 2>&1 &
        pids+=($!)
    done
    for i in "${!todo[@]}"; do
        wait "${pids[i]}" || failed+=("${todo[i]}")
    done
    for name in "${failed[@]}"; do
        tail -n 20 "$STATE/$name.log" >&2
    done
    ((${#failed[@]} == 0)) || die "could not build: ${failed[*]} (logs in $STATE)"
    log "built: ${todo[*]}"
}

remove() {
    local name
    for name in "${NAMES[@]}"; do
        docker image rm "${TAG[$name]}" >/dev/null 2>&1 || true
    done
    rm -rf "$STATE/rootfs"
}

case ${1:-} in
build)
    shift
    build "$@"
    ;;
tag)
    known "${2:-}"
    printf '%s\n' "${TAG[$2]}"
    ;;
remove) remove ;;
*)
    sed -n '2,9s/^# \{0,1\}//p' "${BASH_SOURCE[0]}" >&2
    exit 2
    ;;
esac
