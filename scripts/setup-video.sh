#!/usr/bin/env bash
# Installs what the `video` feature (LeRobot camera videos decoded at ingest) builds against, from
# Debian's packages: libdav1d-dev (AV1; found through pkg-config; dav1d-sys 0.7 takes libdav1d
# 1.0 to 1.2, bookworm has 1.0.0), pkg-config, and nasm (the assembly of OpenH264, which the
# `openh264` crate compiles from its bundled source; without nasm it builds without assembly).
# Does nothing when they are there. Prints the libdav1d version.
set -euo pipefail
need=()
command -v pkg-config >/dev/null || need+=(pkg-config)
pkg-config --exists 'dav1d >= 1.0.0' 2>/dev/null || need+=(libdav1d-dev)
command -v nasm >/dev/null || need+=(nasm)
if [ "${#need[@]}" -gt 0 ]; then
    sudo=""
    [ "$(id -u)" = 0 ] || sudo="sudo"
    echo "installing ${need[*]}" >&2
    $sudo apt-get update -q >&2
    DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -q --no-install-recommends "${need[@]}" >&2
fi
pkg-config --modversion dav1d
