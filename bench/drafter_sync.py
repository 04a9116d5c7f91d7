"""Drafter transfer figures (prints figures beside their goals; not a test).

Builds a synthetic drafter with the real Kimi-K2.5 EAGLE-3 drafter shapes (SpecForge config,
~2.4 GB of bf16 weights, cached under ~/.cache/specfleet/bench), starts a sim box of its own reached
over SSH like a fleet's, then measures side by side:
  - the reference: a plain `rsync -a` of the same files over the same SSH (sudo rsync on the box),
    plus one sha256 pass over them (the hash the release manifest needs anyway);
  - the first ship through roles/eagle3_drafter with a cold manifest cache (hash, rsync into
    releases/<id>.partial, validate, publish, switch): goal <= 1.5x the reference;
  - an unchanged re-ship: goal <= 2 s for the staging tasks;
  - the same files as a target model's weights through roles/model_weights (hash, rsync, hashed again on
    the box against the manifest, publish, link): goal <= 1.5x a plain rsync plus two sha256 passes.

    .venv/bin/python bench/drafter_sync.py
"""

import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import yaml
from sim_bench import ROOT, box_vars, playbook

BOX = "specfleet-bench-sync"
SSH_PORT = 22125
# Reached over SSH like the default box, on ports of its own.
EXTRA = box_vars(BOX, SSH_PORT, 18002)
CACHE = Path(os.environ.get("SPECFLEET_CACHE") or Path.home() / ".cache/specfleet")
DRAFTER = CACHE / "bench/kimi-k25-eagle3-synthetic"
CONFIG = ROOT / "tests/fixtures/drafters/specforge-kimi-k25/config.json"
TARGET = {"model_type": "kimi_k2", "hidden_size": 7168, "num_hidden_layers": 61, "vocab_size": 163840}
SSH_USER = yaml.safe_load((ROOT / "sim/roles/sim_box/defaults/main.yml").read_text())["sim_box_ssh_user"]


def build_drafter():
    """Kimi-K2.5 drafter shapes with random bf16 bytes (content is irrelevant to a sync)."""
    config = json.loads(CONFIG.read_text())
    if (DRAFTER / ".complete").exists():
        return config
    shutil.rmtree(DRAFTER, ignore_errors=True)
    DRAFTER.mkdir(parents=True)
    hidden, heads, head_dim = config["hidden_size"], config["num_attention_heads"], config["head_dim"]
    inter, draft_vocab = config["intermediate_size"], config["draft_vocab_size"]
    shapes = {
        "midlayer.self_attn.q_proj.weight": (heads * head_dim, 2 * hidden),
        "midlayer.self_attn.k_proj.weight": (config["num_key_value_heads"] * head_dim, 2 * hidden),
        "midlayer.self_attn.v_proj.weight": (config["num_key_value_heads"] * head_dim, 2 * hidden),
        "midlayer.self_attn.o_proj.weight": (hidden, heads * head_dim),
        "midlayer.mlp.gate_proj.weight": (inter, hidden),
        "midlayer.mlp.up_proj.weight": (inter, hidden),
        "midlayer.mlp.down_proj.weight": (hidden, inter),
        "midlayer.input_layernorm.weight": (hidden,),
        "midlayer.hidden_norm.weight": (hidden,),
        "midlayer.post_attention_layernorm.weight": (hidden,),
        "fc.weight": (hidden, 3 * hidden),
        "norm.weight": (hidden,),
        "lm_head.weight": (draft_vocab, hidden),
    }
    shapes["d2t"] = (draft_vocab,)
    rng = np.random.default_rng(0)
    # d2t (int64) first keeps every tensor aligned to its element size.
    order = ["d2t"] + [name for name in shapes if name != "d2t"]
    header, offset = {}, 0
    for name in order:
        dtype, itemsize = ("I64", 8) if name == "d2t" else ("BF16", 2)
        size = int(np.prod(shapes[name])) * itemsize
        header[name] = {"dtype": dtype, "shape": list(shapes[name]), "data_offsets": [offset, offset + size]}
        offset += size
    raw = json.dumps(header).encode()
    raw += b" " * (-len(raw) % 8)
    with open(DRAFTER / "model.safetensors", "wb") as out:
        out.write(len(raw).to_bytes(8, "little") + raw)
        for name in order:
            if name == "d2t":
                out.write(np.zeros(draft_vocab, dtype="<i8").tobytes())
                continue
            remaining = header[name]["data_offsets"][1] - header[name]["data_offsets"][0]
            while remaining:
                chunk = min(remaining, 256 << 20)
                out.write(rng.integers(0, 256, chunk, dtype=np.uint8).tobytes())
                remaining -= chunk
    shutil.copy(CONFIG, DRAFTER / "config.json")
    (DRAFTER / ".complete").touch()
    return config


def run(*command, **kwargs):
    started = time.monotonic()
    result = subprocess.run(command, capture_output=True, text=True, **kwargs)
    if result.returncode != 0:
        sys.exit(f"{' '.join(map(str, command[:4]))} failed:\n{result.stdout[-3000:]}{result.stderr[-2000:]}")
    return time.monotonic() - started, result.stdout


