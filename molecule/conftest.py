"""testinfra's verify step (molecule/<scenario>/tests): the repo's modules, module_utils and test
helpers importable the way tests/conftest.py makes them for the rest of the suite."""

import sys
from pathlib import Path

import ansible.module_utils

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT / "library"), str(ROOT / "tests")]
if str(ROOT / "module_utils") not in ansible.module_utils.__path__:
    ansible.module_utils.__path__.append(str(ROOT / "module_utils"))
