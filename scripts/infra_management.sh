# RabbitMQ's management UI on the local broker, for scripts/infra.sh (sourced: it uses that
# script's HOST, log, die, as_root and wait_until). `ensure` calls ensure_rabbitmq_management
# once the broker answers. The UI answers on http://127.0.0.1:15672, with a read-only user of
# the `monitoring` tag, ladder-monitor, whose password is LADDER_BROKER_MONITOR_PASSWORD
# (dev-monitor by default; docs/operations.md).

MANAGEMENT_PORT=15672
MONITOR_USER=ladder-monitor

management_answers() {
    # shellcheck disable=SC2016  # expanded by the inner bash
    timeout 3 bash -c 'exec 3<>"/dev/tcp/$0/$1" && printf "GET /api/overview HTTP/1.0\r\n\r\n" >&3 &&
        head -c 12 <&3' "$HOST" "$MANAGEMENT_PORT" 2>/dev/null | grep -q '^HTTP/1\.[01] 401'
}

# A Ladder setting as the services read it: the environment first, then the checkout's .env
# (NAME=value lines; surrounding quotes dropped). Empty if neither has it.
ladder_setting() { # NAME
    local name=$1 value=${!1:-}
    if [[ -z $value && -f $ROOT/.env ]]; then
        value=$(sed -n "s/^[[:space:]]*${name}[[:space:]]*=[[:space:]]*//p" "$ROOT/.env" | tail -n 1)
        value=${value%\"}; value=${value#\"}; value=${value%\'}; value=${value#\'}
    fi
    printf '%s' "$value"
}

# Idempotent: enabling an enabled plugin, and setting the same password, tag and permissions
# again, change nothing. The password goes through standard input, never an argument.
ensure_rabbitmq_management() {
    local password env
    password=$(ladder_setting LADDER_BROKER_MONITOR_PASSWORD)
    env=$(ladder_setting LADDER_ENV)
    # As the services refuse their development secrets in prod, so does the monitor user.
    if [[ ${env:-dev} == prod && (-z $password || $password == dev-monitor) ]]; then
        die "LADDER_ENV=prod: set LADDER_BROKER_MONITOR_PASSWORD (not the development" \
            "password dev-monitor) for the management UI's user $MONITOR_USER"
    fi
    password=${password:-dev-monitor}
    if ! as_root rabbitmq-plugins list --enabled --minimal 2>/dev/null |
        grep -qx rabbitmq_management; then
        log "enabling the RabbitMQ management plugin (UI on $HOST:$MANAGEMENT_PORT)"
        as_root rabbitmq-plugins enable rabbitmq_management >/dev/null ||
            die "rabbitmq-plugins enable rabbitmq_management failed"
    fi
    if as_root rabbitmqctl -q list_users 2>/dev/null | awk '{print $1}' | grep -qx "$MONITOR_USER"; then
        printf '%s\n' "$password" | as_root rabbitmqctl -q change_password "$MONITOR_USER" \
            >/dev/null || die "could not set the password of $MONITOR_USER"
    else
        log "creating the read-only management user $MONITOR_USER (tag monitoring)"
        printf '%s\n' "$password" | as_root rabbitmqctl -q add_user "$MONITOR_USER" >/dev/null ||
            die "could not create $MONITOR_USER"
    fi
    as_root rabbitmqctl -q set_user_tags "$MONITOR_USER" monitoring >/dev/null
    # Permissions that match no name: the vhost's queues, exchanges and connections show in
    # the UI, and nothing can be declared, published or consumed (a read permission would let
    # the user drain a queue with basic.get).
    as_root rabbitmqctl -q set_permissions -p / "$MONITOR_USER" '^$' '^$' '^$' >/dev/null
    wait_until 30 management_answers ||
        die "the management UI does not answer on $HOST:$MANAGEMENT_PORT"
    log "management UI on http://$HOST:$MANAGEMENT_PORT (user $MONITOR_USER)"
}

