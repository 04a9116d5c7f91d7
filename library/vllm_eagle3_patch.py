#!/usr/bin/python
"""Ansible module: the DeepseekV3 / Kimi-K2.5 EAGLE-3 patch for vLLM releases that lack it (<= 0.17.x)."""

from __future__ import annotations

DOCUMENTATION = r"""
---
module: vllm_eagle3_patch
short_description: Apply or revert the DeepseekV3 / Kimi-K2.5 EAGLE-3 patch on an installed vLLM <= 0.17.x
description:
  - vLLM up to 0.17.x refuses EAGLE-3 on DeepseekV3 and Kimi-K2.5 targets (model-type whitelist, no
    C(SupportsEagle3) on C(DeepseekV2ForCausalLM), Kimi-K2.5's C(media_placeholder_token_id)). vLLM 0.18.0
    fixed all three; each patch in I(patches) backports that fix to one release line, as a unified diff.
  - Reads the installed version from the package itself (C(vllm/_version.py), else the C(.dist-info) next to
    the package) and nothing is imported. vLLM 0.18 and later report C(applicable=false) and change nothing.
  - Exact about content, all files or none. Every file the patch touches must hash (sha256) to the
    upstream file or to the patched file recorded in the patch header; anything else (a locally modified
    or unknown build) is refused with one line and nothing is written. The result of applying the hunks is
    checked against the recorded patched hash before anything is written; a failure while writing puts
    back the files already written.
  - O(state=present) keeps byte-exact backups (C(<file>.specfleet-orig)) when O(backup=true), writes the
    patched files and byte-compiles them. O(state=absent) restores each file from its backup, or by applying
    the patch in reverse when there is none, verifies the upstream hash, removes the backups and
    byte-compiles the restored files.
  - Idempotent; check mode reports what would change; diff mode shows the per-file diff.
options:
  vllm_path:
    description:
      - The installed C(vllm) package directory (the one holding C(__init__.py)).
      - One of I(vllm_path) and I(venv) is required.
    type: path
  venv:
    description:
      - A virtualenv whose C(lib/python3*/site-packages/vllm) is the package, found without running the
        virtualenv's Python. Where it has none, the module fails with one line, and in check mode returns
        C(skipped) (a release the same run would install is not there yet).
    type: path
  state:
    description: C(present) patches, C(absent) restores the upstream files.
    type: str
    choices: [present, absent]
    default: present
  backup:
    description: Keep a byte-exact copy of each upstream file next to it as C(<file>.specfleet-orig).
    type: bool
    default: true
  patches:
    description:
      - The text of each available patch (one per vLLM release line), e.g. read on the controller with
        C(query('ansible.builtin.file', ...)). The role C(vllm_eagle3_patch) passes the ones in its C(files/).
      - "A patch is a unified diff (paths C(a/vllm/...) C(b/vllm/...), usable with C(patch -p1) from
        site-packages) preceded by header lines: C(range: 0.17) (the release line it serves),
        C(verified: 0.17.0 0.17.1) and one C(sha256: <path> <upstream sha256> <patched sha256>) per file."
    type: list
    elements: str
    required: true
extends_documentation_fragment:
  - action_common_attributes
attributes:
  check_mode:
    support: full
  diff_mode:
    support: full
  platform:
    platforms: posix
notes:
  - The box's Python is enough (stdlib only). Patched files are byte-compiled with the Python that runs the
    module; a stale C(.pyc) of another interpreter is ignored by Python anyway (source mtime and size).
author:
  - specfleet maintainers
"""

EXAMPLES = r"""
- name: Patch the vLLM of the service's virtualenv
  vllm_eagle3_patch:
    vllm_path: /opt/vllm/venv/lib/python3.11/site-packages/vllm
    patches: "{{ query('ansible.builtin.file', 'vllm-0.16.diff', 'vllm-0.17.diff', rstrip=false) }}"
  register: eagle3_patch

- name: Patch the vLLM of a virtualenv, wherever its site-packages is
  vllm_eagle3_patch:
    venv: /opt/vllm/releases/vllm-0.17.1
    patches: "{{ query('ansible.builtin.file', 'vllm-0.16.diff', 'vllm-0.17.diff', rstrip=false) }}"

- name: Put the upstream files back
  vllm_eagle3_patch:
    vllm_path: /opt/vllm/venv/lib/python3.11/site-packages/vllm
    patches: "{{ query('ansible.builtin.file', 'vllm-0.16.diff', 'vllm-0.17.diff', rstrip=false) }}"
    state: absent
"""

