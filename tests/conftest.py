"""Shared pytest setup: import the repo's modules the way Ansible would find them."""

import json
import pathlib
import sys

import ansible.module_utils
import pytest
from ansible.module_utils.testing import patch_module_args

REPO = pathlib.Path(__file__).resolve().parent.parent

# library/ holds the modules; tests import them by name (e.g. `import gpu_topology`).
sys.path.insert(0, str(REPO / "library"))

# module_utils/ holds what several modules share; Ansible resolves `ansible.module_utils.<name>` from there.
if str(REPO / "module_utils") not in ansible.module_utils.__path__:
    ansible.module_utils.__path__.append(str(REPO / "module_utils"))


@pytest.fixture
def run_module(capsys):
    """Run a module's main() with the given arguments; return its JSON result."""

    def run(module, args):
        with patch_module_args(args), pytest.raises(SystemExit):
            module.main()
        return json.loads(capsys.readouterr().out)

    return run
