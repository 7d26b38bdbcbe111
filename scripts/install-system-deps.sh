#!/usr/bin/env bash
# Debian packages the test suite needs: espeak-ng and sox make test speech; chromium runs the browser tests;
# postgresql is the shared call store's server (the tests start their own, tests/postgres_helpers.py);
# libspeexdsp1 is the echo canceller's library (voicepipe/echo/canceller.py), which the service needs too.
# Installs only what is missing.
set -euo pipefail
needed=()
command -v espeak-ng >/dev/null || needed+=(espeak-ng)
command -v sox >/dev/null || needed+=(sox)
command -v chromium >/dev/null || needed+=(chromium)
compgen -G "/usr/lib/postgresql/*/bin/initdb" >/dev/null || command -v initdb >/dev/null || needed+=(postgresql)
compgen -G "/usr/lib/*/libspeexdsp.so.1" >/dev/null || needed+=(libspeexdsp1)
[ ${#needed[@]} -eq 0 ] && exit 0
if [ "$(id -u)" -ne 0 ] && ! command -v sudo >/dev/null; then
  echo "error: missing ${needed[*]}; install them with your package manager (apt-get install ${needed[*]})." >&2
  exit 1
fi
SUDO=$([ "$(id -u)" -eq 0 ] && echo "" || echo sudo)
echo "installing ${needed[*]} with apt-get"
$SUDO apt-get update -qq
DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq "${needed[@]}" >/dev/null