RETURN = r"""
vllm_path:
  description: The C(vllm) package directory patched, as given or found in I(venv).
  returned: success, except when skipped
  type: str
  sample: /opt/vllm/releases/vllm-0.17.1/lib/python3.11/site-packages/vllm
skipped:
  description: True in check mode when I(venv) holds no vllm package yet.
  returned: when skipped
  type: bool
vllm_version:
  description: The installed vLLM version, as the package states it.
  returned: success
  type: str
  sample: 0.17.1
applicable:
  description: Whether a patch in I(patches) serves this version (false on 0.18 and later).
  returned: success
  type: bool
patch:
  description: The release line of the patch used, e.g. C(0.17); empty when not applicable.
  returned: success
  type: str
verified:
  description: The releases of that line the patch was written and checked against.
  returned: when applicable
  type: list
  elements: str
  sample: ["0.17.0", "0.17.1"]
patched_files:
  description: Files (relative to site-packages) written in this run, or that would be in check mode.
  returned: success
  type: list
  elements: str
  sample: [vllm/config/speculative.py, vllm/model_executor/models/deepseek_v2.py]
files:
  description:
    - State of every file the patch touches after the run (before it, in check mode).
    - C(upstream) or C(patched).
  returned: when applicable
  type: dict
  sample: {"vllm/config/speculative.py": "patched"}
diff:
  description: Per-file before/after text, in diff mode.
  returned: diff mode, when something changes
  type: list
  elements: dict
"""

import glob
import hashlib
import os
import py_compile
import re
import shutil
import tempfile

from ansible.module_utils.basic import AnsibleModule
from ansible.module_utils.vllm_version import parse_vllm_version

BACKUP_SUFFIX = ".specfleet-orig"
# The first release that carries the fix upstream (PR #36361).
FIXED_UPSTREAM = (0, 18)
HUNK_HEADER = re.compile(r"^@@ -(\d+)(?:,(\d+))? \+(\d+)(?:,(\d+))? @@")


class PatchError(Exception):
    """A patch that cannot be used, or content that is not what the patch expects."""


def sha256_bytes(data):
    return hashlib.sha256(data).hexdigest()


def version_key(version):
    """(major, minor, micro) of a version string such as 0.17.1, 0.33.0+cpu or 0.18.0rc1."""
    try:
        return parse_vllm_version(version)
    except ValueError:
        raise PatchError(f"cannot read a version from {version!r}") from None


def read_version(vllm_path):
    """The version the package states: vllm/_version.py, else a vllm*.dist-info next to the package."""
    version_file = os.path.join(vllm_path, "_version.py")
    if os.path.isfile(version_file):
        with open(version_file, encoding="utf-8") as handle:
            match = re.search(
                r"""^(?:__version__\s*=\s*)?version\s*=\s*['"]([^'"]+)['"]""", handle.read(), re.M
            )
        if match:
            return match.group(1)
    parent = os.path.dirname(os.path.normpath(vllm_path))
    for name in sorted(os.listdir(parent)):
        if re.match(r"^vllm(-cpu)?-[^-]+\.dist-info$", name, re.I):
            metadata = os.path.join(parent, name, "METADATA")
            if os.path.isfile(metadata):
                with open(metadata, encoding="utf-8") as handle:
                    match = re.search(r"^Version:\s*(\S+)", handle.read(), re.M)
                if match:
                    return match.group(1)
    raise PatchError(
        f"{vllm_path}: no _version.py and no vllm dist-info next to it, cannot tell the vLLM version"
    )


