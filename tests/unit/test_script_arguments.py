"""Templated values reach a script's command line as one argument each, whatever they hold.

`ansible.builtin.script` hands the rest of its `cmd` to the box's shell as written, so a value with a
space or a `;` that is not quoted splits into arguments or runs a command of its own. Each script task of
the roles is rendered by Ansible's own templar with every variable it names set to such a value, and
the line is run by a real shell, with the script replaced by one that prints the arguments it got.
"""

import json
import pathlib
import subprocess
import sys

import jinja2.meta
import pytest
import yaml
from task_files import tasks_of

REPO = pathlib.Path(__file__).resolve().parents[2]
# In a process of its own: Ansible's controller code imported into the test process would send later
# module tests' warnings to the controller's display (tests/unit/test_module_docs.py says the same).
RENDER = """
import json, sys
from ansible.template import Templar, trust_as_template
cmd, values = json.load(sys.stdin)
print(Templar(variables=values).template(trust_as_template(cmd)))
"""


def script_commands():
    for path in sorted(REPO.glob("roles/*/tasks/*.yml")):
        for task in tasks_of(yaml.safe_load(path.read_text())):
            script = task.get("ansible.builtin.script")
            if script:
                yield pytest.param(script["cmd"], id=f"{path.relative_to(REPO)}: {task['name']}")


def test_the_roles_have_script_tasks():
    assert len(list(script_commands())) >= 2


@pytest.mark.parametrize("cmd", script_commands())
def test_each_value_is_one_argument(cmd, tmp_path):
    marker = tmp_path / "ran"
    # Parsing only: the filters' names must be known, not what they do.
    parser = jinja2.Environment()
    parser.filters["quote"] = str
    names = jinja2.meta.find_undeclared_variables(parser.parse(cmd))
    values = {name: f"{name} with space;touch {marker}" for name in names}
    line = subprocess.run(
        [sys.executable, "-c", RENDER],
        input=json.dumps([cmd, values]),
        capture_output=True,
        text=True,
        check=True,
    ).stdout.rstrip("\n")
    printer = tmp_path / "print_argv.py"
    printer.write_text("import json, sys\nprint(json.dumps(sys.argv[1:]))\n")
    # As the script action runs it: the uploaded script's path in place of the first word.
    _, rest = line.split(None, 1)
    result = subprocess.run(
        ["sh", "-c", f"{sys.executable} {printer} {rest}"], capture_output=True, text=True, check=True
    )
    argv = json.loads(result.stdout)
    assert not marker.exists()
    assert sorted(set(values.values()) & set(argv)) == sorted(values.values())
