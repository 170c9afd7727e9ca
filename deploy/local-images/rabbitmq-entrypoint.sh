#!/bin/sh
# ladder-local/rabbitmq: the entrypoint, doing what the official rabbitmq image's does for
# deploy/compose.yml: `rabbitmq-server` runs in the foreground as the rabbitmq user, logging to
# the console, with its data in /var/lib/rabbitmq (the volume, made the rabbitmq user's
# first); anything else runs as it is.
set -eu

if [ "${1:-}" = rabbitmq-server ] && [ "$(id -u)" = 0 ]; then
    find /var/lib/rabbitmq \! -user rabbitmq -exec chown rabbitmq:rabbitmq '{}' +
    shift
    # Debian's /usr/sbin/rabbitmq-server would stay as a parent (su) of the broker; the broker's
    # own start script, run as the user, replaces itself with the Erlang VM and gets the signals.
    exec setpriv --reuid=rabbitmq --regid=rabbitmq --init-groups \
        env HOME=/var/lib/rabbitmq /usr/lib/rabbitmq/bin/rabbitmq-server "$@"
fi
exec "$@"
