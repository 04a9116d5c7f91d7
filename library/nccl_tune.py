#!/usr/bin/python
"""Ansible module: choose a box's NCCL environment by measuring all-reduce on the box itself."""

from __future__ import annotations

DOCUMENTATION = r"""
---
module: nccl_tune
short_description: Measure NCCL all-reduce per candidate environment and pick the one this box runs fastest
description:
  - "Runs I(script) (C(nccl_allreduce_bench.py), shipped by roles/nccl_tune) with the box's own Python and
    torch: one process per GPU, bf16 all-reduce, warm-up then timed rounds, for every candidate environment
    at every message size of the model's profile."
  - Candidates are NCCL's defaults (no variables), the topology rule's recommendation (C(nccl_env) of the
    gpu_topology facts, when it differs from the defaults) and I(candidates).
  - The profile comes from the model. A decode step all-reduces I(hidden_size) x batch x 2 bytes for each
    of I(decode_batch_sizes); a prefill chunk all-reduces I(hidden_size) x tokens x 2 bytes for each of
    I(prefill_chunk_tokens). Each candidate's score is the weighted geometric mean of its time over the
    defaults' time at each size (I(decode_weight) spread over the decode sizes, I(prefill_weight) over
    the prefill ones); the lowest score wins if it beats the defaults by at least I(min_gain), otherwise
    the defaults win.
  - The raw timings are kept in I(cache_path) with the date, GPU names, driver, torch and NCCL versions,
    topology, candidates and sizes. They are reused (and only re-scored, so new weights need no new
    measurement) until one of those changes or I(remeasure) is set.
  - "Refuses to measure while a process uses a GPU or a unit in I(busy_units) is active: the measurement
    would disturb the service and be disturbed by it. The script runs in its own session and is killed,
    with all its workers, when it exceeds I(timeout)."
  - With I(measure=false) it only reads the kept result (and warns when the box changed since), without
    starting Python or touching the GPUs.
options:
  python:
    description: Python with torch, usually the vLLM virtualenv's.
    type: path
    required: true
  script:
    description: Path of nccl_allreduce_bench.py on the box.
    type: path
    required: true
  backend:
    description: C(nccl) on GPUs; C(gloo) runs the same code on CPU processes (the simulated box).
    type: str
    choices: [nccl, gloo]
    default: nccl
  world_size:
    description: Processes in the all-reduce; 0 means one per GPU of I(topology).
    type: int
    default: 0
  topology:
    description: The gpu_topology facts (GPU list, links, C(nccl_env), C(nccl_env_rule)).
    type: dict
    required: true
  hidden_size:
    description: The served model's hidden size (7168 for Kimi-K2.5 and DeepSeek-V3).
    type: int
  decode_batch_sizes:
    description: Decode batch sizes whose all-reduce sizes are measured.
    type: list
    elements: int
    default: [1, 8, 32, 64]
  prefill_chunk_tokens:
    description: Prefill chunk sizes, in tokens, whose all-reduce sizes are measured.
    type: list
    elements: int
    default: [512, 2048, 8192]
  decode_weight:
    description: Share of the score given to the decode sizes.
    type: float
    default: 0.7
  prefill_weight:
    description: Share of the score given to the prefill sizes.
    type: float
    default: 0.3
  candidates:
    description: More candidates, each a name and the environment to add to NCCL's defaults.
    type: list
    elements: dict
    default: []
  min_gain:
    description: How much lower than the defaults' (1.0) a score must be to replace them (0.05 = 5%).
    type: float
    default: 0.05
  cache_path:
    description: Where the measurement is kept on the box.
    type: path
    default: /var/lib/specfleet/nccl_tune.json
  measure:
    description: Measure when nothing valid is kept; false only reads the kept result.
    type: bool
    default: true
  remeasure:
    description: Measure even when a valid result is kept.
    type: bool
    default: false
  busy_units:
    description: systemd units that hold the GPUs while active; measuring is refused while one is.
    type: list
    elements: str
    default: []
  nvidia_smi:
    description: nvidia-smi binary (driver version, GPU processes).
    type: str
    default: nvidia-smi
  warmup:
    description: Untimed all-reduces per size before timing.
    type: int
    default: 5
  rounds:
    description: Timed rounds per size; the median round is kept.
    type: int
    default: 7
  per_round:
    description: Back-to-back all-reduces per round.
    type: int
    default: 10
  user:
    description: The user the measurement runs as (its primary and supplementary groups too, and its home
      as C(HOME)), the inference service's, so that what the workers leave (C(/dev/shm/nccl-*)) is that
      user's to clean up, as the server's own start does; empty runs it as the module's user.
    type: str
    default: ""
  timeout_s:
    description:
      - Seconds the whole measurement may take before it and its workers are killed.
      - Was timeout (still taken).
    aliases: [timeout]
    type: int
    default: 900
extends_documentation_fragment:
  - action_common_attributes
  - action_common_attributes.facts
attributes:
  check_mode:
    support: full
    details: Probes versions and reports whether a measurement would run (C(changed)) without running it.
  diff_mode:
    support: none
  facts:
    support: full
  platform:
    platforms: posix
notes:
  - The measurement takes the GPUs for a minute or two; stop the inference service first (roles/nccl_tune
    does when C(nccl_tune_stop_service) is true).
author:
  - specfleet maintainers
"""

