"""Keeps the modules ansible-playbook builds (AnsiballZ payloads) between the suite's runs.

ansible-core caches each module it builds only for one run: the cache lies in a temporary directory
made per process (DEFAULT_LOCAL_TMP), and the suite's ~120 runs each rebuilt the same ~30 modules, a
quarter of the controller's CPU in a run. tests/driver.py loads this plugin with
SPECFLEET_ANSIBALLZ_CACHE set to a directory named after everything a built module contains (ansible
itself, library/, module_utils/), so a changed module is never served from an old build. The plugin
links the run's cache directory to it before the first task; ansible's own lock keeps concurrent
runs from writing one entry twice. Nothing else about a run changes.
"""

import os

from ansible import constants as C
from ansible.plugins.callback import CallbackBase


class CallbackModule(CallbackBase):
    CALLBACK_VERSION = 2.0
    CALLBACK_TYPE = "aggregate"
    CALLBACK_NAME = "ansiballz_cache"
    CALLBACK_NEEDS_ENABLED = False  # found in ANSIBLE_CALLBACK_PLUGINS is enough: the driver sets both

    def __init__(self):
        super().__init__()
        shared = os.environ["SPECFLEET_ANSIBALLZ_CACHE"]
        os.makedirs(shared, exist_ok=True)
        # The name module_common.py looks under; removing the run's directory at exit removes only the link.
        os.symlink(shared, os.path.join(C.DEFAULT_LOCAL_TMP, "ansiballz_cache"))
