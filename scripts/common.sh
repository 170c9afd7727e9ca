# What the shell scripts share (sourced, after they set SCRIPT_NAME): messages on stderr named
# after the script, a fatal error, and a command run as root (directly, or through sudo).

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