EXAMPLES = r"""
- name: Measure NCCL candidates on the box (Kimi-K2.5 sizes)
  nccl_tune:
    python: /opt/vllm/venv/bin/python
    script: /usr/local/lib/specfleet/nccl_allreduce_bench.py
    topology: "{{ gpu_topology }}"
    hidden_size: 7168
    candidates:
      - name: ll-min8
        env: {NCCL_PROTO: LL, NCCL_MIN_NCHANNELS: "8"}
    busy_units: [vllm.service]
"""

RETURN = r"""
measurement_due:
  description: Whether the timings had to be (or, in check mode, would be) measured in this run.
  returned: success
  type: bool
ansible_facts:
  description: Facts for the service environment.
  returned: success
  type: dict
  contains:
    nccl_tune:
      description: The choice and the evidence.
      type: dict
      returned: success
      contains:
        source:
          description: C(measured) in this run, C(kept) from I(cache_path), or C(none).
          type: str
          sample: kept
        env:
          description: The winner's environment (C({}) when NCCL's defaults won); null without a measurement.
          type: dict
          sample: {"NCCL_PROTO": "LL", "NCCL_MIN_NCHANNELS": "8"}
        chosen:
          description: Name of the winning candidate.
          type: str
          sample: defaults
        reason:
          description: One line saying why it won.
          type: str
          sample: "defaults: no candidate beat NCCL's defaults by 5% (best: ll-min8 0.98)"
        measured_at:
          description: When the kept timings were taken (UTC, ISO 8601).
          type: str
        identity:
          description: What the timings hold for (GPUs, driver, torch, NCCL, topology, candidates, sizes).
          type: dict
        stale:
          description: What changed since the kept measurement (only with measure=false).
          type: list
          elements: str
        candidates:
          description: Per candidate the score (all sizes, decode only, prefill only) and per size the median
            time in microseconds and the bus bandwidth in GB/s, or the error that disqualified it.
          type: list
          elements: dict
        summary:
          description: One line per candidate (the winner marked C(*)) with its scores and median times.
          type: list
          elements: str
        phase_winners:
          description: The candidate scoring best on the decode sizes alone, and on the prefill sizes alone.
          type: dict
          sample: {"decode": "ll-min8", "prefill": "defaults"}
"""

import contextlib
import datetime
import hashlib
import json
import os
import pwd
import signal
import subprocess

