"""Import a script that is not a package module (a file with dashes, or outside sys.path) by its path; or
call a function of one in a process of its own."""

import importlib.util
import json
import subprocess
import sys
from pathlib import Path

# Loads the file, calls the function on each case's arguments, prints each answer or error as JSON.
CALL = """
import json, sys
from script_module import load
function = getattr(load(sys.argv[1], "called_apart"), sys.argv[2])
answers = []
for args in json.load(sys.stdin):
    try:
        answers.append({"answer": function(*args)})
    except Exception as error:
        answers.append({"error": f"{type(error).__name__}: {error}"})
print(json.dumps(answers))
"""


def load(path, name):
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def call_apart(path, function, *cases):
    """[{"answer": ...} or {"error": "Type: message"}] for each case (a list of arguments), in a process of
    its own: a controller plugin imports Ansible's controller code, which imported into the test process
    sends later module tests' warnings to the controller's display."""
    answered = subprocess.run(
        [sys.executable, "-c", CALL, str(path), function],
        input=json.dumps(cases),
        capture_output=True,
        text=True,
        check=True,
        env={"PYTHONPATH": str(Path(__file__).resolve().parent)},
    )
    return json.loads(answered.stdout)
