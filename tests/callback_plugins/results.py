"""Writes each task result of a run, and its recap, as JSON lines: what tests/driver.py reads.

Loaded by the driver (ANSIBLE_CALLBACK_PLUGINS) with SPECFLEET_RESULTS naming the file; the screen
output stays ansible's own. A line per result: the host, its status, what the task is (role, resolved
module, file:line) and what it returned (ansible hands callbacks no_log results censored);
the last line is the recap ansible prints, per counter and host.
"""

import json
import os
import time

from ansible.parsing.ajson import AnsibleJSONEncoder
from ansible.plugins.callback import CallbackBase

RECAP = ("ok", "changed", "failures", "dark", "skipped", "rescued", "ignored", "processed")


class CallbackModule(CallbackBase):
    CALLBACK_VERSION = 2.0
    CALLBACK_TYPE = "aggregate"
    CALLBACK_NAME = "results"
    CALLBACK_NEEDS_ENABLED = False  # found in ANSIBLE_CALLBACK_PLUGINS is enough: the driver sets both

    def __init__(self):
        super().__init__()
        self._out = open(os.environ["SPECFLEET_RESULTS"], "a", encoding="utf-8")  # noqa: SIM115 (the run's length)

    def _write(self, line):
        self._out.write(json.dumps(line, cls=AnsibleJSONEncoder) + "\n")
        self._out.flush()  # what a run that dies midway did is still there

    def _result(self, status, result, ignore_errors=False):
        task = result._task
        self._write(
            {
                "host": result._host.get_name(),
                "status": status,
                "role": task._role._role_name if task._role else None,
                "action": task.resolved_action or task.action,
                "path": task.get_path(),
                "ignored": ignore_errors,
                "name": task.get_name(),
                "ended": time.time(),
                "res": result._result,
            }
        )

    def v2_runner_on_ok(self, result):
        self._result("ok", result)

    def v2_runner_on_failed(self, result, ignore_errors=False):
        self._result("failed", result, ignore_errors)

    def v2_runner_on_skipped(self, result):
        self._result("skipped", result)

    def v2_runner_on_unreachable(self, result):
        self._result("unreachable", result)

    def v2_playbook_on_stats(self, stats):
        self._write({"recap": {counter: getattr(stats, counter) for counter in RECAP}})