from ansible.module_utils.basic import AnsibleModule
from ansible.module_utils.kept_measurement import KeptMeasurementError, changed_fields, read_kept, write_kept
from ansible.module_utils.nccl_scoring import DEFAULTS, MeasurementError, score, size_profile

# Identity fields too long to show old -> new.
SUMMARIZED = ("candidates", "sizes", "topology")


def candidate_list(topology, extra):
    """Defaults first, then the topology rule (when it sets anything), then the inventory's, without twins."""
    wanted = [{"name": DEFAULTS, "env": {}}]
    if topology.get("nccl_env"):
        wanted.append(
            {"name": f"topology-rule-{topology.get('nccl_env_rule', 'rule')}", "env": topology["nccl_env"]}
        )
    wanted.extend(extra)
    chosen, seen_envs, seen_names = [], [], set()
    for candidate in wanted:
        env = {str(name): str(value) for name, value in (candidate.get("env") or {}).items()}
        name = str(candidate.get("name") or "")
        if not name:
            raise ValueError(f"a candidate needs a name: {candidate!r}")
        if name in seen_names:
            raise ValueError(f"two candidates are named {name}")
        seen_names.add(name)
        if env in seen_envs:
            continue
        seen_envs.append(env)
        chosen.append({"name": name, "env": env})
    return chosen


def gpu_names(topology):
    return sorted({gpu.get("name") for gpu in topology.get("gpus", [])})


def topology_digest(topology):
    """What of the topology changes NCCL's paths: GPU names and bus ids, the link matrix, the NICs."""
    shape = {
        "gpus": [(gpu.get("name"), gpu.get("pci_bus_id")) for gpu in topology.get("gpus", [])],
        "links": topology.get("links"),
        "nics": topology.get("nics"),
    }
    return hashlib.sha256(json.dumps(shape, sort_keys=True).encode()).hexdigest()[:16]


class Box:
    """What the module asks the box: nvidia-smi, systemd and the measurement script."""

    def __init__(self, module):
        self.module = module
        self.params = module.params

    def _run(self, argv, what):
        rc, out, err = self.module.run_command(argv)
        if rc != 0:
            raise MeasurementError(f"{what} failed (exit {rc}): {(err or out).strip().splitlines()[-1:]}")
        return out

    def driver_version(self):
        out = self._run(
            [self.params["nvidia_smi"], "--query-gpu=driver_version", "--format=csv,noheader"], "nvidia-smi"
        )
        versions = sorted({line.strip() for line in out.splitlines() if line.strip()})
        return ",".join(versions)

    def gpu_processes(self):
        argv = [self.params["nvidia_smi"], "--query-compute-apps=pid,process_name", "--format=csv,noheader"]
        return [line.strip() for line in self._run(argv, "nvidia-smi").splitlines() if line.strip()]

    def active_units(self):
        active = []
        for unit in self.params["busy_units"]:
            _rc, out, _err = self.module.run_command(["systemctl", "is-active", unit])
            if out.strip() in ("active", "activating", "reloading", "deactivating"):
                active.append(unit)
        return active

    def as_user(self):
        """Popen's arguments for running as the user option's user: its uid, groups and home."""
        if not self.params["user"]:
            return {}
        try:
            account = pwd.getpwnam(self.params["user"])
        except KeyError:
            raise MeasurementError(f"no user {self.params['user']} on this box to measure as") from None
        return {
            "user": account.pw_uid,
            "group": account.pw_gid,
            "extra_groups": os.getgrouplist(account.pw_name, account.pw_gid),
            "env": {
                **os.environ,
                "HOME": account.pw_dir,
                "USER": account.pw_name,
                "LOGNAME": account.pw_name,
            },
        }

    def script(self, *args, timeout):
        """Run the measurement script in its own session; on timeout kill it and every worker it forked."""
        argv = [self.params["python"], self.params["script"], *args]
        process = subprocess.Popen(
            argv,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            start_new_session=True,
            **self.as_user(),
        )
        try:
            out, err = process.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            os.killpg(process.pid, signal.SIGKILL)
            process.communicate()
            raise MeasurementError(
                f"the measurement exceeded its time bound of {timeout} s and was killed"
            ) from None
        finally:
            # Workers left by a crashed parent would hold GPUs: the whole session goes.
            with contextlib.suppress(ProcessLookupError):
                os.killpg(process.pid, signal.SIGKILL)
        if process.returncode != 0:
            tail = (err or out).strip().splitlines()[-1:] or ["no output"]
            raise MeasurementError(f"{os.path.basename(self.params['script'])} {args[0]} failed: {tail[0]}")
        try:
            return json.loads(out.strip().splitlines()[-1])
        except (ValueError, IndexError) as error:
            raise MeasurementError(
                f"{os.path.basename(self.params['script'])} printed no JSON: {error}"
            ) from None


