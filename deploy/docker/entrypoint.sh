#!/bin/sh
# The image's entrypoint: `<service> [args…]` runs `python -P -m gpuyard.services.<service> [args…]`;
# any other command (sh, python, gpuyard…) runs as given.
set -eu
if [ "$#" -eq 0 ]; then
    echo "usage: <submit|scheduler|executor|serving|monitor> [args…], or any command" >&2
    exit 64
fi
service="$1"
case "$service" in
    submit | scheduler | executor | serving | monitor)
        shift
        exec python -P -m "gpuyard.services.$service" "$@"
        ;;
    *)
        exec "$@"
        ;;
esac
