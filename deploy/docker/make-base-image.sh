#!/usr/bin/env bash
# Makes the Node 20 base image the Dockerfile builds from (NODE_IMAGE) out of Debian packages and this
# machine's own node and npm, for machines that cannot pull node:20-slim (no registry reachable):
#   deploy/docker/make-base-image.sh [TAG]                  TAG: ebb-base:node20 unless given
#   DOCKER_BUILDKIT=0 docker build --build-arg NODE_IMAGE=ebb-base:node20 -t ebb:0.1.0 .
# The root file system is debootstrap's minbase (dpkg, apt, coreutils, passwd for useradd) plus
# ca-certificates, of this machine's Debian release (SUITE=...) from the mirror apt uses (MIRROR=...);
# node goes where node:20-slim has it (/usr/local/bin/node), npm's package beside it. Needs root,
# debootstrap and a running Docker engine; `docker import` makes the image, nothing is pulled.
set -euo pipefail
tag=${1:-ebb-base:node20}

node=$(command -v node) || { echo "make-base-image: no node on the PATH" >&2; exit 1; }
major=$("$node" -p 'process.versions.node.split(".")[0]')
[ "$major" = 20 ] || { echo "make-base-image: node $("$node" --version) here; the image wants Node 20" >&2; exit 1; }
# npm's package directory: npm on the PATH is a link to its bin/npm-cli.js.
npm_dir=$(dirname "$(dirname "$(readlink -f "$(command -v npm)")")")
[ -f "$npm_dir/bin/npm-cli.js" ] || { echo "make-base-image: npm's package not found (from $(command -v npm))" >&2; exit 1; }

# Debian's mirror as apt's sources name it (deb822 "URIs:" or one-line "deb"), the security archive aside.
sources=$(cat /etc/apt/sources.list /etc/apt/sources.list.d/*.list /etc/apt/sources.list.d/*.sources 2>/dev/null || true)
mirror=${MIRROR:-$(sed -n -E '/security/d; s#^(URIs:[[:space:]]*|deb[[:space:]]+(\[[^]]*\][[:space:]]+)?)([^[:space:]]+/debian)/?([[:space:]].*)?$#\3#p' <<<"$sources" | sed -n 1p)}
mirror=${mirror:-http://deb.debian.org/debian}
# node's libc and libstdc++ are this machine's: the same release's packages run it.
suite=${SUITE:-$(. /etc/os-release && [ "${ID:-}" = debian ] && echo "${VERSION_CODENAME:-}" || true)}
suite=${suite:-bookworm}

root=$(mktemp -d)
trap 'rm -rf "$root"' EXIT
echo "make-base-image: debootstrap $suite from $mirror, node $("$node" --version), npm $(npm --version)"
debootstrap --variant=minbase --include=ca-certificates "$suite" "$root" "$mirror" >"$root.log" 2>&1 \
  || { tail -n 20 "$root.log" >&2; rm -f "$root.log"; exit 1; }
rm -f "$root.log"

install -m 755 "$node" "$root/usr/local/bin/node"
mkdir -p "$root/usr/local/lib/node_modules"
cp -a "$npm_dir" "$root/usr/local/lib/node_modules/npm"
ln -s ../lib/node_modules/npm/bin/npm-cli.js "$root/usr/local/bin/npm"
ln -s ../lib/node_modules/npm/bin/npx-cli.js "$root/usr/local/bin/npx"
# What an image does not need: apt's downloaded lists and packages, documentation.
rm -rf "$root"/var/lib/apt/lists/* "$root"/var/cache/apt/* "$root"/var/cache/debconf/*-old \
  "$root"/usr/share/doc/* "$root"/usr/share/man/* "$root"/usr/share/info/* "$root"/var/log/*

tar -C "$root" --numeric-owner -c . | docker import \
  --change 'ENV PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin' \
  --change 'CMD ["node"]' - "$tag" >/dev/null
docker run --rm "$tag" sh -c 'node --version && npm --version' >/dev/null \
  || { echo "make-base-image: $tag does not run node and npm" >&2; exit 1; }
echo "make-base-image: $tag ($(docker image inspect -f '{{.Size}}' "$tag" | awk '{ printf "%d MB", $1 / 1e6 }'))"
