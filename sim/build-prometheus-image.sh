#!/usr/bin/env bash
# Builds the simulated Prometheus box image: the sim box image with Debian 12's own `prometheus`
# package (2.42) installed and its unit enabled, so Prometheus starts when a box of it boots.
# Built by running the base box with systemd, installing the package from Debian's archive (the
# only source reachable besides PyPI) and committing the stopped box.
# Cached: skipped when the image exists with this recipe's version and the base image it was made from.
set -euo pipefail
cd "$(dirname "$0")/.."

base="${SPECFLEET_SIM_IMAGE:-localhost/specfleet-simbox:bookworm}"
image="${SPECFLEET_PROMETHEUS_IMAGE:-localhost/specfleet-prometheus:bookworm}"
box=specfleet-prometheus-image
# Bump when the steps below change, so a stale image is not reused.
recipe_version=2

# The base image is idempotent to build: present, this is a one-line no-op.
SPECFLEET_SIM_IMAGE="$base" sim/build-image.sh >/dev/null
base_id=$(podman image inspect --format '{{.Id}}' "$base")

label() { podman image inspect --format "{{index .Labels \"$1\"}}" "$image" 2>/dev/null; }
if [ "$(label specfleet.recipe)" = "$recipe_version" ] && [ "$(label specfleet.base)" = "$base_id" ]; then
  echo "prometheus image $image: present (recipe v$recipe_version)"
  exit 0
fi

echo "prometheus image: building $image (recipe v$recipe_version): a box, apt-get install prometheus, committed"
podman rm -f "$box" >/dev/null 2>&1 || true
log=$(mktemp)
trap 'podman rm -f "$box" >/dev/null 2>&1 || true; rm -f "$log"' EXIT
# podman's default network reaches Debian's archive, so no --network host.
podman run -d --name "$box" --hostname sim-prometheus --systemd=always "$base" /sbin/init >/dev/null
# The package's postinst enables (and, systemd running, starts) prometheus.service. Its TSDB is
# emptied and the machine-id that systemd wrote on this first boot is truncated again, so each box
# of the image starts with fresh data and an id of its own, as a box of the base image does.
podman exec -e DEBIAN_FRONTEND=noninteractive "$box" sh -c '
  timeout 60 systemctl is-system-running --wait >/dev/null || true
  apt-get update -o Acquire::Check-Valid-Until=false &&
  apt-get install -y --no-install-recommends prometheus &&
  systemctl is-enabled prometheus.service &&
  systemctl stop prometheus.service &&
  rm -rf /var/lib/prometheus/metrics2/* &&
  apt-get clean &&
  : >/etc/machine-id' >"$log" 2>&1 || {
  tail -40 "$log"
  exit 1
}
podman stop "$box" >/dev/null
old_id=$(podman image inspect --format '{{.Id}}' "$image" 2>/dev/null || true)
podman commit --quiet \
  --change "LABEL specfleet.recipe=$recipe_version" --change "LABEL specfleet.base=$base_id" \
  "$box" "$image" >/dev/null
# The image this one replaces, now untagged (kept if a container still uses it).
[ -z "$old_id" ] || podman rmi "$old_id" >/dev/null 2>&1 || true
echo "prometheus image $image: built"
