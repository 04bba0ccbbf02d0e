#!/usr/bin/env bash
# Builds Jaeger v1.76.0 (all-in-one, v2) from the module proxy into a cache
# outside the repository, once; prints the binary's path. The build is slow
# (27 minutes measured on two cores, 4-10 on faster machines); later calls
# return at once. The binary has no web UI: for that, use Jaeger's release.
#
#   tools/jaeger/build.sh            # → /root/.cache/relay/jaeger-v1.76.0
#   RELAY_TOOLS_CACHE=/x tools/jaeger/build.sh
set -euo pipefail
cd "$(dirname "$0")"
cache="${RELAY_TOOLS_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/relay}"
bin="$cache/jaeger-v1.76.0"
if [ ! -x "$bin" ]; then
  mkdir -p "$cache"
  echo "building Jaeger v1.76.0 into $bin (slow: up to half an hour on two cores)" >&2
  go build -o "$bin.tmp" github.com/jaegertracing/jaeger/cmd/jaeger
  mv "$bin.tmp" "$bin"
fi
echo "$bin"
