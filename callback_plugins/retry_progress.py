"""retry_progress: a task retried until it succeeds (the wait for an engine that loads for minutes) shows
each retry's last line of output at default verbosity, where Ansible's own output shows only the retries
left (the result from -vv on)."""

from ansible.plugins.callback import CallbackBase

DOCUMENTATION = """
name: retry_progress
type: aggregate
short_description: Show a retried task's latest output line at default verbosity
description:
  - On each retry of a task with C(until), displays the host and the last line of the attempt's stdout
    (roles/vllm_service's readiness check prints the engine's latest load stage there), or nothing
    where the attempt printed none.
requirements:
  - enabled in ansible.cfg (callbacks_enabled)
"""


class CallbackModule(CallbackBase):
    CALLBACK_VERSION = 2.0
    CALLBACK_TYPE = "aggregate"
    CALLBACK_NAME = "retry_progress"
    CALLBACK_NEEDS_ENABLED = True

    def v2_runner_retry(self, result):
        lines = [line for line in result._result.get("stdout_lines") or [] if line.strip()]
        if lines:
            self._display.display(f"  {result._host.get_name()}: {lines[-1].strip()}")
