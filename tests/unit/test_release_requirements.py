"""release_requirements: the box's Python and driver against what a pinned vLLM release requires, read from
real package metadata in metadata-only wheels (tests/metadata_wheels.py), from a wheelhouse and through
pip's index report."""

import json
from pathlib import Path

import yaml
from driver import run_playbook
from metadata_wheels import metadata_wheel, wheelhouse

ROOT = Path(__file__).resolve().parents[2]


def check(tmp_path, *calls, options=()):
    """Each call's arguments as one task of one play on the controller; the run and each call's result."""
    tasks = [{"release_requirements": args, "ignore_errors": True} for args in calls]
    play = {"hosts": "localhost", "connection": "local", "gather_facts": False, "tasks": tasks}
    playbook = tmp_path / "check.yml"
    playbook.write_text(json.dumps([play]))
    run = run_playbook(playbook, *options, inventory="localhost,")
    return run, run.select(host="localhost", action="release_requirements")


VLLM_033 = {"package": "vllm", "version": "0.33.0", "machine": "x86_64"}


def test_the_driver_must_run_the_cuda_of_the_torch_the_release_pins(tmp_path):
    wheels = wheelhouse(tmp_path / "wheels")
    at = {**VLLM_033, "python_version": "3.12.3", "wheelhouse": str(wheels)}
    run, (old, fits, python, cpu, volta) = check(
        tmp_path,
        {**at, "driver_version": "575.57.08"},
        {**at, "driver_version": "580.95.05"},
        {**at, "python_version": "3.10.12", "python": "python3", "driver_version": "580.95.05"},
        {**at, "driver_version": ""},
        # gpu_bus names a V100 so (tests/unit/test_gpu_bus.py).
        {**at, "driver_version": "580.95.05", "pre_turing_gpus": ["Tesla V100 PCIe 32GB"] * 8},
    )
    assert old.status == "failed" and old.msg == (
        "vllm 0.33.0 pins torch 2.14.0, built for CUDA 13.0.3, which needs NVIDIA driver branch 580 or "
        "newer; nvidia_cuda_driver_version is 575.57.08"
    ), str(run)
    assert fits.status == "ok" and not fits.changed, str(run)
    assert fits.facts["release_requirements"] == {
        "package": "vllm",
        "version": "0.33.0",
        "requires_python": "<3.15,>=3.11",
        "python_version": "3.12.3",
        "torch": "2.14.0",
        "cuda": "13.0.3",
        "min_driver_branch": 580,
        "sources": {"vllm": "wheelhouse", "torch": "wheelhouse"},
    }
    # Ubuntu 22.04's python3 (DGX OS 6's base).
    assert python.status == "failed" and python.msg == (
        "vllm 0.33.0 requires Python <3.15,>=3.11; the box's python3 is 3.10.12: set vllm_python to an "
        "interpreter that fits (e.g. python3.11 from the distribution, with vllm_python_packages to install "
        "it)"
    ), str(run)
    assert volta.status == "failed" and volta.msg == (
        "vllm 0.33.0 pins torch 2.14.0, built for CUDA 13.0.3, which runs on Turing and newer GPUs; the PCI "
        "bus shows Tesla V100 PCIe 32GB, older"
    ), str(run)
    # No driver to check (a CPU build): torch is not read.
    assert cpu.status == "ok" and cpu.facts["release_requirements"]["torch"] is None, str(run)


def test_a_cuda_12_torch_needs_branch_525(tmp_path):
    """torch 2.8.0 names its CUDA by the runtime package (nvidia-cuda-runtime-cu12 12.8.90): a release
    pinning it (here a wheel of a made-up vllm 0.10.99 that only pins torch) runs on a 525 driver."""
    wheels = wheelhouse(tmp_path / "wheels")
    metadata_wheel(
        wheels / "vllm-0.10.99-cp38-abi3-manylinux_2_28_x86_64.whl",
        "Metadata-Version: 2.1\nName: vllm\nVersion: 0.10.99\nRequires-Python: >=3.9\n"
        'Requires-Dist: torch==2.8.0; platform_system == "Linux"\n'
        'Requires-Dist: torch==2.7.0; extra == "old"\n',
    )
    at = {**VLLM_033, "version": "0.10.99", "python_version": "3.12.3", "wheelhouse": str(wheels)}
    run, (old, fits) = check(
        tmp_path, {**at, "driver_version": "470.256.02"}, {**at, "driver_version": "525.60.13"}
    )
    assert old.msg == (
        "vllm 0.10.99 pins torch 2.8.0, built for CUDA 12.8.90, which needs NVIDIA driver branch 525 or "
        "newer; nvidia_cuda_driver_version is 470.256.02"
    ), str(run)
    assert fits.status == "ok" and fits.facts["release_requirements"]["cuda"] == "12.8.90", str(run)
    assert fits.facts["release_requirements"]["sources"] == {"vllm": "wheelhouse", "torch": "wheelhouse"}


def test_from_the_index_once_then_from_the_cache(tmp_path):
    """Without a wheelhouse, pip reads the metadata from the index (here a directory of wheels given as
    pip_args); what it said is kept, and the next run reads the cache; check mode keeps nothing."""
    index = wheelhouse(tmp_path / "index")
    cache = tmp_path / "cache"
    at = {
        **VLLM_033,
        "python_version": "3.12.3",
        "driver_version": "580.95.05",
        "pip_args": f"--no-index --find-links {index}",
        "cache": str(cache),
    }
    run, (dry,) = check(tmp_path, at, options=("--check",))
    assert dry.status == "ok", dry.msg
    assert dry.facts["release_requirements"]["sources"] == {"vllm": "index", "torch": "index"}
    assert not cache.exists(), str(run)
    run, (first, second) = check(tmp_path, at, at)
    assert [r.facts["release_requirements"]["sources"] for r in (first, second)] == [
        {"vllm": "index", "torch": "index"},
        {"vllm": "cache", "torch": "cache"},
    ], str(run)
    assert (
        first.facts["release_requirements"]["cuda"]
        == second.facts["release_requirements"]["cuda"]
        == "13.0.3"
    )
    assert sorted(p.name for p in cache.iterdir()) == [
        "torch-2.14.0-cp312-x86_64.json",
        "vllm-0.33.0-cp312-x86_64.json",
    ]
    run, (missing,) = check(tmp_path, {**at, "version": "0.33.9", "cache": ""})
    assert missing.status == "failed" and missing.msg.startswith(
        "cannot read vllm 0.33.9's metadata from the package index: "
    ), str(run)


def test_the_role_defaults_and_the_example_inventory_fit_together(tmp_path):
    """The vllm role's pin and the nvidia_cuda role's driver (and the example inventory's, which names the
    same release) pass: the defaults move together."""
    vllm = yaml.safe_load((ROOT / "roles/vllm/defaults/main.yml").read_text())
    driver = yaml.safe_load((ROOT / "roles/nvidia_cuda/defaults/main.yml").read_text())
    example = yaml.safe_load((ROOT / "inventory/example/group_vars/gpu_boxes.yml").read_text())
    assert example.get("vllm_version", vllm["vllm_version"]) == vllm["vllm_version"] == "0.33.0"
    wheels = wheelhouse(tmp_path / "wheels")
    run, (fits,) = check(
        tmp_path,
        {
            **VLLM_033,
            "python_version": "3.12.3",
            "driver_version": example.get("nvidia_cuda_driver_version", driver["nvidia_cuda_driver_version"]),
            "wheelhouse": str(wheels),
        },
    )
    assert fits.status == "ok", str(run)
