"""release_requirements (documented in library/release_requirements.py): what a pinned vLLM release needs of
a box, read on the controller from its package metadata; runs no module."""

from __future__ import annotations

import email.parser
import json
import os
import re
import shlex
import subprocess
import sys
import tempfile
import zipfile

from ansible.plugins.action import ActionBase
from packaging.requirements import InvalidRequirement, Requirement
from packaging.specifiers import SpecifierSet
from packaging.utils import canonicalize_name

ARGUMENT_SPEC = {
    "package": {"type": "str", "required": True},
    "version": {"type": "str", "required": True},
    "python": {"type": "str", "default": "python3"},
    "python_version": {"type": "str", "required": True},
    "machine": {"type": "str", "default": "x86_64"},
    "driver_version": {"type": "str", "default": ""},
    "pre_turing_gpus": {"type": "list", "elements": "str", "default": []},
    "wheelhouse": {"type": "path", "default": ""},
    "pip_args": {"type": "str", "default": ""},
    "cache": {"type": "path", "default": ""},
}

# The oldest driver branch that runs each CUDA major (NVIDIA's CUDA compatibility guide, "minor version
# compatibility": every toolkit of a major runs on its first release's driver branch, Linux x86_64 and
# aarch64). A table only where no package metadata says it.
CUDA_MIN_DRIVER_BRANCH = {11: 450, 12: 525, 13: 580}
# The oldest GPU generation a CUDA major builds for, where the PCI bus can tell (gpu_bus: before Turing or
# not): CUDA 13 dropped Maxwell, Pascal and Volta (NVIDIA's CUDA 13.0 release notes).
CUDA_FIRST_GENERATION = {13: "Turing"}
# How a torch wheel names the CUDA it was built with: the CUDA 13 wheels pin NVIDIA's cuda-toolkit, the
# CUDA 12 (and 11) wheels its runtime package, one per major (nvidia-cuda-runtime-cu12).
CUDA_PACKAGES = re.compile(r"^(cuda-toolkit|nvidia-cuda-runtime(-cu\d+)?)$")


class RequirementsError(Exception):
    """str() is the one-line reason."""


def parse_metadata(text):
    """{name, version, requires_python, requires_dist} of a METADATA file's text."""
    message = email.parser.Parser().parsestr(text, headersonly=True)
    return {
        "name": message["Name"],
        "version": message["Version"],
        "requires_python": message["Requires-Python"] or "",
        "requires_dist": message.get_all("Requires-Dist") or [],
    }


def environment(python_version, machine):
    """The marker environment of a Linux box's CPython."""
    return {
        "python_version": ".".join(python_version.split(".")[:2]),
        "python_full_version": python_version,
        "platform_machine": machine,
        "platform_system": "Linux",
        "sys_platform": "linux",
        "os_name": "posix",
        "implementation_name": "cpython",
        "platform_python_implementation": "CPython",
        "extra": "",
    }


def pins(metadata, python_version, machine):
    """{canonical name: version} of the requirements pinned with == that apply on the box."""
    found = {}
    for line in metadata["requires_dist"]:
        try:
            requirement = Requirement(line)
        except InvalidRequirement:
            continue
        if requirement.marker and not requirement.marker.evaluate(environment(python_version, machine)):
            continue
        exact = [spec.version for spec in requirement.specifier if spec.operator in ("==", "===")]
        if exact:
            found[canonicalize_name(requirement.name)] = exact[0]
    return found


def cuda_of(metadata, python_version, machine):
    """The CUDA version a torch wheel's metadata pins, or None (a build without CUDA)."""
    for name, version in pins(metadata, python_version, machine).items():
        if CUDA_PACKAGES.match(name):
            return version
    return None


def python_tag(python_version):
    return "cp" + "".join(python_version.split(".")[:2])


def wheel_metadata(wheelhouse, name, version, python_version):
    """The METADATA of name==version's wheel in a wheelhouse directory (one for the box's Python, where the
    wheels are per Python), or None where there is none."""
    if not wheelhouse or not os.path.isdir(wheelhouse):
        return None
    prefix = f"{canonicalize_name(name).replace('-', '_')}-{version}-"
    wheels = sorted(
        entry
        for entry in os.listdir(wheelhouse)
        if entry.lower().startswith(prefix.lower()) and entry.endswith(".whl")
    )
    tag = python_tag(python_version)
    wheels = [w for w in wheels if f"-{tag}-" in w] or [w for w in wheels if "-cp3" not in w or "-abi3-" in w]
    if not wheels:
        return None
    with zipfile.ZipFile(os.path.join(wheelhouse, wheels[0])) as wheel:
        member = next(n for n in wheel.namelist() if n.endswith(".dist-info/METADATA") and n.count("/") == 1)
        return parse_metadata(wheel.read(member).decode("utf-8"))


