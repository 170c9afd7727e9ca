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

# Whether the management UI's port is open on every interface (ss(8) says; without ss, taken
# to be: moving it again is harmless).
management_on_every_interface() {
    command -v ss >/dev/null 2>&1 || return 0
    ss -Hltn "sport = :$MANAGEMENT_PORT" 2>/dev/null | awk '{print $4}' |
        grep -qE '^(0\.0\.0\.0|\[::\]|\*):'
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
# Whether this user can run RabbitMQ's tools as root against the local node: not where the
# tools are not installed (a broker in a container), nor without root or password-free sudo.
management_tools() {
    command -v rabbitmqctl >/dev/null 2>&1 && command -v rabbitmq-plugins >/dev/null 2>&1 &&
        { [[ $EUID -eq 0 ]] || sudo -n true 2>/dev/null; } &&
        as_root rabbitmqctl -q status >/dev/null 2>&1
}

ensure_rabbitmq_management() {
    local password env
    if ! management_tools; then
        # The broker works without its UI: Ladder runs, and says what it could not set up.
        if management_answers; then
            log "a management UI answers on http://$HOST:$MANAGEMENT_PORT (not set up here:" \
                "no rabbitmqctl run as root; its user $MONITOR_USER is as it was made)"
        else
            log "warning: the management UI is not set up (it needs rabbitmqctl and" \
                "rabbitmq-plugins run as root, or with password-free sudo); Ladder runs without it"
        fi
        return 0
    fi
    password=$(ladder_setting LADDER_BROKER_MONITOR_PASSWORD)
    env=$(ladder_setting LADDER_ENV)
    # As the services refuse their development secrets in prod, so does the monitor user.
    if [[ ${env:-dev} == prod && (-z $password || $password == dev-monitor) ]]; then
        die "LADDER_ENV=prod: set LADDER_BROKER_MONITOR_PASSWORD (not the development" \
            "password dev-monitor) for the management UI's user $MONITOR_USER"
    fi
    password=${password:-dev-monitor}
    # Enabled in the plugins file is not always running: a file written while the node could
    # not be told (or by another node's tools) lists the plugin while its UI is not up. Enabling
    # again is harmless and starts it on the node.
    if ! as_root rabbitmq-plugins list --enabled --minimal 2>/dev/null |
        grep -qx rabbitmq_management || ! management_answers; then
        log "enabling the RabbitMQ management plugin (UI on $HOST:$MANAGEMENT_PORT)"
        as_root rabbitmq-plugins enable rabbitmq_management >/dev/null ||
            die "rabbitmq-plugins enable rabbitmq_management failed"
    fi
    # On loopback only, as the broker's AMQP listener is: the plugin listens on every interface
    # unless its configuration says otherwise. Its listener is set and started again at once,
    # for as long as the broker runs (the next `make up` does it again after a restart).
    wait_until 30 management_answers || true
    if management_on_every_interface; then
        log "moving the management UI onto $HOST:$MANAGEMENT_PORT (it listened on every interface)"
        as_root rabbitmqctl -q eval "application:set_env(rabbitmq_management, tcp_config, \
[{ip, \"$HOST\"}, {port, $MANAGEMENT_PORT}]), rabbit_mgmt_app:reset_dispatcher([])." \
            >/dev/null ||
            log "warning: the management UI could not be moved; it listens on every interface" \
                "(set management.tcp.ip = $HOST in the broker's rabbitmq.conf)"
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

