"""systemd_environment_problems: what keeps an inventory's environment from being the server unit's
Environment= settings (roles/vllm_service's template quotes and escapes the rest), one line each, for
roles/validate_inventory. A control character cannot be carried: a newline would start a setting of its
own (ExecStartPre=+... as root), which systemd then refuses as a bad setting."""

import re

from ansible.errors import AnsibleFilterError

NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
CONTROL = re.compile(r"[\x00-\x1f\x7f]")


def systemd_environment_problems(environment, source):
    """One line per variable of `environment` (the inventory's `source`) that cannot be set in the unit."""
    if not isinstance(environment, dict):
        raise AnsibleFilterError(f"{source} is not a mapping of variable names to values")
    problems = []
    for name, value in environment.items():
        if not NAME.fullmatch(str(name)):
            problems.append(
                f"{source}: {str(name)!r} is not an environment variable name (letters, digits and _, "
                "not a digit first)"
            )
        elif isinstance(value, (dict, list)):
            problems.append(f"{source}: {name} is a {type(value).__name__}, not a value")
        elif CONTROL.search(str(value)):
            problems.append(
                f"{source}: {name}={str(value)!r} holds a control character (a newline would start a "
                "unit setting of its own): one line of printable text"
            )
    return problems


class FilterModule:
    def filters(self):
        return {"systemd_environment_problems": systemd_environment_problems}
