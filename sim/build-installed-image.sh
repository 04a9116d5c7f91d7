#!/usr/bin/env bash
# The installed box image: the sim box image after sim/prepare.yml and `deploy.yml --tags vllm`
# (vLLM's virtualenv from the wheelhouse, the CPU build's fixes), committed once per content hash
# of what made it. The scenarios that are not about installing (eagle3, gate) start from it; the
# default scenario and scripts/demo still install from scratch.
set -euo pipefail
cd "$(dirname "$0")/.."

base="${SPECFLEET_SIM_IMAGE:-localhost/specfleet-simbox:bookworm}"
image=localhost/specfleet-simbox:installed
box=specfleet-installed-image

content=$(
  {
    podman image inspect --format '{{.Id}}' "$base"
    # What decides the image's content: the install role, the sim box and the inventory's pins.
    find roles/vllm sim/prepare.yml sim/roles inventory/local -type f -print0 | sort -z | xargs -0 sha256sum
  } | sha256sum | cut -c1-16
)
if [ "$(podman image inspect --format '{{index .Labels "specfleet.content"}}' "$image" 2>/dev/null)" = "$content" ]; then
  echo "installed image $image: present (content $content)"
  exit 0
fi

echo "installed image: building $image (content $content): a box, prepared, vLLM installed, committed"
podman rm -f "$box" >/dev/null 2>&1 || true
trap 'podman rm -f "$box" >/dev/null 2>&1 || true' EXIT
podman run -d --name "$box" --hostname sim-gpu-box --systemd=always --shm-size=1g "$base" /sbin/init >/dev/null
ansible-playbook sim/prepare.yml -e "ansible_host=$box" >/dev/null
ansible-playbook deploy.yml --tags vllm -e "ansible_host=$box" | grep -E '^(PLAY RECAP|sim-gpu-box +:)' || true
podman stop "$box" >/dev/null
podman commit --quiet --change "LABEL specfleet.content=$content" "$box" "$image" >/dev/null
echo "installed image $image: built"
