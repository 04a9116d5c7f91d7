#!/usr/bin/env bash
# The installed box image: the sim box image after sim/prepare.yml and `deploy.yml --tags vllm`
# (vLLM's virtualenv from the wheelhouse, the CPU build's fixes), committed once per content hash
# of what made it. The scenarios that are not about installing (eagle3, gate) start from it, without a
# prepare step of their own; the default scenario and scripts/demo still install from scratch.
set -euo pipefail
cd "$(dirname "$0")/.."

base="${SPECFLEET_SIM_IMAGE:-localhost/specfleet-simbox:bookworm}"
image=localhost/specfleet-simbox:installed
box=specfleet-installed-image

cache_dir="${SPECFLEET_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/specfleet}"
content=$(
  {
    podman image inspect --format '{{.Id}}' "$base"
    # What decides the image's content: the install role, the sim box (its models and the controller
    # key it authorizes: the scenarios that start from this image skip prepare) and the inventory's pins.
    find roles/vllm sim/prepare.yml sim/roles sim/build_models.py inventory/local -type f -print0 | sort -z | xargs -0 sha256sum
    cat "$cache_dir/ssh/id_ed25519.pub"
  } | sha256sum | cut -c1-16
)
if [ "$(podman image inspect --format '{{index .Labels "specfleet.content"}}' "$image" 2>/dev/null)" = "$content" ]; then
  echo "installed image $image: present (content $content)"
  exit 0
fi

echo "installed image: building $image (content $content): a box, prepared, vLLM installed, committed"
podman rm -f "$box" >/dev/null 2>&1 || true
connection=$(mktemp --suffix=.json)
trap 'podman rm -f "$box" >/dev/null 2>&1 || true; rm -f "$connection" "$connection.log"' EXIT
podman run -d --name "$box" --hostname sim-gpu-box --systemd=always --shm-size=1g "$base" /sbin/init >/dev/null
ansible-playbook sim/prepare.yml -e "sim_box_container=$box" >/dev/null
# Through podman, as the sim's own steps go: this box is a build step, not a fleet member (host
# variables, not extra vars, which would also redirect the tasks delegated to the controller).
printf '{"all": {"hosts": {"sim-gpu-box": {"ansible_connection": "containers.podman.podman", "ansible_host": "%s", "ansible_user": "root"}}}}\n' "$box" >"$connection"
ansible-playbook deploy.yml --tags vllm -i inventory/local -i "$connection" >"$connection.log" || {
  tail -40 "$connection.log"
  exit 1
}
grep -E '^sim-gpu-box +:' "$connection.log"
podman stop "$box" >/dev/null
podman commit --quiet --change "LABEL specfleet.content=$content" "$box" "$image" >/dev/null
echo "installed image $image: built"
