#!/usr/bin/env bash
# The RabbitMQ container's entrypoint (deploy/compose.yml): writes the broker's definitions,
# then starts the broker exactly as the image would.
#
# definitions.json beside this script is a template: users, permissions and the Ladder
# topology, with each password_hash written as "${VARIABLE}". Each placeholder becomes the
# salted SHA-256 hash of that variable (RabbitMQ's rabbit_password_hashing_sha256:
# base64(salt + sha256(salt + password)), a 4-byte random salt), so plain passwords never reach
# a file. The result goes to /etc/rabbitmq/definitions.json, which rabbitmq.conf loads at
# every boot, before the broker opens its listeners: the users exist before anyone can
# connect, and a changed password takes effect at the next start of the container. The
# password variables are removed from the environment before the broker starts.
#
# LADDER_DEFINITIONS_TEMPLATE and LADDER_DEFINITIONS_OUT move the files (tests).

set -euo pipefail

TEMPLATE=${LADDER_DEFINITIONS_TEMPLATE:-/etc/ladder/rabbitmq/definitions.json}
OUT=${LADDER_DEFINITIONS_OUT:-/etc/rabbitmq/definitions.json}

die() {
    printf 'rabbitmq entrypoint: %s\n' "$*" >&2
    exit 1
}

hash_password() {
    local dir
    dir=$(mktemp -d)
    head -c 4 /dev/urandom >"$dir/salt"
    # printf is a builtin: the password never appears in a process's arguments.
    { cat "$dir/salt"; printf '%s' "$1"; } | openssl dgst -sha256 -binary >"$dir/digest"
    cat "$dir/salt" "$dir/digest" | base64 | tr -d '\n'
    rm -rf "$dir"
}

[[ -r $TEMPLATE ]] || die "no definitions template at $TEMPLATE"
command -v openssl >/dev/null || die "openssl is needed to hash the passwords"

text=$(<"$TEMPLATE")
# shellcheck disable=SC2016  # the placeholders are literally ${NAME}
mapfile -t names < <(grep -o '"\${[A-Z][A-Z0-9_]*}"' "$TEMPLATE" | tr -d '"${}' | sort -u)
((${#names[@]} > 0)) || die "$TEMPLATE has no password placeholders"
for name in "${names[@]}"; do
    value=${!name:-}
    [[ -n $value ]] || die "$name is not set: every broker user needs a password"
    text=${text//"\"\${$name}\""/"\"$(hash_password "$value")\""}
done
# shellcheck disable=SC2016
[[ $text != *'"${'* ]] || die "a placeholder in $TEMPLATE was left unreplaced"

# Only the broker's user may read the hashes; the file is replaced whole, never half written.
tmp=$(mktemp "$(dirname "$OUT")/.definitions.XXXXXX")
printf '%s\n' "$text" >"$tmp"
chmod 0600 "$tmp"
if [[ $(id -u) == 0 ]] && id rabbitmq >/dev/null 2>&1; then
    chown rabbitmq:rabbitmq "$tmp"
fi
mv -f "$tmp" "$OUT"

unset "${names[@]}" value text
exec docker-entrypoint.sh "$@"
