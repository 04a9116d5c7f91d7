#!/usr/bin/env bash
# Builds the simulated GPU box image: Debian bookworm with systemd as PID 1, imported into podman.
# No registry is reachable, so the rootfs comes from Debian's archive through mmdebstrap.
# Cached: the rootfs tar lives under the cache dir and the image is skipped when it already exists.
# The boxes are reached over SSH like a real fleet's: the image's host key is pinned in the
# controller's known_hosts for the sim (every box of the image has that key).
set -euo pipefail

image="${SPECFLEET_SIM_IMAGE:-localhost/specfleet-simbox:bookworm}"
cache_dir="${SPECFLEET_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/specfleet}"
# Bump when the package list or hooks below change, so a stale cached rootfs is not reused.
recipe_version=3
tar="$cache_dir/simbox-bookworm-v$recipe_version.tar"
known_hosts="$cache_dir/ssh/known_hosts"

pin_host_key() {
  mkdir -p "$(dirname "$known_hosts")"
  printf 'specfleet-simbox %s\n' "$(podman run --rm --entrypoint cat "$image" /etc/ssh/ssh_host_ed25519_key.pub | cut -d' ' -f1-2)" >"$known_hosts"
}

if podman image exists "$image" && [ "$(podman image inspect --format '{{index .Labels "specfleet.recipe"}}' "$image")" = "$recipe_version" ]; then
  echo "sim image $image: present (recipe v$recipe_version)"
  [ -s "$known_hosts" ] || pin_host_key
  exit 0
fi

mkdir -p "$cache_dir"
if [ ! -s "$tar" ]; then
  echo "sim image: building the Debian rootfs with mmdebstrap (about 30 s)..."
  mirror=$(sed -n 's/^URIs: *//p' /etc/apt/sources.list.d/debian.sources 2>/dev/null | head -n1)
  # apt lists stay in: a real box has them, and apt's cache_valid_time logic relies on them.
  mmdebstrap --quiet --format=tar --variant=minbase --skip=cleanup/apt/lists \
    --include=systemd,systemd-sysv,dbus,python3,python3-apt,sudo,iproute2,procps,ca-certificates,openssh-server \
    --customize-hook='truncate -s 0 "$1/etc/machine-id"' \
    --customize-hook='printf "deb http://deb.debian.org/debian bookworm main\ndeb http://deb.debian.org/debian bookworm-updates main\ndeb http://deb.debian.org/debian-security bookworm-security main\n" > "$1/etc/apt/sources.list"' \
    bookworm "$tar.partial" "${mirror:-http://deb.debian.org/debian}"
  mv "$tar.partial" "$tar"
fi

echo "sim image: importing $image"
podman import --quiet \
  --change 'CMD ["/sbin/init"]' --change 'STOPSIGNAL SIGRTMIN+3' \
  --change "LABEL specfleet.recipe=$recipe_version" \
  "$tar" "$image" >/dev/null
pin_host_key
echo "sim image $image: built"
