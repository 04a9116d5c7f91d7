"""The production profile on its three boxes, read from the runs' structured results and from the boxes:
what the converge served and gated on each, the NCCL environment each unit got from its topology, the
proxy on the port a box's host_vars give, SpeculationOff armed for every box in the exported rules
(promtool), the tuner's k served on one box, and TLS on one box from the inventory, scraped over it by a
real Prometheus."""

import json
import shlex

import yaml
from driver import ROOT, podman
from gpu_topology import PCIE_TUNED_NCCL_ENV
from nginx_proxy import certificate_authority
from prometheus_box import CA_FILE, TARGETS_FILE, PrometheusBox
from promtool_rules import MINUTES, PROMTOOL, alert, counters, promtool_test, without_annotations

PROFILE = ROOT / "inventory/example"
PCIE_BOXES = ("pcie-box-01", "pcie-box-02")
NVLINK_BOX = "nvlink-box-01"
# The sim's drafter of known acceptance (sim/build_models.py): mean acceptance length 3.43 on the gate's
# traffic.
SHIPPED = ROOT / "build/sim-models/eagle3-known-3.4"
DRAFTERS = "/srv/drafters"
UNIT = "/etc/systemd/system/vllm.service"
STATUS = """
import sys, urllib.error, urllib.request
headers = {"Authorization": "Bearer " + sys.argv[2]} if sys.argv[2] else {}
request = urllib.request.Request(sys.argv[1], headers=headers)
try:
    print(urllib.request.urlopen(request, timeout=30).status)
except urllib.error.HTTPError as error:
    print(error.code)
"""


def profile(host: str) -> dict:
    """What inventory/example says for a host: its group's vars, then its own."""
    values = yaml.safe_load((PROFILE / "group_vars/gpu_boxes.yml").read_text())
    own = PROFILE / "host_vars" / f"{host}.yml"
    return {**values, **(yaml.safe_load(own.read_text()) if own.exists() else {})}


def unit_environment(box) -> dict:
    """The serving unit's environment, as systemd holds it."""
    value = box.out("systemctl show vllm --property=Environment --value")
    return dict(item.split("=", 1) for item in shlex.split(value))


def status(box, url: str, key: str = "") -> int:
    return int(box.out(shlex.join(["python3", "-c", STATUS, url, key])).strip())


def served_speculative_config(box) -> dict:
    unit = box.out(f"cat {UNIT}")
    return json.loads(unit.split("--speculative-config '", 1)[1].split("'", 1)[0])


def each_box_serves_the_shipped_drafter(scenario):
    """The converge, box by box: the shipped drafter's release is current and served, the gate measured it
    (its known acceptance) and passed, and the box answers on the port its host_vars give, with the key
    only."""
    run = scenario.runs["converge"]
    key = scenario.profile["overrides"]["vault_vllm_service_api_key"]["value"]
    for host, box in scenario.boxes.items():
        wanted = profile(host)
        config = served_speculative_config(box)
        assert config["model"] == f"{DRAFTERS}/current", config
        assert config["num_speculative_tokens"] == wanted["eagle3_drafter_num_speculative_tokens"], config
        shipped = box.out(f"cat {DRAFTERS}/current/config.json")
        assert json.loads(shipped) == json.loads((SHIPPED / "config.json").read_text()), shipped
        smoke = run.one(host=host, role="gate", file="gate/tasks/main.yml", action="speculation_gate")
        gate = smoke.facts["speculation_gate"]
        assert gate["passed"] and gate["model"] == wanted["vllm_service_served_model_name"], gate
        assert smoke.result["invocation"]["module_args"]["speculative_config"] == config, smoke.result
        assert 3.2 < gate["mean_acceptance_length"] < 3.6, gate
        port = wanted["vllm_service_port"]
        assert status(box, f"http://127.0.0.1:{port}/v1/models") == 401, host
        assert status(box, f"http://127.0.0.1:{port}/v1/models", key) == 200, host


def each_unit_has_its_topologys_nccl_environment(scenario):
    """PCIe-only boxes: the tuned set, with each box's own overrides from its host_vars; the NVSwitch box:
    NCCL's defaults (no NCCL variable at all)."""
    topology = {
        host: scenario.runs["converge"].ran(host=host, role="gpu_topology", action="gpu_topology")[-1].facts
        for host in scenario.boxes
    }
    for host in PCIE_BOXES:
        environment = unit_environment(scenario.boxes[host])
        assert topology[host]["gpu_topology"]["interconnect"] == "pcie", topology[host]
        for name, value, _why in PCIE_TUNED_NCCL_ENV:
            assert environment[name] == value, (host, name, environment)
        for name, value in profile(host)["vllm_service_nccl_env_overrides"].items():
            assert environment[name] == value, (host, name, environment)
    assert topology[NVLINK_BOX]["gpu_topology"]["interconnect"] == "nvlink", topology[NVLINK_BOX]
    nccl = [name for name in unit_environment(scenario.boxes[NVLINK_BOX]) if name.startswith("NCCL_")]
    assert nccl == [], nccl


