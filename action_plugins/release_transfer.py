"""release_transfer (documented in library/release_transfer.py): ansible.posix.synchronize's transfer, with
its progress shown while it runs; runs no module of its own."""

from __future__ import annotations

import os
import tempfile
import threading
import time

from ansible.errors import AnsibleActionFail
from ansible.module_utils.common.text.formatters import bytes_to_human
from ansible.plugins.action import ActionBase
from ansible.utils.display import Display

display = Display()

# Its own options; every other is ansible.posix.synchronize's, passed on as given.
ARGUMENT_SPEC = {
    "total_bytes": {"type": "int", "default": 0},
    "progress_interval_s": {"type": "int", "default": 30, "aliases": ["progress_interval"]},
}
# Old names of its options, still taken.
ALIASES = {alias: name for name, spec in ARGUMENT_SPEC.items() for alias in spec.get("aliases", [])}


def read_log(path: str) -> tuple[int, int]:
    """(files, bytes) rsync has written so far: its log has a line per file or directory it transferred, the
    length first (--log-file-format %l:%n); lines of its own (a summary) start otherwise."""
    files = size = 0
    try:
        with open(path, encoding="utf-8", errors="replace") as log:
            for line in log:
                # rsync prefixes each line with its date, time and [pid].
                fields = line.rstrip("\n").split("] ", 1)[-1].split(":", 1)
                # A directory's name ends with "/": only files are counted.
                if len(fields) == 2 and fields[0].isdigit() and not fields[1].endswith("/"):
                    files += 1
                    size += int(fields[0])
    except FileNotFoundError:
        pass
    return files, size


def progress_line(host: str, files: int, size: int, total: int, seconds: float) -> str:
    done = (
        f"{bytes_to_human(size)} of {bytes_to_human(total)} ({100 * size / total:.0f}%)"
        if total
        else bytes_to_human(size)
    )
    rate = bytes_to_human(size / seconds) if seconds > 0 else "0 B"
    return f"{host}: {files} file(s), {done} in {seconds:.0f} s, {rate}/s"


class ActionModule(ActionBase):
    TRANSFERS_FILES = False

    def run(self, tmp=None, task_vars=None):
        task_vars = task_vars or {}
        given = {ALIASES.get(name, name): value for name, value in self._task.args.items()}
        own = {name: given.get(name, spec["default"]) for name, spec in ARGUMENT_SPEC.items()}
        try:
            total = int(own["total_bytes"])
        except (TypeError, ValueError) as exc:
            raise AnsibleActionFail(
                f"release_transfer: total_bytes={own['total_bytes']} is not a number of bytes"
            ) from exc
        # The reporter waits this long between lines: at 0 or below it would spin through the transfer.
        try:
            interval = int(own["progress_interval_s"])
        except (TypeError, ValueError):
            interval = 0
        if interval < 1:
            raise AnsibleActionFail(
                f"release_transfer: progress_interval_s={own['progress_interval_s']} is not a number of"
                " seconds of at least 1"
            )
        fd, log = tempfile.mkstemp(prefix="specfleet-transfer-", suffix=".log")
        os.close(fd)
        args = {name: value for name, value in self._task.args.items() if ALIASES.get(name, name) not in own}
        if not self._task.check_mode:  # a dry run transfers nothing to count
            args["rsync_opts"] = [
                *(args.get("rsync_opts") or []),
                f"--log-file={log}",
                "--log-file-format=%l:%n",
            ]
        task = self._task.copy()
        task.args = args
        synchronize = self._shared_loader_obj.action_loader.get(
            "ansible.posix.synchronize",
            task=task,
            connection=self._connection,
            play_context=self._play_context,
            loader=self._loader,
            templar=self._templar,
            shared_loader_obj=self._shared_loader_obj,
        )
        host = task_vars.get("inventory_hostname", "")
        started = time.monotonic()
        progress: list[dict] = []
        done = threading.Event()

        def report():
            # Every interval while rsync runs, where it wrote more since the last line.
            while not done.wait(interval):
                files, size = read_log(log)
                if not progress or (files, size) != (progress[-1]["files"], progress[-1]["bytes"]):
                    seconds = time.monotonic() - started
                    progress.append({"seconds": round(seconds, 1), "files": files, "bytes": size})
                    display.display(f"  {progress_line(host, files, size, total, seconds)}")

        reporter = threading.Thread(target=report, daemon=True)
        reporter.start()
        try:
            result = synchronize.run(task_vars=task_vars)
        finally:
            done.set()
            reporter.join()
            files, size = read_log(log)
            os.unlink(log)
        seconds = time.monotonic() - started
        result["progress"] = [*progress, {"seconds": round(seconds, 1), "files": files, "bytes": size}]
        result["transferred"] = progress_line(host, files, size, total, seconds)
        return result