def parse_patch(text):
    """Header fields and per-file hunks of one patch; raises PatchError on anything unexpected."""
    lines = text.splitlines(keepends=True)
    patch = {"range": None, "verified": [], "files": []}
    hashes = {}
    index = 0
    while index < len(lines) and not lines[index].startswith("--- "):
        line = lines[index].strip()
        if line.startswith("range:"):
            patch["range"] = line.split(":", 1)[1].strip()
        elif line.startswith("verified:"):
            patch["verified"] = line.split(":", 1)[1].split()
        elif line.startswith("sha256:"):
            fields = line.split(":", 1)[1].split()
            if len(fields) != 3:
                raise PatchError(f"bad sha256 header line: {line}")
            hashes[fields[0]] = (fields[1], fields[2])
        index += 1
    if not patch["range"]:
        raise PatchError("patch header has no 'range:' line")
    while index < len(lines):
        if (
            not lines[index].startswith("--- ")
            or index + 1 >= len(lines)
            or not lines[index + 1].startswith("+++ ")
        ):
            raise PatchError(
                f"patch {patch['range']}: expected a '--- a/...' '+++ b/...' pair, got {lines[index]!r}"
            )
        old = lines[index][4:].split("\t")[0].strip()
        new = lines[index + 1][4:].split("\t")[0].strip()
        if not (old.startswith("a/") and new.startswith("b/") and old[2:] == new[2:]):
            raise PatchError(f"patch {patch['range']}: unexpected file names {old} {new}")
        path = old[2:]
        if path not in hashes:
            raise PatchError(f"patch {patch['range']}: no sha256 header line for {path}")
        index += 2
        hunks = []
        while index < len(lines) and lines[index].startswith("@@"):
            match = HUNK_HEADER.match(lines[index])
            if not match:
                raise PatchError(f"patch {patch['range']}: bad hunk header {lines[index]!r}")
            old_start, new_start = int(match.group(1)), int(match.group(3))
            old_count = int(match.group(2)) if match.group(2) is not None else 1
            new_count = int(match.group(4)) if match.group(4) is not None else 1
            index += 1
            body = []
            seen_old = seen_new = 0
            while index < len(lines) and (
                seen_old < old_count or seen_new < new_count or lines[index].startswith("\\")
            ):
                line = lines[index]
                tag, content = line[:1], line[1:]
                if tag == "\\":  # "\ No newline at end of file": the previous line has no newline
                    previous_tag, previous = body[-1]
                    body[-1] = (previous_tag, previous.rstrip("\n"))
                elif tag in (" ", "-", "+"):
                    if not content.endswith("\n"):
                        content += "\n"  # the patch text itself lost its last newline
                    body.append((tag, content))
                    seen_old += tag in " -"
                    seen_new += tag in " +"
                else:
                    raise PatchError(f"patch {patch['range']}: bad hunk line {line!r} in {path}")
                index += 1
            if seen_old != old_count or seen_new != new_count:
                raise PatchError(f"patch {patch['range']}: truncated hunk in {path}")
            hunks.append({"old_start": old_start, "new_start": new_start, "lines": body})
        if not hunks:
            raise PatchError(f"patch {patch['range']}: no hunks for {path}")
        pre, post = hashes.pop(path)
        patch["files"].append({"path": path, "pre": pre, "post": post, "hunks": hunks})
    if hashes:
        raise PatchError(
            f"patch {patch['range']}: sha256 lines for files without hunks: {', '.join(sorted(hashes))}"
        )
    if not patch["files"]:
        raise PatchError(f"patch {patch['range']}: no files")
    return patch


def apply_hunks(data, hunks, reverse=False):
    """Apply hunks to bytes exactly at their line numbers (no fuzz, no offset); reverse undoes them."""
    source = data.decode("utf-8").splitlines(keepends=True)
    remove, add = ("+", "-") if reverse else ("-", "+")
    output, cursor = [], 0
    for hunk in hunks:
        expected = [text for tag, text in hunk["lines"] if tag in (" ", remove)]
        replacement = [text for tag, text in hunk["lines"] if tag in (" ", add)]
        # Line numbers of the side being replaced: the new side's when undoing.
        start = (hunk["new_start"] if reverse else hunk["old_start"]) - 1
        if not expected:
            start += 1  # a pure insertion: "-N,0" means after line N
        if start < cursor or source[start : start + len(expected)] != expected:
            raise PatchError(f"hunk at line {start + 1} does not match")
        output.extend(source[cursor:start])
        output.extend(replacement)
        cursor = start + len(expected)
    output.extend(source[cursor:])
    return "".join(output).encode("utf-8")


