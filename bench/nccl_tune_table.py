"""NCCL candidates per message size, and what the scorer picks (prints figures; not a test).

Reads measurements made by roles/nccl_tune/files/nccl_allreduce_bench.py (by default the real
2x H200 ones kept as test fixtures) and scores them with module_utils/nccl_scoring.py (the scorer
library/nccl_tune.py uses) on Kimi-K2.5's profile (hidden 7168): the default mix, decode only, prefill only.

    .venv/bin/python bench/nccl_tune_table.py [report.json ...]

To measure a box by hand (torch with CUDA there; keep the NVLink-multicast variables off where
the machine asks for it):

    python3 roles/nccl_tune/files/nccl_allreduce_bench.py measure --backend nccl \\
        --sizes 14336,114688,458752,917504,7340032,29360128,117440512 --rounds 15 --per-round 20 \\
        --candidates "$(cat bench/nccl_candidates.json)" > report.json
"""

import json
import sys
from pathlib import Path

import ansible.module_utils

ROOT = Path(__file__).resolve().parents[1]
# As ansible.cfg and tests/conftest.py do: ansible.module_utils.<name> also comes from module_utils/
if str(ROOT / "module_utils") not in ansible.module_utils.__path__:
    ansible.module_utils.__path__.append(str(ROOT / "module_utils"))
from ansible.module_utils import nccl_scoring  # noqa: E402

DEFAULT_REPORTS = sorted((ROOT / "tests/fixtures/nccl_tune").glob("h200x2-*.json"))
PROFILES = {"decode 0.7 + prefill 0.3": (0.7, 0.3), "decode only": (1.0, 0.0), "prefill only": (0.0, 1.0)}


def table(path):
    report = json.loads(Path(path).read_text())
    if "candidates" not in report:
        return
    print(f"\n{Path(path).name}: {report['backend']}, {report['world_size']} processes")
    profile = nccl_scoring.size_profile(7168, [1, 8, 32, 64], [512, 2048, 8192], 0.7, 0.3)
    choice = nccl_scoring.score(report, profile, 0.05)
    header = "".join(f"{entry['bytes'] / 1024:>10.0f}K" for entry in profile)
    print(f"  {'median us per all-reduce':<26}{header}")
    for candidate in choice["candidates"]:
        if "error" in candidate:
            print(f"  {candidate['name']:<26}{candidate['error']}")
            continue
        cells = "".join(f"{size['median_us']:>11.1f}" for size in candidate["sizes"])
        print(f"  {candidate['name']:<26}{cells}")
    largest = {c["name"]: c["sizes"][-1]["busbw_gbps"] for c in choice["candidates"] if "sizes" in c}
    print(
        "  bus bandwidth at 112 MiB: "
        + ", ".join(f"{name} {gbps:.0f} GB/s" for name, gbps in largest.items())
    )
    for label, (decode, prefill) in PROFILES.items():
        weighted = nccl_scoring.size_profile(7168, [1, 8, 32, 64], [512, 2048, 8192], decode, prefill)
        picked = nccl_scoring.score(report, weighted, 0.05)
        scores = ", ".join(f"{c['name']} {c['score']:.2f}" for c in picked["candidates"] if "score" in c)
        print(f"  {label:<26}picks {picked['chosen']:<10} scores: {scores}")


for report_path in sys.argv[1:] or DEFAULT_REPORTS:
    table(report_path)