def speculation_off_is_armed_for_every_box(scenario):
    """The monitoring export for this inventory: every box is scraped on its own port, and every box that
    generates tokens without drafting fires SpeculationOff; drafting at its gate's figures fires nothing."""
    exported = scenario.workdir / "monitoring"
    run = scenario.play("playbooks/monitoring.yml", "-e", f"monitoring_export_dir={exported}")
    assert run.ok, str(run)
    targets = yaml.safe_load((exported / "specfleet-targets.yml").read_text())
    assert {t["labels"]["host"]: t["targets"] for t in targets} == {
        host: [f"127.0.0.1:{profile(host)['vllm_service_port']}"] for host in scenario.boxes
    }, targets
    assert PROMTOOL, "promtool: scripts/bootstrap.sh installs it"
    rules = without_annotations(exported / "specfleet.rules.yml", scenario.workdir / "rules.yml")
    model = profile(PCIE_BOXES[0])["vllm_service_served_model_name"]
    off = [series for host in scenario.boxes for series in counters(host, 0, 0, [], 300, model=model)]
    drafting = [
        series for host in scenario.boxes for series in counters(host, 100, 3, [89, 79, 68], 343, model=model)
    ]
    tests = [
        {
            "interval": "1m",
            "input_series": series,
            "alert_rule_test": [
                {
                    "eval_time": f"{MINUTES - 5}m",
                    "alertname": "SpeculationOff",
                    "exp_alerts": [alert(host, model_name=model) for host in scenario.boxes] if fires else [],
                }
            ],
        }
        for series, fires in ((off, True), (drafting, False))
    ]
    result = promtool_test(scenario.workdir, rules, tests)
    assert result.returncode == 0, result.stdout + result.stderr


def the_tuners_k_is_served(scenario):
    """playbooks/tune_speculation.yml on one box: its trials measured k = 0..1, and the unit then serves
    exactly the speculative config it chose (a k, or none), gated at that k."""
    host = PCIE_BOXES[0]
    box = scenario.boxes[host]
    tuned = scenario.play(
        "playbooks/tune_speculation.yml", "--limit", host, "-e", "spec_tune_take_out_of_service=true"
    )
    assert tuned.ok, str(tuned)
    assert tuned.hosts() <= {host, "localhost"}, tuned.hosts()
    facts = tuned.ran(host=host, role="spec_tune", file="spec_tune/tasks/main.yml", action="spec_tune")[-1]
    chosen = facts.facts["spec_tune"]
    assert chosen["source"] == "measured", chosen
    assert sorted({row["k"] for row in chosen["table"]}) == [0, 1], chosen["table"]
    unit = box.out(f"cat {UNIT}")
    served = served_speculative_config(box) if "--speculative-config" in unit else {}
    assert served == chosen["speculative_config"], (served, chosen["speculative_config"])
    if served:
        smoke = tuned.one(host=host, role="gate", file="gate/tasks/main.yml", action="speculation_gate")
        assert smoke.facts["speculation_gate"]["k"] == served["num_speculative_tokens"], smoke.result
    assert box.out("systemctl is-active vllm").strip() == "active"


HTTPS = """
import json, ssl, sys, urllib.error, urllib.request
url, key, ca = sys.argv[1:4]
context = ssl.create_default_context(cafile=ca)
request = urllib.request.Request(url, headers={"Authorization": "Bearer " + key})
try:
    print(urllib.request.urlopen(request, timeout=30, context=context).status)
except urllib.error.HTTPError as error:
    print(error.code)
"""


