#!/bin/sh
# Offline recipe for the forgehand sandbox image, by hand (what `forgehand sandbox build` does when
# it cannot pull debian:bookworm-slim): debootstrap from the Debian mirror into a temporary root,
# `docker import` it as the base, then Dockerfile.offline on top for the user and labels.
# Needs root, debootstrap and a Docker engine; reaches only the Debian mirror.
set -eu

VERSION=2
TAG=${1:-forgehand-sandbox:$VERSION}
BASE=forgehand-sandbox-base:bookworm-$VERSION
MIRROR=${DEBIAN_MIRROR:-http://deb.debian.org/debian}
CACHE=${XDG_CACHE_HOME:-$HOME/.cache}/forgehand/debootstrap
HERE=$(cd "$(dirname "$0")" && pwd)

work=$(mktemp -d /var/tmp/forgehand-rootfs-XXXXXX)
trap 'rm -rf "$work"' EXIT
mkdir -p "$CACHE"

debootstrap --variant=minbase \
  --include=bash,coreutils,git,python3,python3-pip,curl,ripgrep,ca-certificates \
  --cache-dir="$CACHE" bookworm "$work/root" "$MIRROR"

tar --numeric-owner -C "$work/root" \
  --exclude='./dev/*' --exclude='./proc/*' --exclude='./sys/*' \
  --exclude='./var/cache/apt/archives/*.deb' --exclude='./var/lib/apt/lists/*' \
  -cf "$work/rootfs.tar" .
docker import --change 'CMD ["/bin/bash"]' "$work/rootfs.tar" "$BASE"

docker build --network none --build-arg "BASE=$BASE" --build-arg "FORGEHAND_SANDBOX_VERSION=$VERSION" \
  --label "org.forgehand.sandbox.version=$VERSION" --label "org.forgehand.sandbox.recipe=offline" \
  -t "$TAG" -f "$HERE/Dockerfile.offline" "$HERE"
echo "built $TAG"
