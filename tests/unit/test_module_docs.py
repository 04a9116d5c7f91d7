"""Each module's DOCUMENTATION, EXAMPLES and RETURN parse, and the documented options match argument_spec.

Why: ansible-doc silently treats a module whose DOCUMENTATION is not valid YAML as undocumented ("did not
contain a DOCUMENTATION attribute"), and nothing keeps the documented options in step with the code. These
are the checks ansible-test's validate-modules does (the repo is not a collection, so it cannot run here):
the docs are read by ansible-doc itself (documentation fragments merged, as it shows them), and
the argument_spec is the one main() really passes to AnsibleModule, captured without running the module.
"""

import ast
import functools
import importlib
import inspect
import json
import pathlib
import subprocess
import sys

import pytest
import yaml
from ansible.module_utils.basic import AnsibleModule
from ansible.module_utils.common.parameters import DEFAULT_TYPE_VALIDATORS

LIBRARY = pathlib.Path(__file__).resolve().parents[2] / "library"
ACTIONS = LIBRARY.parent / "action_plugins"
MODULES = sorted(path.stem for path in LIBRARY.glob("*.py"))


class _SpecCaptured(Exception):
    """Raised by the patched AnsibleModule.__init__ to stop main() once the spec is known."""

    def __init__(self, kwargs):
        super().__init__("argument_spec captured")
        self.kwargs = kwargs


@functools.cache
def read_docs(name):
    """(DOCUMENTATION, EXAMPLES text, RETURN) as `ansible-doc -M library -j` reads them.

    A subprocess: importing Ansible's controller code here would make every later module test in this
    process send its warnings to the controller's display instead of the module result.
    """
    shown = subprocess.run(
        [str(pathlib.Path(sys.executable).with_name("ansible-doc")), "-M", str(LIBRARY), "-j", name],
        capture_output=True,
        text=True,
        check=False,
    )
    assert shown.returncode == 0 and not shown.stderr.strip(), (
        f"{name}: ansible-doc says {shown.stderr.strip()}"
    )
    entry = json.loads(shown.stdout)[name]
    return entry["doc"], entry["examples"], entry["return"]


def captured_module_kwargs(name, monkeypatch):
    """The keyword arguments main() passes to AnsibleModule (argument_spec, supports_check_mode, ...)."""
    signature = inspect.signature(AnsibleModule.__init__)

    def capture(self, *args, **kwargs):
        arguments = signature.bind(self, *args, **kwargs).arguments
        arguments.pop("self")
        raise _SpecCaptured(arguments)

    monkeypatch.setattr(AnsibleModule, "__init__", capture)
    module = importlib.import_module(name)
    with pytest.raises(_SpecCaptured) as captured:
        module.main()
    return captured.value.kwargs


def action_argument_spec(path):
    """The ARGUMENT_SPEC literal of an action plugin."""
    for node in ast.parse(path.read_text()).body:
        if isinstance(node, ast.Assign) and [target.id for target in node.targets] == ["ARGUMENT_SPEC"]:
            return ast.literal_eval(node.value)
    raise AssertionError(f"{path}: no ARGUMENT_SPEC")


def _checked(value, type_name):
    """A default or choice as the module would see it (validate-modules compares these, not the raw YAML)."""
    if value is None:
        return None
    return DEFAULT_TYPE_VALIDATORS[type_name](value)


