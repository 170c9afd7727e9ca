#!/bin/sh
# ladder-local/redis: the entrypoint, doing what the official redis image's does for
# deploy/compose.yml: `redis-server ...` (or arguments starting with a dash) runs as the redis
# user, in /data (the volume, made the redis user's first); anything else runs as it is.
set -eu

case ${1:-redis-server} in
-*) set -- redis-server "$@" ;;
esac

if [ "${1:-}" = redis-server ] && [ "$(id -u)" = 0 ]; then
    find /data \! -user redis -exec chown redis:redis '{}' +
    exec setpriv --reuid=redis --regid=redis --init-groups "$@"
fi
exec "$@"