def identity(params, topology, versions, driver, world_size, candidates, profile):
    return {
        "backend": params["backend"],
        "world_size": world_size,
        "gpus": gpu_names(topology),
        "driver": driver,
        "torch": versions.get("torch"),
        "nccl": versions.get("nccl"),
        "topology": topology_digest(topology),
        "candidates": candidates,
        "sizes": [entry["bytes"] for entry in profile],
    }


def tune(module, box):
    """(changed, measurement due, nccl_tune facts)."""
    params = module.params
    topology = params["topology"]
    kept = read_kept(params["cache_path"])
    driver = box.driver_version()
    if not params["measure"]:
        return False, False, kept_facts(kept, driver, topology)
    if not params["hidden_size"]:
        raise MeasurementError(
            "hidden_size is required to measure (the model's all-reduce sizes come from it)"
        )
    world_size = params["world_size"] or len(topology.get("gpus", []))
    if world_size < 2:
        return (
            False,
            False,
            {
                "source": "none",
                "env": {},
                "chosen": DEFAULTS,
                "reason": "one GPU: there is no all-reduce to tune",
            },
        )
    profile = size_profile(
        params["hidden_size"],
        params["decode_batch_sizes"],
        params["prefill_chunk_tokens"],
        params["decode_weight"],
        params["prefill_weight"],
    )
    scoring = {"profile": profile, "min_gain": params["min_gain"]}
    candidates = candidate_list(topology, params["candidates"])
    missing = [path for path in (params["python"], params["script"]) if not os.path.exists(path)]
    if missing and module.check_mode:
        # A fresh box in check mode: neither the virtualenv nor the script is there yet.
        return (
            True,
            True,
            {"source": "none", "env": None, "reason": f"would measure once {missing[0]} exists"},
        )
    versions = box.script("probe", "--backend", params["backend"], timeout=120)
    current = identity(params, topology, versions, driver, world_size, candidates, profile)
    stale = changed_fields(kept["identity"], current, SUMMARIZED) if kept else ["nothing measured yet"]
    if not stale and not params["remeasure"]:
        # The kept timings still hold; new weights only re-score them.
        choice = score(kept["report"], profile, params["min_gain"])
        rescored = kept.get("scoring") != scoring
        if rescored and not module.check_mode:
            write_kept(module, params["cache_path"], dict(kept, choice=choice, scoring=scoring))
        return rescored, False, dict(choice, source="kept", measured_at=kept["measured_at"], identity=current)
    why = "re-measure asked" if not stale else "; ".join(stale)
    if module.check_mode:
        # Until a measurement replaces it, what is kept (or the topology rule) stays in force.
        now = dict(kept["choice"], source="kept", measured_at=kept["measured_at"]) if kept else {"env": None}
        return True, True, dict(now, source=now.get("source", "none"), reason=f"would measure: {why}")
    refuse_if_busy(box)
    report = box.script(
        "measure",
        "--backend", params["backend"],
        "--world-size", str(world_size),
        "--sizes", ",".join(str(entry["bytes"]) for entry in profile),
        "--candidates", json.dumps(candidates),
        "--warmup", str(params["warmup"]),
        "--rounds", str(params["rounds"]),
        "--per-round", str(params["per_round"]),
        "--candidate-timeout", str(max(30, params["timeout_s"] // len(candidates))),
        timeout=params["timeout_s"],
    )  # fmt: skip
    choice = score(report, profile, params["min_gain"])
    measured_at = datetime.datetime.now(datetime.timezone.utc).replace(microsecond=0).isoformat()
    kept = {"measured_at": measured_at, "because": why, "identity": current, "report": report}
    write_kept(module, params["cache_path"], dict(kept, choice=choice, scoring=scoring))
    return True, True, dict(choice, source="measured", measured_at=measured_at, identity=current, because=why)


def kept_facts(kept, driver, topology):
    """The kept choice without starting Python; what changed on the box since is reported as stale."""
    if not kept:
        return {
            "source": "none",
            "env": None,
            "reason": "nothing measured on this box: the topology rule applies",
        }
    was = kept["identity"]
    now = {
        "driver": driver,
        "topology": topology_digest(topology),
        "gpus": gpu_names(topology),
    }
    stale = changed_fields({field: was.get(field) for field in now}, now, SUMMARIZED)
    return dict(kept["choice"], source="kept", measured_at=kept["measured_at"], identity=was, stale=stale)


def refuse_if_busy(box):
    units = box.active_units()
    if units:
        raise MeasurementError(
            f"{', '.join(units)} is running and would share the GPUs with the measurement;"
            " stop it first (nccl_tune_stop_service=true does)"
        )
    processes = box.gpu_processes()
    if processes:
        raise MeasurementError(
            f"GPUs are in use ({'; '.join(processes)}); measuring now would measure them too"
        )


def main():
    module = AnsibleModule(
        argument_spec={
            "python": {"type": "path", "required": True},
            "script": {"type": "path", "required": True},
            "backend": {"type": "str", "choices": ["nccl", "gloo"], "default": "nccl"},
            "world_size": {"type": "int", "default": 0},
            "topology": {"type": "dict", "required": True},
            "hidden_size": {"type": "int"},
            "decode_batch_sizes": {"type": "list", "elements": "int", "default": [1, 8, 32, 64]},
            "prefill_chunk_tokens": {"type": "list", "elements": "int", "default": [512, 2048, 8192]},
            "decode_weight": {"type": "float", "default": 0.7},
            "prefill_weight": {"type": "float", "default": 0.3},
            "candidates": {"type": "list", "elements": "dict", "default": []},
            "min_gain": {"type": "float", "default": 0.05},
            "cache_path": {"type": "path", "default": "/var/lib/specfleet/nccl_tune.json"},
            "measure": {"type": "bool", "default": True},
            "remeasure": {"type": "bool", "default": False},
            "busy_units": {"type": "list", "elements": "str", "default": []},
            "nvidia_smi": {"type": "str", "default": "nvidia-smi"},
            "warmup": {"type": "int", "default": 5},
            "rounds": {"type": "int", "default": 7},
            "per_round": {"type": "int", "default": 10},
            "user": {"type": "str", "default": ""},
            "timeout_s": {"type": "int", "default": 900, "aliases": ["timeout"]},
        },
        supports_check_mode=True,
    )
    try:
        changed, due, facts = tune(module, Box(module))
    except (MeasurementError, KeptMeasurementError, ValueError) as error:
        module.fail_json(msg=str(error))
    for line in facts.get("stale") or []:
        module.warn(f"the kept NCCL measurement is stale ({line}); re-measure with playbooks/tune_nccl.yml")
    module.exit_json(changed=changed, measurement_due=due, ansible_facts={"nccl_tune": facts})


if __name__ == "__main__":
    main()