def compare_options(spec, doc_options, context):
    """Mismatches between an argument_spec and documented options, one readable line each."""
    problems = []
    doc_options = doc_options or {}

    documented = set()
    for doc_name, doc in doc_options.items():
        documented |= {doc_name, *(doc.get("aliases") or [])}
    accepted = set()
    for arg, data in spec.items():
        accepted |= {arg, *(data.get("aliases") or [])}
    for name in sorted(accepted - documented):
        problems.append(f"{context}option '{name}' is in argument_spec but not documented")
    for name in sorted(documented - accepted):
        problems.append(f"{context}option '{name}' is documented but not in argument_spec")

    for arg, data in spec.items():
        where = f"{context}option '{arg}'"
        names = {arg, *(data.get("aliases") or [])}
        doc_names = [name for name in doc_options if name in names]
        if not doc_names:
            continue  # reported above
        if len(doc_names) > 1:
            problems.append(f"{where} is documented more than once: {sorted(doc_names)}")
        doc = doc_options[doc_names[0]]

        doc_aliases = {doc_names[0], *(doc.get("aliases") or [])}
        if doc_aliases != names:
            problems.append(f"{where}: names {sorted(names)} in spec, {sorted(doc_aliases)} documented")

        spec_type = data.get("type", "str")
        if "type" not in doc:
            problems.append(f"{where}: type {spec_type!r} in spec, not documented")
            continue
        if doc["type"] != spec_type:
            problems.append(f"{where}: type {spec_type!r} in spec, {doc['type']!r} documented")
            continue  # defaults and choices cannot be compared across types

        if data.get("required", False) and data.get("default") is not None:
            problems.append(f"{where}: required in spec but also has a default ({data['default']!r})")
        if spec_type == "list" and not data.get("elements"):
            problems.append(f"{where}: type 'list' in spec without elements")

        try:
            doc_default = _checked(doc.get("default"), spec_type)
        except (TypeError, ValueError) as exc:
            problems.append(f"{where}: documented default {doc.get('default')!r} is not a {spec_type}: {exc}")
        else:
            spec_default = _checked(data.get("default"), spec_type)
            if doc_default != spec_default:
                problems.append(f"{where}: default {spec_default!r} in spec, {doc_default!r} documented")

        try:
            doc_choices = [_checked(choice, spec_type) for choice in doc.get("choices") or []]
        except (TypeError, ValueError) as exc:
            problems.append(f"{where}: documented choices {doc.get('choices')!r} are not {spec_type}: {exc}")
        else:
            spec_choices = [_checked(choice, spec_type) for choice in data.get("choices") or []]
            if sorted(map(repr, doc_choices)) != sorted(map(repr, spec_choices)):
                problems.append(f"{where}: choices {spec_choices!r} in spec, {doc_choices!r} documented")

        if bool(data.get("required", False)) != bool(doc.get("required", False)):
            problems.append(
                f"{where}: required={bool(data.get('required', False))} in spec, "
                f"{bool(doc.get('required', False))} documented"
            )

        if data.get("elements") != doc.get("elements"):
            problems.append(
                f"{where}: elements {data.get('elements')!r} in spec, {doc.get('elements')!r} documented"
            )

        if data.get("options") or doc.get("suboptions"):
            problems += compare_options(data.get("options") or {}, doc.get("suboptions"), f"{where} -> ")
    return problems


@pytest.mark.parametrize("name", MODULES)
def test_docs_parse(name):
    doc, examples, returns = read_docs(name)

    assert isinstance(doc, dict), f"{name}: DOCUMENTATION is missing or not a mapping"
    for key in ("module", "short_description", "description", "options"):
        assert key in doc, f"{name}: DOCUMENTATION has no {key!r}"
    assert doc["module"] == name, f"{name}: DOCUMENTATION says module: {doc['module']}"

    try:
        tasks = yaml.safe_load(examples)
    except yaml.YAMLError as exc:
        pytest.fail(f"{name}: EXAMPLES is not valid YAML: {exc}")
    assert isinstance(tasks, list) and tasks, f"{name}: EXAMPLES is not a list of tasks"

    assert isinstance(returns, dict) and returns, f"{name}: RETURN is missing or not a mapping"


@pytest.mark.parametrize("name", MODULES)
def test_attributes_are_described(name):
    """Attributes need a description; documentation fragments (action_common_attributes) provide them."""
    doc, _, _ = read_docs(name)
    for attribute, data in (doc.get("attributes") or {}).items():
        assert data.get("description"), (
            f"{name}: attribute {attribute!r} has no description "
            "(add extends_documentation_fragment: action_common_attributes)"
        )
        assert data.get("support") in ("full", "partial", "none", "N/A"), (
            f"{name}: attribute {attribute!r} has support {data.get('support')!r}"
        )
    if "platform" in (doc.get("attributes") or {}):
        assert doc["attributes"]["platform"].get("platforms"), (
            f"{name}: attribute 'platform' has no platforms"
        )


@pytest.mark.parametrize("name", MODULES)
def test_options_match_argument_spec(name, monkeypatch):
    doc, _, _ = read_docs(name)
    if (ACTIONS / f"{name}.py").exists() and "def main(" not in (LIBRARY / f"{name}.py").read_text():
        # An action that runs no module: library/ holds only its documentation, the action its spec
        # (read, not imported: importing controller code here would take over later tests' warnings).
        spec = action_argument_spec(ACTIONS / f"{name}.py")
    else:
        spec = captured_module_kwargs(name, monkeypatch)["argument_spec"]
    problems = compare_options(spec, doc.get("options"), f"{name}: ")
    assert not problems, "DOCUMENTATION does not match argument_spec:\n" + "\n".join(problems)
