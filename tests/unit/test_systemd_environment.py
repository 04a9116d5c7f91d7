"""systemd_environment_problems (filter_plugins/systemd_environment.py): the inventory's environment values
that no quoting carries into the unit are named, one line each; everything else is left to the template's
escaping (molecule/default proves values with quotes, backslashes, % and $ reach the server as written)."""

from pathlib import Path

import pytest
from script_module import call_apart

FILTER = Path(__file__).resolve().parents[2] / "filter_plugins/systemd_environment.py"


def problems(*cases):
    """The filter's answer for each (environment, source), called apart (script_module.call_apart)."""
    return [
        {"problems": answer["answer"]} if "answer" in answer else answer
        for answer in call_apart(FILTER, "systemd_environment_problems", *cases)
    ]


def test_printable_values_pass_whatever_they_hold():
    values = {"A": 'say "hi" \\n 50% $HOME ;', "NCCL_P2P_LEVEL": "SYS", "N": 1, "_x9": ""}
    assert problems((values, "vllm_service_environment")) == [{"problems": []}]


@pytest.mark.parametrize(
    ("environment", "line"),
    [
        # The value that once wrote a unit systemd refused (and a root ExecStartPre).
        (
            {"FOO": "a\nExecStartPre=+/bin/touch /tmp/pwned"},
            "vllm_service_environment: FOO='a\\nExecStartPre=+/bin/touch /tmp/pwned' holds a control "
            "character",
        ),
        ({"FOO": "a\rb"}, "vllm_service_environment: FOO='a\\rb' holds a control character"),
        ({"9LIVES": "x"}, "vllm_service_environment: '9LIVES' is not an environment variable name"),
        ({"A B": "x"}, "vllm_service_environment: 'A B' is not an environment variable name"),
        ({"A": ["x"]}, "vllm_service_environment: A is a list, not a value"),
    ],
)
def test_what_no_quoting_carries_is_named(environment, line):
    [answer] = problems((environment, "vllm_service_environment"))
    found = answer["problems"]
    assert len(found) == 1 and found[0].startswith(line), found
    assert "\n" not in found[0]


def test_not_a_mapping():
    [answer] = problems((["NCCL_DEBUG=INFO"], "vllm_service_nccl_env_overrides"))
    # Ansible's own error for a filter that fails (AnsibleFilterError, or its 2.19 wrapper).
    assert answer["error"].endswith(
        ": vllm_service_nccl_env_overrides is not a mapping of variable names to values"
    )