def tls_from_the_inventory_scraped_over_it(scenario):
    """TLS on one box, its certificate and key from the inventory (a CA the test makes signs it for the
    address Prometheus and clients reach): a change of the proxy alone (no model load), the clients' path
    checked over https; a client that trusts the CA gets its completion, plain HTTP is refused; a real
    Prometheus that trusts it scrapes /metrics and the loads over https; the next run and --check change
    nothing."""
    host = PCIE_BOXES[0]
    box = scenario.boxes[host]
    port = profile(host)["vllm_service_port"]
    address = podman("inspect", "-f", "{{.NetworkSettings.IPAddress}}", box.container).stdout.strip()
    ca, certificate, key = certificate_authority(scenario.workdir, address)
    tls = {"vllm_proxy_tls_certificate": certificate, "vllm_proxy_tls_certificate_key": key}
    settings = {"monitoring_targets": [host], "monitoring_tls_ca_file": CA_FILE}
    with PrometheusBox(f"{box.container}-prometheus", ca=ca) as prometheus:
        inventory = prometheus.inventory(scenario.workdir / "prometheus.json", settings, {host: address})
        # In the inventory, as an operator sets them: every play reads them (the scrape targets' scheme too).
        hosts = json.loads(inventory.read_text())
        hosts["all"]["hosts"][host].update(tls)
        inventory.write_text(json.dumps(hosts))
        loads = box.out("cat /var/lib/specfleet/loads/loads.json")
        on = scenario.play("deploy.yml", "--tags", "vllm_proxy", "--limit", host, inventory=inventory)
        assert on.ok, str(on)
        assert {r.role for r in on.changed_results(host=host)} == {"vllm_proxy", "transaction"}, str(on)
        clients = on.one(host=host, role="vllm_proxy", file="vllm_proxy/tasks/ready.yml", action="script")
        assert json.loads(clients.result["stdout_lines"][-1])["url"] == f"https://127.0.0.1:{port}", (
            clients.result
        )
        assert box.out("cat /var/lib/specfleet/loads/loads.json") == loads
        assert key not in on.stdout
        client_key = scenario.profile["overrides"]["vault_vllm_service_api_key"]["value"]
        prometheus.write("/tmp/ca.pem", ca.read_text())
        https = f"https://{address}:{port}/v1/models"
        assert (
            prometheus.out(shlex.join(["python3", "-c", HTTPS, https, client_key, "/tmp/ca.pem"])).strip()
            == "200"
        )
        assert status(prometheus, f"http://{address}:{port}/v1/models", client_key) == 400
        for args in ([], ["--check"]):
            again = scenario.play(
                "deploy.yml",
                "--tags",
                "vllm_proxy",
                "--limit",
                host,
                *args,
                inventory=inventory,
            )
            assert again.ok and again.changed(host) == 0, str(again)
        monitored = scenario.play("playbooks/monitoring.yml", inventory=inventory)
        assert monitored.ok, str(monitored)
        targets = yaml.safe_load(prometheus.out(f"cat {TARGETS_FILE}"))
        assert {t["labels"].get("__scheme__") for t in targets} == {"https"}, targets
        for metrics in ('metrics!="loads"', 'metrics="loads"'):
            up = f'up{{job="specfleet-vllm", host="{host}", {metrics}}} == 1'
            prometheus.wait(lambda up=up: prometheus.query(up), f"{host} scraped over https ({metrics})", 60)


RECORD = "/var/lib/specfleet/last_good"


def a_bad_box_stops_the_fleet_before_any_change(scenario):
    """A typo in the second box's host_vars: shipping a drafter to the fleet ends with that box's one line,
    and no box changed, the first included (its drafter link, unit and record as before)."""
    host, bad = PCIE_BOXES
    typo = scenario.profile_inventory / "host_vars" / bad / "typo.yml"  # read last, after the profile's
    typo.write_text("vllm_service_port: 99999\n")
    state = f"readlink {DRAFTERS}/current; cat {UNIT}; cat {RECORD}/record.json"
    before = {name: box.out(state) for name, box in scenario.boxes.items()}
    try:
        run = scenario.play(
            "deploy.yml",
            "--tags",
            "eagle3",
            "-e",
            f"eagle3_drafter_source={ROOT / 'build/sim-models/eagle3-known-3.0'}",
        )
    finally:
        typo.unlink()
    assert not run.ok, str(run)
    assert set(run.failures(bad)) == {"vllm_service_port=99999 is not a TCP port (1-65535)"}, str(run)
    assert run.failures(host) == [
        f"not deployed: nothing changes on any box while 1 of 3 boxes fail their inventory checks ({bad})"
    ], str(run)
    assert {r.role for r in run.results} == {"validate_inventory"}, str(run)
    assert not any(run.touched(name) for name in scenario.boxes), str(run)
    assert {name: box.out(state) for name, box in scenario.boxes.items()} == before


def side_effect(scenario):
    assert set(scenario.boxes) == {*PCIE_BOXES, NVLINK_BOX}, scenario.boxes
    each_box_serves_the_shipped_drafter(scenario)
    each_unit_has_its_topologys_nccl_environment(scenario)
    speculation_off_is_armed_for_every_box(scenario)
    the_tuners_k_is_served(scenario)
    tls_from_the_inventory_scraped_over_it(scenario)
    a_bad_box_stops_the_fleet_before_any_change(scenario)
