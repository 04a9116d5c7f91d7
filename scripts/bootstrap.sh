#!/usr/bin/env bash
# Idempotent setup of this machine as the controller and host of the simulated GPU box:
# apt packages, podman's host settings, the .venv, the box image and the tiny models.
# Each step skips itself when already done.
set -euo pipefail
cd "$(dirname "$0")/.."

step() { printf '\n==> %s\n' "$*"; }

# dpkg-dev, gpg, gpg-agent: the nvidia_cuda scenario builds and signs a stand-in NVIDIA apt repository;
# patch: the test that GNU patch applies the vLLM EAGLE-3 diffs as they are published;
# openssh-client, rsync: the sim boxes are reached over SSH and drafters shipped with rsync, as a fleet is;
# chromium: the fleet report is opened in a real headless browser.
apt_packages=(podman runc mmdebstrap uidmap slirp4netns iproute2 python3-venv dpkg-dev gpg gpg-agent patch openssh-client rsync chromium)
missing=()
for pkg in "${apt_packages[@]}"; do
  dpkg-query -W -f='${Status}' "$pkg" 2>/dev/null | grep -q 'install ok installed' || missing+=("$pkg")
done
if [ ${#missing[@]} -gt 0 ]; then
  step "apt: installing ${missing[*]}"
  apt-get update -qq
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${missing[@]}" >/dev/null
fi

# Podman's host settings for systemd containers on this kind of machine:
# crun refuses the hybrid cgroup layout; rlimits above the host's hard limits are refused;
# without the host's cgroup2 tree, systemd in the container stalls 90 s on about half the stops.
conf=/etc/containers/containers.conf.d/50-specfleet.conf
nproc_max=$(( $(ulimit -Hu) < $(cat /proc/sys/kernel/pid_max) ? $(ulimit -Hu) : $(cat /proc/sys/kernel/pid_max) ))
want=$(
  echo '# Written by specfleet scripts/bootstrap.sh'
  echo '[containers]'
  echo "default_ulimits = [\"nofile=$(ulimit -Hn):$(ulimit -Hn)\", \"nproc=$nproc_max:$nproc_max\"]"
  if [ -e /sys/fs/cgroup/unified/cgroup.controllers ]; then
    echo 'volumes = ["/sys/fs/cgroup/unified:/sys/fs/cgroup/unified:rw"]'
  fi
  echo '[engine]'
  echo 'runtime = "runc"'
)
if [ "$(cat "$conf" 2>/dev/null)" != "$want" ]; then
  step "podman: writing $conf"
  mkdir -p "$(dirname "$conf")"
  printf '%s\n' "$want" > "$conf"
fi

# One virtualenv per content of the requirements files, in the cache: a fresh clone links it as .venv
# instead of installing again. A virtualenv cannot move, so it is built where it stays; the stamp,
# written last, says it is complete.
cache_dir="${SPECFLEET_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/specfleet}"
venv="$cache_dir/venv-$(cat requirements.txt requirements-runtime.txt | sha256sum | cut -c1-16)"
if [ ! -e "$venv/.complete" ]; then
  step "venv: installing requirements.txt into $venv"
  rm -rf "$venv"
  python3 -m venv "$venv"
  "$venv/bin/pip" install --quiet --upgrade pip
  "$venv/bin/pip" install --quiet -r requirements.txt
  touch "$venv/.complete"
fi
if [ "$(readlink .venv 2>/dev/null)" != "$venv" ]; then
  rm -rf .venv
  ln -s "$venv" .venv
fi

# promtool (checks and unit-tests the monitoring role's Prometheus rules): Debian's own, unpacked from
# the prometheus package into the cache, not installed (that would start a Prometheus on this machine).
promtool="$cache_dir/prometheus/usr/bin/promtool"
if [ ! -x "$promtool" ]; then
  step "promtool: unpacking Debian's prometheus package into $cache_dir/prometheus"
  apt-get update -qq
  unpack=$(mktemp -d)
  chmod 755 "$unpack" # apt-get download fetches as _apt
  rm -rf "$cache_dir/prometheus.partial"
  (cd "$unpack" && apt-get download -qq prometheus && dpkg-deb -x prometheus_*.deb "$cache_dir/prometheus.partial")
  rm -rf "$unpack" "$cache_dir/prometheus"
  mv "$cache_dir/prometheus.partial" "$cache_dir/prometheus"
fi
ln -sfn "$promtool" "$venv/bin/promtool"

# nginx (the unit tests run roles/vllm_proxy's site in it): the boxes' own package, unpacked into the cache
# the same way, not installed (that would start a web server on this machine).
nginx="$cache_dir/nginx/usr/sbin/nginx"
if [ ! -x "$nginx" ]; then
  step "nginx: unpacking Debian's nginx package into $cache_dir/nginx"
  apt-get update -qq
  unpack=$(mktemp -d)
  chmod 755 "$unpack"
  rm -rf "$cache_dir/nginx.partial"
  (cd "$unpack" && apt-get download -qq nginx && dpkg-deb -x nginx_*.deb "$cache_dir/nginx.partial")
  rm -rf "$unpack" "$cache_dir/nginx"
  mv "$cache_dir/nginx.partial" "$cache_dir/nginx"
fi
ln -sfn "$nginx" "$venv/bin/nginx"

# The controller's key for the sim boxes (sim/roles/sim_box authorizes it on each box).
if [ ! -s "$cache_dir/ssh/id_ed25519" ]; then
  step "ssh: a controller key for the sim boxes"
  mkdir -p "$cache_dir/ssh"
  ssh-keygen -q -t ed25519 -N '' -C specfleet-sim-controller -f "$cache_dir/ssh/id_ed25519"
fi

step "sim box image"
sim/build-image.sh

step "sim models"
.venv/bin/python sim/build_models.py --out build/sim-models
