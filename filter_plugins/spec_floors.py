"""gate_floor_alpha: a gate floor as the per-position acceptance it means, for the fleet's Prometheus rules
(roles/monitoring), so that an alert puts the floor at the k a box drafts now, as the gate does. The model
is the gate's own (module_utils/spec_stats.py, loaded from its file: controller plugins cannot import the
repo's module_utils as modules do)."""

import importlib.util
from pathlib import Path

from ansible.errors import AnsibleFilterError

_SPEC = importlib.util.spec_from_file_location(
    "specfleet_spec_stats", Path(__file__).resolve().parents[1] / "module_utils" / "spec_stats.py"
)
spec_stats = importlib.util.module_from_spec(_SPEC)
_SPEC.loader.exec_module(spec_stats)


def gate_floor_alpha(floor, figure, floors_at_k):
    """alpha for a floor on `figure` (mean_acceptance_length or acceptance_rate) stated at k=floors_at_k."""
    floor, floors_at_k = float(floor), int(floors_at_k)
    if figure == "acceptance_rate":
        floor = 1 + floor * floors_at_k
    elif figure != "mean_acceptance_length":
        raise AnsibleFilterError(f"gate_floor_alpha: no floor model for {figure!r}")
    try:
        return round(spec_stats.floor_alpha(floor, floors_at_k), 6)
    except ValueError as error:
        raise AnsibleFilterError(f"gate_floor_alpha: {error}") from error


class FilterModule:
    def filters(self):
        return {"gate_floor_alpha": gate_floor_alpha}
