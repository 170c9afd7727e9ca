# What the shell scripts share (sourced, after they set SCRIPT_NAME): messages on stderr named
# after the script, a fatal error, a command run as root (directly, or through sudo), and a
# wait for a command to succeed.

log() { printf '%s: %s\n' "$SCRIPT_NAME" "$*" >&2; }

die() {
    log "error: $*"
    exit 1
}

as_root() {
    if [[ $EUID -eq 0 ]]; then
        "$@"
    elif command -v sudo >/dev/null 2>&1; then
        sudo -n -- "$@"
    else
        die "root is needed for '$*': run as root, or install sudo"
    fi
}

wait_until() { # seconds command...: until the command succeeds (1 if it has not by then)
    local deadline=$((SECONDS + $1))
    shift
    until "$@"; do
        ((SECONDS < deadline)) || return 1
        sleep 1
    done
}
