#!/usr/bin/env bash
# The sim's ready-made boxes, each committed once per content hash of what made it:
#   installed  the sim box image after sim/prepare.yml and `deploy.yml --tags vllm` (vLLM's virtualenv
#              from the wheelhouse, the CPU build's fixes). The benches start their boxes from it.
#   converged  the installed image after a whole `deploy.yml`: the default drafter served, gated and
#              recorded as the box's last known good; its unit starts the server when a box of it boots.
#              The scenarios that are not about installing (eagle3, gate) start from it; the default
#              scenario and scripts/demo still go from a bare box.
# Usage: sim/build-box-image.sh installed|converged (converged builds installed first when it is stale).
set -euo pipefail
cd "$(dirname "$0")/.."

kind=${1:?usage: sim/build-box-image.sh installed|converged}
cache_dir="${SPECFLEET_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/specfleet}"
case "$kind" in
  installed)
    base="${SPECFLEET_SIM_IMAGE:-localhost/specfleet-simbox:bookworm}"
    # What decides its content: the install role, the sim box (its models and the controller key it
    # authorizes: the boxes started from these images skip prepare) and the inventory's pins.
    inputs=(roles/vllm sim/prepare.yml sim/roles sim/build_models.py inventory/local)
    key="$cache_dir/ssh/id_ed25519.pub"
    prepare=true
    deploy_args=(--tags vllm)
    ;;
  converged)
    base=localhost/specfleet-simbox:installed
    sim/build-box-image.sh installed
    # Everything a deploy reads, the drafter it ships and the gate's workload (inventory/local's
    # eagle3_drafter_source, gate_workload_file); the controller key is the installed image's, which its
    # Id stands for.
    inputs=(deploy.yml playbooks ansible.cfg roles library module_utils action_plugins filter_plugins
      inventory/local build/sim-models/eagle3-known-3.4 build/sim-models/sim-workload.jsonl)
    key=/dev/null
    prepare=false
    deploy_args=()
    ;;
  *)
    echo "sim/build-box-image.sh: no box image named '$kind' (installed or converged)" >&2
    exit 2
    ;;
esac
image="localhost/specfleet-simbox:$kind"
box="specfleet-$kind-image"

content=$(
  {
    podman image inspect --format '{{.Id}}' "$base"
    find "${inputs[@]}" -type f -not -path "*/__pycache__/*" -print0 | sort -z | xargs -0 sha256sum
    cat "$key"
  } | sha256sum | cut -c1-16
)
if [ "$(podman image inspect --format '{{index .Labels "specfleet.content"}}' "$image" 2>/dev/null)" = "$content" ]; then
  echo "$kind image $image: present (content $content)"
  exit 0
fi

echo "$kind image: building $image (content $content): a box, deploy.yml ${deploy_args[*]:-(all of it)}, committed"
podman rm -f "$box" >/dev/null 2>&1 || true
work=$(mktemp -d)
trap 'podman rm -f "$box" >/dev/null 2>&1 || true; rm -rf "$work"' EXIT
podman run -d --name "$box" --hostname sim-gpu-box --systemd=always --shm-size=1g "$base" /sbin/init >/dev/null
if $prepare; then
  ansible-playbook sim/prepare.yml -e "sim_box_container=$box" >/dev/null
fi
# Through podman, as the sim's own steps go: this box is a build step, not a fleet member (host
# variables, not extra vars, which would also redirect the tasks delegated to the controller).
printf '{"all": {"hosts": {"sim-gpu-box": {"ansible_connection": "containers.podman.podman", "ansible_host": "%s", "ansible_user": "root"}}}}\n' "$box" >"$work/connection.json"
# The gate's report of this build stays out of the repo's reports/.
ansible-playbook deploy.yml "${deploy_args[@]}" -i inventory/local -i "$work/connection.json" \
  -e "gate_report_dir=$work/reports" >"$work/deploy.log" || {
  tail -40 "$work/deploy.log"
  exit 1
}
grep -E '^sim-gpu-box +:' "$work/deploy.log"
podman stop "$box" >/dev/null
podman commit --quiet --change "LABEL specfleet.content=$content" "$box" "$image" >/dev/null
# The images this one replaces, untagged now (about 4 GB each; an installed one once no converged one
# is made from it); images a container still uses are kept.
podman image prune --force --filter label=specfleet.content >/dev/null
echo "$kind image $image: built"