# The drafter's own tasks, and the controller-source staging it imports (shared with model_weights).
SHIP_ROLES = "(?:eagle3_drafter|release_sync)"


def task_seconds(output, prefix):
    """Sum of profile_tasks timings of the tasks whose name starts with prefix."""
    return sum(
        float(m) for m in re.findall(rf"^{SHIP_ROLES} : {re.escape(prefix)}.*?-+ ([0-9.]+)s$", output, re.M)
    )


def sha256_pass(directory):
    """Seconds for one sha256 read of every file, as the manifest reads them."""
    started = time.monotonic()
    for path in sorted(directory.iterdir()):
        if path.name != ".complete":
            digest = hashlib.sha256()
            with open(path, "rb") as handle:
                while chunk := handle.read(1 << 20):
                    digest.update(chunk)
    return time.monotonic() - started


def main():
    build_drafter()
    size = sum(f.stat().st_size for f in DRAFTER.iterdir() if f.name != ".complete")
    ssh_dir = CACHE / "ssh"
    rsh = (
        f"ssh -p {SSH_PORT} -i {ssh_dir}/id_ed25519 -o UserKnownHostsFile={ssh_dir}/known_hosts "
        "-o HostKeyAlias=specfleet-simbox -o StrictHostKeyChecking=yes"
    )
    subprocess.run(["podman", "rm", "-f", BOX], capture_output=True, check=False)
    try:
        playbook(EXTRA, "sim/start.yml")
        run("podman", "exec", BOX, "sh", "-c", "apt-get install -y -qq rsync >/dev/null")
        run("podman", "exec", BOX, "sh", "-c", f"printf '%s' '{json.dumps(TARGET)}' > /srv/kimi.json")
        rsync_s, _ = run(
            "rsync",
            "-a",
            "--exclude=.complete",
            "-e",
            rsh,
            "--rsync-path=sudo rsync",
            f"{DRAFTER}/",
            f"{SSH_USER}@127.0.0.1:/srv/rsync-copy/",
        )
        hash_s = sha256_pass(DRAFTER)
        reference = rsync_s + hash_s
        with tempfile.TemporaryDirectory() as cold_cache:
            ship = ["bench/ship_drafter.yml", "-e", f"eagle3_drafter_source={DRAFTER}"]
            ship += ["-e", "eagle3_drafter_target_config=/srv/kimi.json", "-e", "vllm_version=0.33.0"]
            ship += ["-e", f"eagle3_drafter_manifest_cache={cold_cache}"]
            # The switch notifies vllm_service's restart handler, which this play does not have.
            alone = {"ANSIBLE_ERROR_ON_MISSING_HANDLER": "false"}
            first_s, _, first_out = playbook(EXTRA, *ship, env=alone)
            again_s, _, again_out = playbook(EXTRA, *ship, env=alone)
        with tempfile.TemporaryDirectory() as cold_cache:
            weights = ["bench/ship_weights.yml", "-e", f"model_weights_source={DRAFTER}"]
            weights += [
                "-e",
                "vllm_service_model_path=/srv/bench-model",
                "-e",
                f"release_sync_manifest_cache={cold_cache}",
            ]
            weights_s, _, weights_out = playbook(EXTRA, *weights, env=alone)
        staging = task_seconds(again_out, "Stage")
        gb = size / 1e9
        print(f"checkpoint                                 : {gb:6.2f} GB (Kimi-K2.5 EAGLE-3 drafter shapes)")
        print(f"plain rsync -a over SSH into the box       : {rsync_s:6.1f} s  {gb / rsync_s:6.2f} GB/s")
        print(f"one sha256 pass over the files             : {hash_s:6.1f} s")
        transfer = task_seconds(first_out, "Stage | Transfer")
        print(
            f"first ship, cold hash cache                : {first_s:6.1f} s  ratio {first_s / reference:.2f}x"
            f" to rsync + sha256 (goal <= 1.50x); its transfer task {transfer:.1f} s"
        )
        print(f"unchanged re-ship, staging tasks           : {staging:6.2f} s  (goal <= 2.00 s)")
        print(f"unchanged re-ship, whole playbook          : {again_s:6.1f} s")
        print(
            f"target weights, first ship, cold cache     : {weights_s:6.1f} s  ratio"
            f" {weights_s / (reference + hash_s):.2f}x to rsync + 2 sha256 passes (goal <= 1.50x)"
        )
        verify = sum(
            float(m)
            for m in re.findall(r"^model_weights : Publish \| Hash.*?-+ ([0-9.]+)s$", weights_out, re.M)
        )
        print(f"  of which the box's hash of the staged copy: {verify:6.1f} s")
        print("first ship's slowest tasks (profile_tasks):")
        recap = first_out.split("TASKS RECAP", 1)[-1]
        for line in re.findall(rf"^({SHIP_ROLES} : .*?) -+ ([0-9.]+s)$", recap, re.M)[:8]:
            print(f"  {line[1]:>7}  {line[0]}")
    finally:
        subprocess.run(["podman", "rm", "-f", BOX], capture_output=True, check=False)


if __name__ == "__main__":
    main()
