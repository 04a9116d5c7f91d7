"""release_requirements: the box's Python and driver against what a pinned vLLM release requires, read from
real package metadata in metadata-only wheels and metadata files (tests/metadata_wheels.py), from a
wheelhouse, a metadata directory and through pip's index report."""

import contextlib
import json
import re
import socket
from pathlib import Path

import yaml
from driver import run_playbook
from metadata_wheels import FIXTURES, metadata_files, metadata_wheel, releases, wheelhouse

ROOT = Path(__file__).resolve().parents[2]


@contextlib.contextmanager
def silent_index():
    """(an index URL, its socket): a local TCP port that takes connections (the kernel's backlog) and never
    answers, as an index behind a firewall that drops replies does."""
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen(16)
        yield f"http://127.0.0.1:{listener.getsockname()[1]}/simple", listener


def reached(listener):
    """Whether anything connected to the silent index."""
    listener.setblocking(False)
    try:
        listener.accept()[0].close()
    except BlockingIOError:
        return False
    return True


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
    # Keyed by the box's Python and machine, and a digest of the index arguments.
    assert [re.sub(r"-[0-9a-f]{16}[.]json$", "", p.name) for p in sorted(cache.iterdir())] == [
        "torch-2.14.0-cp312-x86_64",
        "vllm-0.33.0-cp312-x86_64",
    ], sorted(p.name for p in cache.iterdir())
    run, (missing,) = check(tmp_path, {**at, "version": "0.33.9", "cache": ""})
    assert missing.status == "failed" and missing.msg.startswith(
        "cannot read vllm 0.33.9's metadata for cp312 x86_64 from the package index: No matching "
        "distribution found for vllm==0.33.9; and no wheelhouse, metadata directory or cache is set: "
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


def test_a_wheel_for_another_machine_is_not_read(tmp_path):
    """A wheelhouse that holds the release for both machines: an x86_64 box reads the x86_64 wheels, an
    aarch64 box the aarch64 ones (here a made-up aarch64 torch 2.14.0 built for CUDA 12.9, which a 575
    driver runs). One that holds only aarch64 wheels has nothing for an x86_64 box, which goes on to the
    index (here a port that refuses)."""
    both = wheelhouse(tmp_path / "both")
    for name, metadata in releases(machine="aarch64").items():
        if name.startswith("torch-2.14.0-"):
            metadata = metadata.replace("]==13.0.3;", "]==12.9.1;")
        metadata_wheel(both / name, metadata)
    arm = wheelhouse(tmp_path / "arm", machine="aarch64")
    at = {
        **VLLM_033,
        "python_version": "3.12.3",
        "driver_version": "575.57.08",
        "pip_args": "--index-url http://127.0.0.1:9/simple",
    }
    run, (x86, aarch64, x86_from_arm, aarch64_from_arm) = check(
        tmp_path,
        {**at, "wheelhouse": str(both)},
        {**at, "wheelhouse": str(both), "machine": "aarch64"},
        {**at, "wheelhouse": str(arm), "driver_version": "580.95.05"},
        {**at, "wheelhouse": str(arm), "driver_version": "580.95.05", "machine": "aarch64"},
    )
    assert x86.status == "failed" and x86.msg == (
        "vllm 0.33.0 pins torch 2.14.0, built for CUDA 13.0.3, which needs NVIDIA driver branch 580 or "
        "newer; nvidia_cuda_driver_version is 575.57.08"
    ), str(run)
    assert aarch64.status == "ok", str(run)
    assert aarch64.facts["release_requirements"]["cuda"] == "12.9.1"
    assert aarch64.facts["release_requirements"]["sources"] == {"vllm": "wheelhouse", "torch": "wheelhouse"}
    assert x86_from_arm.status == "failed" and x86_from_arm.msg.startswith(
        "cannot read vllm 0.33.0's metadata for cp312 x86_64 from the package index: "
    ), str(run)
    assert "Connection refused" in x86_from_arm.msg and "\n" not in x86_from_arm.msg
    assert aarch64_from_arm.facts["release_requirements"]["sources"] == {
        "vllm": "wheelhouse",
        "torch": "wheelhouse",
    }, str(run)


def test_a_metadata_directory_answers_without_the_index(tmp_path):
    """An air-gapped controller: the operator's directory of the files an index serves beside each wheel
    (`<wheel>.metadata`, PEP 658), or of whole wheels, answers; the index (a silent port) is never reached and
    nothing is cached. A torch from PyTorch's own index carries a local version (2.14.0+cu130): the pin
    torch==2.14.0 takes it, as pip does."""
    files = metadata_files(tmp_path / "metadata")
    mixed = tmp_path / "mixed"
    mixed.mkdir()
    (vllm,) = (name for name in releases() if name.startswith("vllm-"))
    metadata_wheel(mixed / vllm, releases()[vllm])
    torch = (FIXTURES / "torch-2.14.0-cp312-manylinux_2_28_x86_64.METADATA").read_text()
    (mixed / "torch-2.14.0+cu130-cp312-cp312-manylinux_2_28_x86_64.whl.metadata").write_text(
        torch.replace("Version: 2.14.0\n", "Version: 2.14.0+cu130\n")
    )
    # The other machine's files are not read.
    metadata_files(tmp_path / "arm", machine="aarch64")
    cache = tmp_path / "cache"
    with silent_index() as (url, listener):
        at = {
            **VLLM_033,
            "python_version": "3.12.3",
            "driver_version": "580.95.05",
            "pip_args": f"--index-url {url}",
            "cache": str(cache),
            "timeout_s": 5,
        }
        run, (answered, from_mixed, arm) = check(
            tmp_path,
            {**at, "metadata_dir": str(files)},
            {**at, "metadata_dir": str(mixed)},
            {
                **at,
                "metadata_dir": str(tmp_path / "arm"),
                "pip_args": "--index-url http://127.0.0.1:9/simple",
            },
        )
        assert not reached(listener), str(run)
    assert answered.status == "ok", str(run)
    assert answered.facts["release_requirements"]["cuda"] == "13.0.3"
    assert answered.facts["release_requirements"]["sources"] == {
        "vllm": "metadata_dir",
        "torch": "metadata_dir",
    }
    assert from_mixed.status == "ok", str(run)
    assert from_mixed.facts["release_requirements"]["sources"] == {
        "vllm": "metadata_dir",
        "torch": "metadata_dir",
    }
    assert arm.status == "failed" and arm.msg.startswith("cannot read vllm 0.33.0's metadata"), str(run)
    assert not cache.exists()


def test_the_cache_is_kept_per_index(tmp_path):
    """The same pins read through another index are another answer: torch==2.14.0 is a CUDA 13 build on PyPI
    and a CUDA 12 one (2.14.0+cu128, here torch 2.8.0's requirements under that version) on PyTorch's cu128
    index. What one index said is never the other's: each reads its own, then its own cache."""
    cuda13 = wheelhouse(tmp_path / "cuda13")
    cuda12 = tmp_path / "cuda12"
    cuda12.mkdir()
    (vllm,) = (name for name in releases() if name.startswith("vllm-"))
    metadata_wheel(cuda12 / vllm, releases()[vllm])
    torch = (FIXTURES / "torch-2.8.0-cp311-manylinux_2_28_x86_64.METADATA").read_text()
    metadata_wheel(
        cuda12 / "torch-2.14.0+cu128-cp312-cp312-manylinux_2_28_x86_64.whl",
        torch.replace("Version: 2.8.0\n", "Version: 2.14.0+cu128\n"),
    )
    at = {**VLLM_033, "python_version": "3.12.3", "driver_version": "575.57.08", "cache": str(tmp_path / "c")}
    on13 = {**at, "pip_args": f"--no-index --find-links {cuda13}"}
    on12 = {**at, "pip_args": f"--no-index --find-links {cuda12}"}
    run, (first13, first12, again13, again12) = check(tmp_path, on13, on12, on13, on12)
    assert first13.status == again13.status == "failed" and "CUDA 13.0.3" in first13.msg, str(run)
    assert first12.status == "ok", str(run)
    facts = first12.facts["release_requirements"]
    assert (facts["cuda"], facts["min_driver_branch"]) == ("12.8.90", 525)
    assert facts["sources"] == {"vllm": "index", "torch": "index"}
    assert again12.facts["release_requirements"]["sources"] == {"vllm": "cache", "torch": "cache"}, str(run)
    assert len(list((tmp_path / "c").iterdir())) == 4


def test_an_index_that_does_not_answer_fails_within_the_timeout(tmp_path):
    """A cold cache and an index that takes the connection and never answers: the check gives up after
    timeout_s, with one line that says what it could not read, from where, and what to do."""
    wheels = wheelhouse(tmp_path / "wheels")
    with silent_index() as (url, _):
        at = {**VLLM_033, "python_version": "3.12.3", "driver_version": "580.95.05"}
        run, (before, silent) = check(
            tmp_path,
            {**at, "wheelhouse": str(wheels)},
            {**at, "pip_args": f"--index-url {url}", "timeout_s": 3, "cache": str(tmp_path / "cache")},
        )
    assert before.status == "ok", str(run)
    assert silent.status == "failed" and silent.msg == (
        "cannot read vllm 0.33.0's metadata for cp312 x86_64 from the package index: no answer within 3 s; "
        "nor from the controller's cache (no wheelhouse or metadata directory is set): put the wheels of "
        "vllm 0.33.0 and of the torch it pins in the wheelhouse (vllm_install_source: wheelhouse), or their "
        ".whl.metadata files in vllm_release_metadata_dir"
    ), str(run)
    assert 3 <= silent.ended - before.ended < 8, silent.ended - before.ended
