#!/usr/bin/env python3
"""Check that each role's meta/argument_specs.yml says what its defaults/main.yml does.

For every roles/<role>/meta/argument_specs.yml, against roles/<role>/defaults/main.yml:
  - every default is an option of the `main` entry point, and every `main` option has a default
    or is `required: true` (the caller must pass it);
  - an option's spec `default:` is the defaults value exactly (as YAML loads them; a templated
    default appears in the spec as the same template string);
  - no option that defaults/main.yml sets is `required: true` (it could never fire).
Other entry points' options are held to the last two rules where defaults/main.yml sets them.

Prints one line per mismatch and exits 1, or a one-line summary and exits 0.
Usage: .venv/bin/python scripts/check-argument-specs.py [ROLES_DIR]
"""

import json
import pathlib
import sys

import yaml

ROLES = pathlib.Path(__file__).resolve().parent.parent / "roles"
MISSING = object()


def load(path):
    return yaml.safe_load(path.read_text()) if path.is_file() else None


def show(value):
    """A value as one comparable line: JSON keeps true apart from 1 and 1.0 apart from 1."""
    return json.dumps(value, sort_keys=True, default=str)


def check_option(name, option, defaults):
    """Mismatches of one spec option with defaults/main.yml."""
    option = option or {}
    spec_default = option.get("default")
    if name not in defaults:
        if "default" in option:
            return [f"spec default {show(spec_default)} but no default in defaults/main.yml"]
        return []
    problems = []
    if option.get("required"):
        problems.append("required: true, but defaults/main.yml always sets it")
    if show(spec_default) != show(defaults[name]):
        problems.append(f"spec default {show(spec_default)} != defaults/main.yml {show(defaults[name])}")
    return problems


def check_role(role_dir):
    """(mismatch lines, number of `main` options) for one role."""
    specs = (load(role_dir / "meta" / "argument_specs.yml") or {}).get("argument_specs") or {}
    defaults = load(role_dir / "defaults" / "main.yml") or {}
    main = (specs.get("main") or {}).get("options") or {}
    where = f"roles/{role_dir.name}"
    unlisted = [name for name in defaults if name not in main]
    problems = [f"{where}: {name}: in defaults/main.yml but not an option of main" for name in unlisted]
    for name, option in main.items():
        if name not in defaults and not (option or {}).get("required"):
            problems.append(f"{where}: {name}: no default in defaults/main.yml and not required: true")
        problems += [f"{where}: {name}: {p}" for p in check_option(name, option, defaults)]
    for entry, spec in specs.items():
        if entry == "main":
            continue
        for name, option in ((spec or {}).get("options") or {}).items():
            if name in defaults:
                problems += [f"{where}: {name} ({entry}): {p}" for p in check_option(name, option, defaults)]
    return problems, len(main)


def check(roles_dir=ROLES):
    """(mismatch lines, roles checked, `main` options checked) for every role with an argument spec."""
    problems, roles, options = [], 0, 0
    for spec_file in sorted(pathlib.Path(roles_dir).glob("*/meta/argument_specs.yml")):
        role_problems, role_options = check_role(spec_file.parent.parent)
        problems += role_problems
        roles += 1
        options += role_options
    return problems, roles, options


def main(argv):
    problems, roles, options = check(argv[1] if len(argv) > 1 else ROLES)
    for line in problems:
        print(line)
    if problems:
        return 1
    print(f"argument specs match defaults: {roles} roles, {options} options")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