def select_patch(patches, version):
    """The parsed patch whose range (major.minor) is the version's release line, or None."""
    line = ".".join(str(part) for part in version_key(version)[:2])
    for text in patches:
        patch = parse_patch(text)
        if patch["range"] == line:
            return patch
    return None


def read_bytes(path):
    try:
        with open(path, "rb") as handle:
            return handle.read()
    except FileNotFoundError:
        return None


def plan(vllm_path, patch, state):
    """Per file: its state now and its new bytes when it must change; PatchError on unknown content."""
    entries, unknown = [], []
    for item in patch["files"]:
        if not item["path"].startswith("vllm/"):
            raise PatchError(f"patch {patch['range']}: {item['path']} is outside the vllm package")
        full = os.path.join(vllm_path, item["path"][len("vllm/") :])
        data = read_bytes(full)
        digest = sha256_bytes(data) if data is not None else None
        backup = read_bytes(full + BACKUP_SUFFIX)
        entry = {
            "path": item["path"],
            "full": full,
            "before": data,
            "after": None,
            # Only a backup that is the upstream file byte for byte is used (and removed by absent).
            "backup": backup if backup is not None and sha256_bytes(backup) == item["pre"] else None,
        }
        if digest == item["pre"]:
            entry["state"] = "upstream"
            if state == "present":
                entry["after"] = apply_hunks(data, item["hunks"])
        elif digest == item["post"]:
            entry["state"] = "patched"
            if state == "absent":
                if entry["backup"] is not None:
                    entry["after"] = entry["backup"]
                else:
                    entry["after"] = apply_hunks(data, item["hunks"], reverse=True)
        else:
            unknown.append(f"{item['path']} ({'missing' if data is None else 'sha256 ' + digest[:12]})")
            continue
        if entry["after"] is not None:
            want = item["post"] if state == "present" else item["pre"]
            if sha256_bytes(entry["after"]) != want:
                raise PatchError(f"{item['path']}: the {state} result does not hash to the recorded sha256")
        entries.append(entry)
    if unknown:
        raise PatchError(
            f"vLLM files match neither upstream nor the patch {patch['range']}: {', '.join(unknown)}; "
            "a locally modified or unknown build, nothing was changed"
        )
    return entries


