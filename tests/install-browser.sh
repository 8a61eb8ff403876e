#!/bin/sh
# The browser test's Debian packages: chromium and its chromedriver (selenium drives them; nothing is downloaded
# by selenium itself). Installs only what is missing; the README's test command and .ci/run call this first.
set -e
if command -v chromium >/dev/null 2>&1 && [ -x /usr/bin/chromedriver ]; then
  exit 0
fi
SUDO=""
[ "$(id -u)" -eq 0 ] || SUDO=sudo
$SUDO apt-get update -q
DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -q chromium chromium-driver
