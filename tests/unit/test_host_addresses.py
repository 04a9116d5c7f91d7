"""host_addresses (filter_plugins/host_addresses.py): the addresses the proxy's /metrics allow-list gets for
the inventory's Prometheus servers, resolved on the controller."""

from pathlib import Path

from script_module import call_apart

FILTER = Path(__file__).resolve().parents[2] / "filter_plugins/host_addresses.py"


def test_addresses_pass_and_names_resolve():
    hostvars = {
        "prom-01": {"ansible_host": "10.20.9.5"},
        "prom-02": {"ansible_host": "fd00::9"},
        "localhost": {},  # no ansible_host: its name is resolved
    }
    [answer] = call_apart(FILTER, "host_addresses", [["prom-01", "prom-02", "localhost"], hostvars])
    assert answer["answer"][:2] == ["10.20.9.5", "fd00::9"], answer
    assert set(answer["answer"][2:]) <= {"127.0.0.1", "::1"} and "127.0.0.1" in answer["answer"], answer


def test_a_host_reached_without_a_network_gives_no_address():
    """A Prometheus on the controller (connection local) or in a container: the inventory names it."""
    hostvars = {
        "prom-local": {"ansible_connection": "local"},
        "prom-box": {
            "ansible_connection": "containers.podman.podman",
            "ansible_host": "specfleet-prometheus",
        },
    }
    assert call_apart(FILTER, "host_addresses", [["prom-local", "prom-box"], hostvars]) == [{"answer": []}]


def test_a_name_the_controller_cannot_resolve_is_one_line():
    hostvars = {"prom-01": {"ansible_host": "prom-01.invalid"}}
    [answer] = call_apart(FILTER, "host_addresses", [["prom-01"], hostvars])
    why = answer["error"].split(": ", 1)[1]
    assert why.startswith("prom-01: its address prom-01.invalid does not resolve on the controller ("), answer
    assert why.endswith("): list the Prometheus servers' addresses in vllm_service_metrics_sources"), answer