def index_metadata(name, version, python_version, machine, pip_args):
    """The metadata of name==version's wheel for the box, as pip reads it from the package index (its
    metadata only, where the index serves it apart: no wheel is downloaded whole)."""
    with tempfile.TemporaryDirectory(prefix="specfleet-requirements-") as target:
        argv = [
            sys.executable, "-m", "pip", "install", "--dry-run", "--no-deps", "--ignore-installed",
            "--ignore-requires-python", "--quiet", "--only-binary=:all:", "--target", target,
            "--platform", f"manylinux_2_28_{machine}", "--platform", f"manylinux2014_{machine}",
            "--python-version", ".".join(python_version.split(".")[:2]), "--implementation", "cp",
            "--report", "-", f"{name}=={version}", *shlex.split(pip_args),
        ]  # fmt: skip
        done = subprocess.run(argv, capture_output=True, text=True, check=False)
    if done.returncode != 0:
        why = (done.stderr.strip().splitlines() or ["pip failed"])[-1]
        raise RequirementsError(f"cannot read {name} {version}'s metadata from the package index: {why}")
    report = json.loads(done.stdout)
    metadata = report["install"][0]["metadata"]
    return {
        "name": metadata["name"],
        "version": metadata["version"],
        "requires_python": metadata.get("requires_python") or "",
        "requires_dist": metadata.get("requires_dist") or [],
    }


def read(name, version, args, check_mode):
    """(metadata, where from): the wheelhouse's wheel, else the controller's cache of what the index said,
    else the index (then kept in the cache: a release's metadata never changes)."""
    found = wheel_metadata(args["wheelhouse"], name, version, args["python_version"])
    if found:
        return found, "wheelhouse"
    key = f"{canonicalize_name(name)}-{version}-{python_tag(args['python_version'])}-{args['machine']}.json"
    cached = os.path.join(args["cache"], key) if args["cache"] else ""
    try:
        with open(cached, encoding="utf-8") as kept:
            return json.load(kept), "cache"
    except (OSError, ValueError):
        pass
    found = index_metadata(name, version, args["python_version"], args["machine"], args["pip_args"])
    if cached and not check_mode:
        os.makedirs(args["cache"], exist_ok=True)
        with tempfile.NamedTemporaryFile("w", dir=args["cache"], delete=False, suffix=".tmp") as staged:
            json.dump(found, staged)
        os.replace(staged.name, cached)
    return found, "index"


def requirements(args, check_mode=False):
    """The release's requirements of the box; raises RequirementsError with the first one it does not meet."""
    package, version, python_version = args["package"], args["version"], args["python_version"]
    release, source = read(package, version, args, check_mode)
    facts = {
        "package": package,
        "version": version,
        "requires_python": release["requires_python"],
        "python_version": python_version,
        "torch": None,
        "cuda": None,
        "min_driver_branch": None,
        "sources": {package: source},
    }
    wanted = SpecifierSet(release["requires_python"])
    if not wanted.contains(python_version, prereleases=True):
        raise RequirementsError(
            f"{package} {version} requires Python {release['requires_python']}; the box's {args['python']} "
            f"is {python_version}: set vllm_python to an interpreter that fits (e.g. python3.11 from the "
            "distribution, with vllm_python_packages to install it)"
        )
    if not args["driver_version"]:
        return facts
    torch = pins(release, python_version, args["machine"]).get("torch")
    if not torch:
        raise RequirementsError(f"{package} {version} pins no torch: the CUDA it needs cannot be read")
    metadata, facts["sources"]["torch"] = read("torch", torch, args, check_mode)
    cuda = cuda_of(metadata, python_version, args["machine"])
    facts.update(torch=torch, cuda=cuda)
    if not cuda:
        raise RequirementsError(f"{package} {version} pins torch {torch}, a build without CUDA")
    major = int(cuda.split(".")[0])
    if major not in CUDA_MIN_DRIVER_BRANCH:
        raise RequirementsError(
            f"{package} {version} pins torch {torch}, built for CUDA {cuda}, whose oldest driver branch is "
            "not known here (CUDA_MIN_DRIVER_BRANCH in action_plugins/release_requirements.py)"
        )
    facts["min_driver_branch"] = CUDA_MIN_DRIVER_BRANCH[major]
    if not re.match(r"^\d+\.", args["driver_version"]):
        raise RequirementsError(f"nvidia_cuda_driver_version={args['driver_version']} is not a version")
    branch = int(args["driver_version"].split(".")[0])
    if branch < facts["min_driver_branch"]:
        raise RequirementsError(
            f"{package} {version} pins torch {torch}, built for CUDA {cuda}, which needs NVIDIA driver "
            f"branch {facts['min_driver_branch']} or newer; nvidia_cuda_driver_version is "
            f"{args['driver_version']}"
        )
    if major in CUDA_FIRST_GENERATION and args["pre_turing_gpus"]:
        raise RequirementsError(
            f"{package} {version} pins torch {torch}, built for CUDA {cuda}, which runs on "
            f"{CUDA_FIRST_GENERATION[major]} and newer GPUs; the PCI bus shows "
            f"{', '.join(sorted(set(args['pre_turing_gpus'])))}, older"
        )
    return facts


class ActionModule(ActionBase):
    TRANSFERS_FILES = False
    _requires_connection = False

    def run(self, tmp=None, task_vars=None):
        result = super().run(tmp, task_vars)
        _, args = self.validate_argument_spec(argument_spec=ARGUMENT_SPEC)
        try:
            facts = requirements(args, self._task.check_mode)
        except RequirementsError as error:
            return {**result, "failed": True, "msg": str(error)}
        return {**result, "changed": False, "ansible_facts": {"release_requirements": facts}}
