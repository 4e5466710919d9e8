#!/bin/sh
# Entrypoint of the aiops and ray-head services of docker-compose.yml: exports the OpenAI
# endpoints' API key, which `aiops credentials init` (the one-shot `init` service) generated
# into the shared data volume, as AIOPS_API_KEYS, then runs the command. ray-head's Serve
# ingress requires it on every OpenAI request; the aiops server's agent sends it to that
# endpoint. An AIOPS_API_KEYS already set (your own keys) wins.
set -eu
key_file="${AIOPS_DATA_DIR:-/data}/credentials/openai-api.key"
if [ -z "${AIOPS_API_KEYS:-}" ]; then
    if [ ! -s "$key_file" ]; then
        echo "no API key in $key_file: run 'aiops credentials init' (compose: the init service)" >&2
        exit 78
    fi
    AIOPS_API_KEYS="$(cat "$key_file")"
    export AIOPS_API_KEYS
fi
exec "$@"
