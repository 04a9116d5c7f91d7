"""Drafter sync figures (prints figures; not a test).

Builds a synthetic drafter with the real Kimi-K2.5 EAGLE-3 drafter shapes (SpecForge config,
~2.4 GB of bf16 weights, cached under ~/.cache/specfleet/bench), then on a fresh sim box:
  - plain `rsync -a` of the same files into the box's filesystem (the reference),
  - the first ship through roles/eagle3_drafter (stage, validate, publish, switch),
  - an unchanged re-ship, and the controller-side manifest time it costs.

    .venv/bin/python bench/drafter_sync.py
"""

import importlib.util
import json
import os
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

import ansible.module_utils
import numpy as np

ROOT = Path(__file__).resolve().parents[1]
# library/dir_manifest.py imports ansible.module_utils.specfleet_files, which Ansible finds in module_utils/.
if str(ROOT / "module_utils") not in ansible.module_utils.__path__:
    ansible.module_utils.__path__.append(str(ROOT / "module_utils"))
BIN = Path(sys.executable).parent
BOX = "specfleet-bench-sync"
IMAGE = "localhost/specfleet-simbox:bookworm"
CACHE = Path(os.environ.get("SPECFLEET_CACHE") or Path.home() / ".cache/specfleet")
DRAFTER = CACHE / "bench/kimi-k25-eagle3-synthetic"
CONFIG = ROOT / "tests/fixtures/drafters/specforge-kimi-k25/config.json"
TARGET = {"model_type": "kimi_k2", "hidden_size": 7168, "num_hidden_layers": 61, "vocab_size": 163840}


def load(path, name):
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


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


def ship(*extra):
    return run(
        str(BIN / "ansible-playbook"),
        "-i",
        f"{BOX},",
        "-c",
        "containers.podman.podman",
        "bench/ship_drafter.yml",
        "-e",
        f"eagle3_drafter_source={DRAFTER}",
        "-e",
        "eagle3_drafter_target_config=/srv/kimi/config.json",
        "-e",
        "vllm_version=0.33.0",
        *extra,
        cwd=ROOT,
        env={**os.environ, "ANSIBLE_ERROR_ON_MISSING_HANDLER": "false"},
    )


def task_seconds(output, prefix):
    """Sum of profile_tasks timings of the tasks whose name starts with prefix."""
    return sum(
        float(m) for m in re.findall(rf"^eagle3_drafter : {re.escape(prefix)}.*?-+ ([0-9.]+)s$", output, re.M)
    )


def main():
    build_drafter()
    size = sum(f.stat().st_size for f in DRAFTER.iterdir() if f.name != ".complete")
    exclude = [".complete"]
    subprocess.run(["podman", "rm", "-f", BOX], capture_output=True, check=False)
    try:
        run("podman", "run", "-d", "--name", BOX, "--systemd=always", IMAGE, "/sbin/init")
        run(
            "podman",
            "exec",
            BOX,
            "sh",
            "-c",
            f"mkdir -p /srv/kimi && printf '%s' '{json.dumps(TARGET)}' > /srv/kimi/config.json",
        )
        rootfs = run("podman", "mount", BOX)[1].strip()
        rsync_s, _ = run("rsync", "-a", "--exclude=.complete", f"{DRAFTER}/", f"{rootfs}/srv/rsync-copy/")
        first_s, first_out = ship()
        again_s, again_out = ship()
        manifest = load(ROOT / "library/dir_manifest.py", "dir_manifest")
        cache = manifest.build_manifest(str(DRAFTER), exclude=exclude)[1]
        started = time.monotonic()
        manifest.build_manifest(str(DRAFTER), cache, exclude)
        cached_manifest_s = time.monotonic() - started
        gb = size / 1e9
        print(f"checkpoint                              : {gb:6.2f} GB (Kimi-K2.5 EAGLE-3 drafter shapes)")
        print(f"plain rsync -a into the box             : {rsync_s:6.1f} s  {gb / rsync_s:6.2f} GB/s")
        print(
            f"first ship (stage+validate+publish)     : {first_s:6.1f} s  {gb / first_s:6.2f} GB/s "
            f"(ratio to rsync {first_s / rsync_s:.2f}x; "
            f"copy task {task_seconds(first_out, 'Stage | Copy'):.1f} s)"
        )
        print(f"unchanged re-ship, whole playbook       : {again_s:6.1f} s")
        print(f"unchanged re-ship, staging tasks        : {task_seconds(again_out, 'Stage'):6.2f} s")
        print(f"controller manifest with a warm cache   : {cached_manifest_s:6.3f} s")
    finally:
        subprocess.run(["podman", "umount", BOX], capture_output=True, check=False)
        subprocess.run(["podman", "rm", "-f", BOX], capture_output=True, check=False)


if __name__ == "__main__":
    main()