def write_file(path, data, mode_from, move):
    """Write `data` to `path` through a temporary file next to it, with the mode of `mode_from`.

    `move(tmp, path)` puts it in place: module.atomic_move in the module (it also keeps an existing file's
    owner and SELinux context), os.replace when run() is called without a module.
    """
    fd, tmp = tempfile.mkstemp(dir=os.path.dirname(path), prefix=".specfleet-")
    try:
        with os.fdopen(fd, "wb") as handle:
            handle.write(data)
        if mode_from and os.path.exists(mode_from):
            shutil.copymode(mode_from, tmp)
        move(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise
    if mode_from and os.path.exists(mode_from):
        # atomic_move gives a file it creates (a backup) the umask's mode; the backup keeps the original's.
        shutil.copymode(mode_from, path)


def commit(entries, state, backup, move=os.replace):
    """Write backups, then every file; on any failure put back the files already written."""
    changing = [e for e in entries if e["after"] is not None]
    if state == "present" and backup:
        for entry in changing:
            write_file(entry["full"] + BACKUP_SUFFIX, entry["before"], entry["full"], move)
            if read_bytes(entry["full"] + BACKUP_SUFFIX) != entry["before"]:
                raise PatchError(f"backup of {entry['path']} does not read back identical")
    written = []
    try:
        for entry in changing:
            write_file(entry["full"], entry["after"], entry["full"], move)
            written.append(entry)
        for entry in changing:
            py_compile.compile(entry["full"], doraise=True)
    except BaseException:
        for entry in written:
            write_file(entry["full"], entry["before"], entry["full"], move)
        raise
    if state == "absent":
        for entry in entries:
            if entry["backup"] is not None:
                os.unlink(entry["full"] + BACKUP_SUFFIX)


def run(vllm_path, patches, state="present", backup=True, check_mode=False, move=os.replace):
    """The module's work, without AnsibleModule: returns the result dict, raises PatchError.

    `move(tmp, dest)` puts each written file in place; main passes module.atomic_move.
    """
    if not os.path.isfile(os.path.join(vllm_path, "__init__.py")):
        raise PatchError(f"{vllm_path} is not an installed vllm package (no __init__.py)")
    version = read_version(vllm_path)
    result = {
        "changed": False,
        "vllm_version": version,
        "applicable": False,
        "patch": "",
        "patched_files": [],
    }
    if version_key(version)[:2] >= FIXED_UPSTREAM:
        result["msg"] = (
            f"vLLM {version} carries the EAGLE-3 DeepseekV3/Kimi-K2.5 support upstream; nothing to do"
        )
        return result
    patch = select_patch(patches, version)
    if patch is None:
        result["msg"] = (
            f"vLLM {version}: no patch for this release line; "
            "EAGLE-3 on DeepseekV3/Kimi targets will be refused"
        )
        result["warning"] = result["msg"]
        return result
    entries = plan(vllm_path, patch, state)
    # Leftover backups of files already upstream are removed by state=absent too.
    stale = [e for e in entries if state == "absent" and e["after"] is None and e["backup"] is not None]
    changing = [e for e in entries if e["after"] is not None]
    result.update(applicable=True, patch=patch["range"], verified=patch["verified"])
    result["patched_files"] = [e["path"] for e in changing]
    result["changed"] = bool(changing or stale)
    result["diff"] = [
        {
            "before_header": e["path"],
            "after_header": e["path"],
            "before": e["before"].decode("utf-8"),
            "after": e["after"].decode("utf-8"),
        }
        for e in changing
    ]
    new_state = "patched" if state == "present" else "upstream"
    result["files"] = {
        e["path"]: (new_state if e["after"] is not None and not check_mode else e["state"]) for e in entries
    }
    if not check_mode and result["changed"]:
        commit(entries, state, backup, move)
    return result


def find_in_venv(venv):
    """The vllm package of a virtualenv (lib/python3.X/site-packages/vllm, or lib64), or None."""
    pattern = os.path.join(glob.escape(venv), "lib*", "python3*", "site-packages", "vllm", "__init__.py")
    found = sorted(glob.glob(pattern))
    return os.path.dirname(found[0]) if found else None


def main():
    module = AnsibleModule(
        argument_spec={
            "vllm_path": {"type": "path"},
            "venv": {"type": "path"},
            "state": {"type": "str", "choices": ["present", "absent"], "default": "present"},
            "backup": {"type": "bool", "default": True},
            "patches": {"type": "list", "elements": "str", "required": True},
        },
        mutually_exclusive=[("vllm_path", "venv")],
        required_one_of=[("vllm_path", "venv")],
        supports_check_mode=True,
    )
    params = module.params
    vllm_path = params["vllm_path"] or find_in_venv(params["venv"])
    if vllm_path is None:
        missing = f"no vllm package in {params['venv']} (no lib/python3*/site-packages/vllm)"
        if module.check_mode:
            module.exit_json(changed=False, skipped=True, msg=missing)
        module.fail_json(msg=missing, changed=False)
    try:
        result = run(
            vllm_path,
            params["patches"],
            params["state"],
            params["backup"],
            module.check_mode,
            move=module.atomic_move,
        )
    except (PatchError, OSError, UnicodeDecodeError, py_compile.PyCompileError) as exc:
        module.fail_json(msg=str(exc), changed=False)
    result["vllm_path"] = vllm_path
    if result.pop("warning", None):
        module.warn(result["msg"])
    if not module._diff or not result.get("diff"):
        result.pop("diff", None)
    module.exit_json(**result)


if __name__ == "__main__":
    main()
