"""release_requirements (documented in library/release_requirements.py): what a pinned vLLM release needs of
a box, read on the controller from its package metadata; runs no module."""

from __future__ import annotations

import email.parser
import hashlib
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
from packaging.specifiers import InvalidSpecifier, SpecifierSet
from packaging.utils import InvalidWheelFilename, canonicalize_name, parse_wheel_filename
from packaging.version import InvalidVersion

ARGUMENT_SPEC = {
    "package": {"type": "str", "required": True},
    "version": {"type": "str", "required": True},
    "python": {"type": "str", "default": "python3"},
    "python_version": {"type": "str", "required": True},
    "machine": {"type": "str", "default": "x86_64"},
    "driver_version": {"type": "str", "default": ""},
    "pre_turing_gpus": {"type": "list", "elements": "str", "default": []},
    "wheelhouse": {"type": "path", "default": ""},
    "metadata_dir": {"type": "path", "default": ""},
    "pip_args": {"type": "str", "default": ""},
    "timeout_s": {"type": "int", "default": 120},
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
# pip's own settings of where it looks, from the controller's environment: part of the cache's key with the
# index arguments (a pip.conf is not: the cache is to be emptied where one changes).
PIP_INDEX_ENVIRONMENT = ("PIP_INDEX_URL", "PIP_EXTRA_INDEX_URL", "PIP_FIND_LINKS", "PIP_NO_INDEX")


class RequirementsError(Exception):
    """str() is the one-line reason."""


class NoAnswer(Exception):
    """The package index did not give the metadata; str() is why, in a few words."""


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


def python_rank(tag, python_version):
    """0 for a wheel tag of the box's CPython, 1 for one that runs on any of its major (py3, or a stable ABI
    no newer than the box's), None for one that does not run there."""
    major, minor = python_version.split(".")[:2]
    if tag.interpreter == f"cp{major}{minor}":
        return 0
    oldest = tag.interpreter[len(f"cp{major}") :]
    if tag.abi == "abi3" and tag.interpreter.startswith(f"cp{major}") and oldest.isdigit():
        return 1 if int(oldest) <= int(minor) else None
    if tag.abi == "none" and tag.interpreter in (f"py{major}", f"py{major}{minor}"):
        return 1
    return None


def machine_fits(tag, machine):
    """Whether a wheel tag's platform runs on a Linux box of that machine (glibc: Debian and Ubuntu)."""
    return tag.platform == "any" or bool(
        re.match(rf"^(manylinux(1|2010|2014|_\d+_\d+)|linux)_{re.escape(machine)}$", tag.platform)
    )


def local_metadata(directory, name, version, python_version, machine):
    """The metadata of name==version for the box's Python and machine in a directory of wheels or of the
    metadata files an index serves beside them (`<wheel file name>.metadata`, PEP 658), named as the wheel:
    one for the box's Python where wheels are per Python, never one for another machine; or None."""
    if not directory or not os.path.isdir(directory):
        return None
    try:
        wanted = SpecifierSet(f"=={version}")  # takes a local version too, as pip does (2.14.0+cu130)
    except InvalidSpecifier:
        raise RequirementsError(f"{name} {version}: {version} is not a version") from None
    found = []
    for entry in os.listdir(directory):
        wheel_name = entry[: -len(".metadata")] if entry.endswith(".whl.metadata") else entry
        try:
            wheel, wheel_version, _, tags = parse_wheel_filename(wheel_name)
        except (InvalidWheelFilename, InvalidVersion):
            continue
        if wheel != canonicalize_name(name) or not wanted.contains(wheel_version, prereleases=True):
            continue
        ranks = [python_rank(tag, python_version) for tag in tags if machine_fits(tag, machine)]
        ranks = [rank for rank in ranks if rank is not None]
        if ranks:
            found.append((min(ranks), wheel_version, entry != wheel_name, entry))
    if not found:
        return None
    # The box's own Python first, then the newest (a local version before none), then a metadata file.
    found.sort(key=lambda candidate: (not candidate[2], candidate[3]))
    found.sort(key=lambda candidate: candidate[1], reverse=True)
    found.sort(key=lambda candidate: candidate[0])
    path = os.path.join(directory, found[0][3])
    try:
        if path.endswith(".metadata"):
            with open(path, encoding="utf-8") as text:
                return parse_metadata(text.read())
        with zipfile.ZipFile(path) as wheel:
            member = next(
                n for n in wheel.namelist() if n.endswith(".dist-info/METADATA") and n.count("/") == 1
            )
            return parse_metadata(wheel.read(member).decode("utf-8"))
    except (OSError, UnicodeDecodeError, zipfile.BadZipFile, StopIteration) as error:
        raise RequirementsError(
            f"cannot read {name} {version}'s metadata from {path}: {str(error) or 'it holds no METADATA'}"
        ) from None


# How pip says, in a warning, that an index did not answer (its last line then says only that no version
# was found): "... after connection broken by 'NewConnectionError("HTTPConnection(host='127.0.0.1', port=9):
# Failed to establish a new connection: [Errno 111] Connection refused")': /simple/vllm/".
PIP_BROKEN_CONNECTION = re.compile(r"connection broken by '[A-Za-z]+\(\"?(.*?)\"?\)': \S+$")


def pip_failure(stderr):
    """Why pip failed, in one line: its last line, and how the index did not answer where it did not."""
    lines = [line.strip() for line in stderr.splitlines() if line.strip()]
    why = re.sub(r"^ERROR: ", "", lines[-1]) if lines else "pip failed with no message"
    broken = [found.group(1) for found in map(PIP_BROKEN_CONNECTION.search, lines) if found]
    return f"{why} (the index did not answer: {broken[-1]})" if broken else why


def index_metadata(name, version, python_version, machine, pip_args, timeout_s):
    """The metadata of name==version's wheel for the box, as pip reads it from the package index (its
    metadata only, where the index serves it apart: no wheel is downloaded whole), within timeout_s; raises
    NoAnswer."""
    with tempfile.TemporaryDirectory(prefix="specfleet-requirements-") as target:
        argv = [
            sys.executable, "-m", "pip", "install", "--dry-run", "--no-deps", "--ignore-installed",
            "--ignore-requires-python", "--quiet", "--only-binary=:all:", "--target", target,
            "--platform", f"manylinux_2_28_{machine}", "--platform", f"manylinux2014_{machine}",
            "--python-version", ".".join(python_version.split(".")[:2]), "--implementation", "cp",
            "--timeout", str(timeout_s), "--retries", "1", "--disable-pip-version-check",
            "--report", "-", f"{name}=={version}", *shlex.split(pip_args),
        ]  # fmt: skip
        try:
            done = subprocess.run(argv, capture_output=True, text=True, check=False, timeout=timeout_s)
        except subprocess.TimeoutExpired:
            raise NoAnswer(f"no answer within {timeout_s} s") from None
    if done.returncode != 0:
        raise NoAnswer(pip_failure(done.stderr))
    try:
        metadata = json.loads(done.stdout)["install"][0]["metadata"]
    except (ValueError, LookupError, TypeError):
        raise NoAnswer(f"pip's report is not one install: {done.stdout.strip()[:200]!r}") from None
    return {
        "name": metadata["name"],
        "version": metadata["version"],
        "requires_python": metadata.get("requires_python") or "",
        "requires_dist": metadata.get("requires_dist") or [],
    }


def index_digest(pip_args):
    """Where pip looks, as a short digest: its arguments, and pip's settings of its index in the controller's
    environment."""
    where = [shlex.split(pip_args), [os.environ.get(name, "") for name in PIP_INDEX_ENVIRONMENT]]
    return hashlib.sha256(json.dumps(where).encode()).hexdigest()[:16]


def either(items):
    """'a', 'a or b', 'a, b or c'."""
    return " or ".join([", ".join(items[:-1]), items[-1]] if len(items) > 1 else items)


def unanswered(name, version, args, why):
    """The one line for metadata that no source gave: what, from where, why, and what to do."""
    looked = [
        f"{what} {path}" + ("" if os.path.isdir(path) else " (which does not exist)")
        for what, path in (
            ("the wheelhouse", args["wheelhouse"]),
            ("the metadata directory", args["metadata_dir"]),
        )
        if path
    ] + (["the controller's cache"] if args["cache"] else [])
    where = (
        f"nor from {either(looked)}" if looked else "and no wheelhouse, metadata directory or cache is set"
    )
    if looked and not args["wheelhouse"] and not args["metadata_dir"]:
        where += " (no wheelhouse or metadata directory is set)"
    return (
        f"cannot read {name} {version}'s metadata for {python_tag(args['python_version'])} {args['machine']} "
        f"from the package index: {why}; {where}: put the wheels of {args['package']} {args['version']} and "
        "of the torch it pins in the wheelhouse (vllm_install_source: wheelhouse), or their .whl.metadata "
        "files in vllm_release_metadata_dir"
    )


def read(name, version, args, check_mode):
    """(metadata, where from): the wheelhouse's wheel, else the metadata directory's file or wheel, else the
    controller's cache of what this index said, else the index (then kept in the cache: a release's metadata
    never changes). Each only for the box's Python and machine."""
    for source in ("wheelhouse", "metadata_dir"):
        found = local_metadata(args[source], name, version, args["python_version"], args["machine"])
        if found:
            return found, source
    # Per index: the same pin is another build on another index (torch 2.14.0 on PyPI and on PyTorch's cu128).
    tag, digest = python_tag(args["python_version"]), index_digest(args["pip_args"])
    key = f"{canonicalize_name(name)}-{version}-{tag}-{args['machine']}-{digest}"
    cached = os.path.join(args["cache"], f"{key}.json") if args["cache"] else ""
    try:
        with open(cached, encoding="utf-8") as kept:
            return json.load(kept), "cache"
    except (OSError, ValueError):
        pass
    try:
        found = index_metadata(
            name, version, args["python_version"], args["machine"], args["pip_args"], args["timeout_s"]
        )
    except NoAnswer as why:
        raise RequirementsError(unanswered(name, version, args, why)) from None
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
        if args["timeout_s"] < 1:
            return {
                **result,
                "failed": True,
                "msg": f"timeout_s is {args['timeout_s']}: give the index 1 s or more",
            }
        try:
            facts = requirements(args, self._task.check_mode)
        except RequirementsError as error:
            return {**result, "failed": True, "msg": str(error)}
        return {**result, "changed": False, "ansible_facts": {"release_requirements": facts}}
