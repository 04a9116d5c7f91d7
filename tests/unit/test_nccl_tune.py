"""Unit tests for library/nccl_tune.py (scorer in module_utils/nccl_scoring.py): profile, scores, kept file.

The timings are real: tests/fixtures/nccl_tune/h200x2-*.json were measured with
roles/nccl_tune/files/nccl_allreduce_bench.py on a lent 2x H200 machine (NVLink NV18, driver
580.159.04, torch 2.11.0+cu130, NCCL 2.28.9), with the candidates of bench/nccl_candidates.json;
`-p2p-disabled` ran with NCCL_P2P_DISABLE=1 in the base environment (GPU traffic through host
memory, as on a box without peer access). `h200x2-kept.json` is the file the module itself kept on
that machine, run there next to gpu_topology against the real nvidia-smi. Where the module runs
here, the GPUs are simulated at the edge: the sim box's nvidia-smi over the real H200 capture, and
a script replaying the recording.
"""

import json
import os
import pathlib
import pwd
import shutil
import sys
import tempfile
import types

import gpu_topology
import nccl_tune
import pytest
from ansible.module_utils import nccl_scoring
from ansible.module_utils.kept_measurement import changed_fields

REPO = pathlib.Path(__file__).resolve().parents[2]
FIXTURES = REPO / "tests" / "fixtures"
KIMI_HIDDEN = 7168
CANDIDATES = json.loads((REPO / "bench" / "nccl_candidates.json").read_text())
EXTRA_CANDIDATES = [candidate for candidate in CANDIDATES if candidate["name"] != "defaults"]
H200_DRIVER = "580.159.04"


def recorded(name):
    return json.loads((FIXTURES / "nccl_tune" / f"{name}.json").read_text())


def kimi_profile(decode_weight=0.7, prefill_weight=0.3):
    return nccl_tune.size_profile(
        KIMI_HIDDEN, [1, 8, 32, 64], [512, 2048, 8192], decode_weight, prefill_weight
    )


def topology(box):
    directory = FIXTURES / "nvidia-smi" / box
    return gpu_topology.build_topology(
        gpu_topology.parse_topo_matrix((directory / "topo-m.txt").read_text()),
        gpu_topology.parse_gpu_query((directory / "query-noheader.csv").read_text()),
    )


def by_name(choice):
    return {candidate["name"]: candidate for candidate in choice["candidates"]}


# --- the profile ---------------------------------------------------------------------------------


def test_kimi_profile_sizes_follow_the_hidden_size():
    profile = kimi_profile()
    assert [entry["bytes"] for entry in profile] == [
        14336,  # decode batch 1: 7168 x 1 x 2 bytes, ~14 KiB
        114688,
        458752,
        917504,  # decode batch 64: ~1 MiB
        7340032,  # prefill 512 tokens
        29360128,
        117440512,  # prefill 8192 tokens: 112 MiB
    ]
    assert sum(entry["weight"] for entry in profile) == pytest.approx(1.0)
    assert [entry["weight"] for entry in profile[:4]] == pytest.approx([0.175] * 4)
    assert profile[0]["label"] == "decode batch 1"
    assert profile[-1]["label"] == "prefill tokens 8192"


def test_a_size_in_both_phases_carries_both_weights():
    profile = nccl_tune.size_profile(100, [64], [64, 128], 0.5, 0.5)
    assert profile == [
        {"bytes": 12800, "weight": pytest.approx(0.75), "label": "decode batch 64, prefill tokens 64"},
        {"bytes": 25600, "weight": pytest.approx(0.25), "label": "prefill tokens 128"},
    ]


# --- the candidates ------------------------------------------------------------------------------


def test_candidates_on_a_pcie_box_include_the_topology_rule():
    facts = topology("rtx4090-8gpu-pcie")
    candidates = nccl_tune.candidate_list(facts, EXTRA_CANDIDATES)
    names = [candidate["name"] for candidate in candidates]
    # pcie-rule is the same environment as the topology rule on this box: measured once.
    assert names == ["defaults", "topology-rule-pcie", "ll", "ll-min8", "p2p-off"]
    assert candidates[1]["env"] == facts["nccl_env"]
    assert candidates[0]["env"] == {}


def test_candidates_on_an_nvlink_box_start_with_the_defaults_only():
    candidates = nccl_tune.candidate_list(topology("h200-2gpu-nvlink"), [])
    assert candidates == [{"name": "defaults", "env": {}}]


def test_candidate_values_become_strings():
    candidates = nccl_tune.candidate_list({}, [{"name": "min8", "env": {"NCCL_MIN_NCHANNELS": 8}}])
    assert candidates[1]["env"] == {"NCCL_MIN_NCHANNELS": "8"}


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        ([{"env": {"NCCL_PROTO": "LL"}}], "a candidate needs a name"),
        ([{"name": "defaults", "env": {"NCCL_PROTO": "LL"}}], "two candidates are named defaults"),
    ],
)
def test_bad_candidates_are_refused(extra, message):
    with pytest.raises(ValueError, match=message):
        nccl_tune.candidate_list({}, extra)


# --- the scorer on real H200 measurements --------------------------------------------------------


def test_nvlink_box_keeps_nccl_defaults_and_the_pcie_rule_is_far_slower_for_prefill():
    choice = nccl_tune.score(recorded("h200x2-nvlink"), kimi_profile(), 0.05)
    assert choice["chosen"] == "defaults"
    assert choice["env"] == {}
    assert choice["reason"].startswith(
        "defaults: no candidate beat NCCL's defaults by 5% (best other: ll-min8"
    )
    scores = by_name(choice)
    # The static PCIe set on NVLink: 112 MiB took 1509.7 us instead of 409.7 (3.7x).
    assert scores["pcie-rule"]["prefill_score"] > 2.5
    largest = {row["bytes"]: row for row in scores["pcie-rule"]["sizes"]}[117440512]
    assert largest["median_us"] == pytest.approx(1509.7, abs=0.1)
    assert scores["p2p-off"]["score"] > 3
    assert choice["phase_winners"] == {"decode": "ll-min8", "prefill": "defaults"}


def test_the_repeat_measurement_makes_the_same_choice():
    first = nccl_tune.score(recorded("h200x2-nvlink"), kimi_profile(), 0.05)
    repeat = nccl_tune.score(recorded("h200x2-nvlink-repeat"), kimi_profile(), 0.05)
    assert first["chosen"] == repeat["chosen"] == "defaults"
    assert first["phase_winners"] == repeat["phase_winners"]


def test_without_peer_access_a_decode_only_profile_picks_more_channels():
    # NCCL_P2P_DISABLE=1: 8 channels of LL cut the decode sizes by ~12%, but triple prefill's time.
    decode_only = nccl_tune.score(recorded("h200x2-p2p-disabled"), kimi_profile(1.0, 0.0), 0.05)
    assert decode_only["chosen"] == "ll-min8"
    assert decode_only["env"] == {"NCCL_PROTO": "LL", "NCCL_MIN_NCHANNELS": "8"}
    assert (
        decode_only["reason"] == "ll-min8: 0.88x the defaults' time on the profile (decode 0.88, prefill n/a)"
    )
    mixed = nccl_tune.score(recorded("h200x2-p2p-disabled"), kimi_profile(), 0.05)
    assert mixed["chosen"] == "defaults"
    assert by_name(mixed)["ll-min8"]["prefill_score"] > 2


def test_min_gain_is_the_bar_a_candidate_must_clear():
    report = recorded("h200x2-nvlink-repeat")
    decode_only = kimi_profile(1.0, 0.0)
    best = by_name(nccl_tune.score(report, decode_only, 0.0))["ll-min8"]["score"]
    assert 0.9 < best < 0.95
    assert nccl_tune.score(report, decode_only, 0.10)["chosen"] == "defaults"
    assert nccl_tune.score(report, decode_only, 0.05)["chosen"] == "ll-min8"


def test_bus_bandwidth_is_nccl_definition():
    # 112 MiB in 409.7 us on 2 GPUs: algorithm bandwidth x 2(n-1)/n = 286.6 GB/s.
    assert nccl_scoring.bus_bandwidth_gbps(117440512, 409.7e-6, 2) == pytest.approx(286.6, abs=0.1)
    assert nccl_scoring.bus_bandwidth_gbps(8e9, 1.0, 8) == pytest.approx(14.0)


def test_a_failed_candidate_is_reported_and_never_chosen():
    report = recorded("h200x2-p2p-disabled")
    report["candidates"][3] = {"name": "ll-min8", "env": {}, "error": "rank 1: DistBackendError: NCCL error"}
    choice = nccl_tune.score(report, kimi_profile(1.0, 0.0), 0.05)
    assert choice["chosen"] == "defaults"
    assert by_name(choice)["ll-min8"]["error"] == "rank 1: DistBackendError: NCCL error"
    assert any(line.startswith("  ll-min8: rank 1") for line in choice["summary"])


def test_without_the_defaults_there_is_nothing_to_compare_with():
    report = recorded("h200x2-nvlink")
    report["candidates"][0] = {"name": "defaults", "env": {}, "error": "timed out after 300 s"}
    with pytest.raises(nccl_tune.MeasurementError, match="defaults could not be measured: timed out"):
        nccl_tune.score(report, kimi_profile(), 0.05)


def test_summary_marks_the_winner():
    choice = nccl_tune.score(recorded("h200x2-nvlink"), kimi_profile(), 0.05)
    assert choice["summary"][0].startswith(
        "* defaults: score 1.00 (decode 1.00, prefill 1.00) 14K=10.92us 112K="
    )
    assert choice["summary"][0].endswith(" 112M=409.7us")
    assert choice["summary"][1].startswith("  pcie-rule: score 1.56")


def test_changed_fields_name_what_changed():
    kept = {"driver": "575.57.08", "nccl": "2.27.3", "topology": "a", "gpus": ["x"]}
    now = {"driver": "580.159.04", "nccl": "2.27.3", "topology": "b", "gpus": ["x"]}
    changes = changed_fields(kept, now, nccl_tune.SUMMARIZED)
    assert changes == ["driver 575.57.08 -> 580.159.04", "topology changed"]
    assert changed_fields(now, now) == []


def test_the_file_kept_on_a_real_box_reads_back_without_python():
    kept = recorded("h200x2-kept")
    assert kept["identity"]["nccl"] == "2.28.9" and kept["identity"]["driver"] == H200_DRIVER
    facts = nccl_tune.kept_facts(kept, H200_DRIVER, topology("h200-2gpu-nvlink"))
    assert facts["source"] == "kept"
    # Its last call re-scored the kept timings for decode only (no new measurement): LL won there.
    assert kept["scoring"]["profile"][-1]["weight"] == 0.0
    assert facts["chosen"] == "ll" and facts["env"] == {"NCCL_PROTO": "LL"}
    assert facts["reason"] == "ll: 0.86x the defaults' time on the profile (decode 0.86, prefill n/a)"
    mixed = nccl_tune.score(kept["report"], kimi_profile(), 0.05)
    assert mixed["chosen"] == "defaults"
    # The capture in tests/fixtures/nvidia-smi is of the same machine: same GPUs, bus ids and links.
    assert facts["stale"] == []
    moved = nccl_tune.kept_facts(kept, H200_DRIVER, topology("h100-8gpu-nvlink-nics"))
    assert moved["stale"] == ["gpus ['NVIDIA H200'] -> ['NVIDIA H100 80GB HBM3']", "topology changed"]


# --- the module on a simulated box ---------------------------------------------------------------


@pytest.fixture
def box(tmp_path, monkeypatch, sim_nvidia_smi):
    """The sim box's nvidia-smi over the real 2x H200 capture, and the replaying script."""
    smi_data, nvidia_smi = sim_nvidia_smi("h200-2gpu-nvlink", H200_DRIVER)
    log = tmp_path / "calls.log"
    log.touch()
    monkeypatch.setenv("REPLAY_LOG", str(log))
    monkeypatch.setenv("REPLAY_PROBE", (FIXTURES / "nccl_tune" / "h200x2-probe.json").read_text())
    monkeypatch.setenv("REPLAY_REPORT", str(FIXTURES / "nccl_tune" / "h200x2-nvlink.json"))

    class Box:
        data = smi_data
        kept = tmp_path / "kept" / "nccl_tune.json"

        @staticmethod
        def calls():
            return log.read_text().split()

        @staticmethod
        def args(**overrides):
            args = {
                "python": sys.executable,
                "script": str(FIXTURES / "nccl_tune" / "replay_bench.py"),
                "topology": topology("h200-2gpu-nvlink"),
                "hidden_size": KIMI_HIDDEN,
                "candidates": EXTRA_CANDIDATES,
                "cache_path": str(Box.kept),
                "nvidia_smi": str(nvidia_smi),
            }
            args.update(overrides)
            return args

    return Box


def test_first_run_measures_and_keeps_the_result_with_its_versions(run_module, box):
    result = run_module(nccl_tune, box.args())
    facts = result["ansible_facts"]["nccl_tune"]
    assert result["changed"] is True and result["measurement_due"] is True
    assert facts["source"] == "measured"
    assert facts["because"] == "nothing measured yet"
    assert facts["chosen"] == "defaults" and facts["env"] == {}
    assert box.calls() == ["probe", "measure"]
    kept = json.loads(box.kept.read_text())
    assert kept["identity"]["driver"] == H200_DRIVER
    assert kept["identity"]["nccl"] == "2.28.9"
    assert kept["identity"]["torch"] == "2.11.0+cu130"
    assert kept["identity"]["gpus"] == ["NVIDIA H200"]
    assert kept["identity"]["world_size"] == 2
    assert kept["measured_at"] == facts["measured_at"]
    assert kept["choice"]["chosen"] == "defaults"


def test_second_run_reuses_the_kept_measurement(run_module, box):
    run_module(nccl_tune, box.args())
    before = box.kept.read_bytes()
    result = run_module(nccl_tune, box.args())
    assert result["changed"] is False and result["measurement_due"] is False
    assert result["ansible_facts"]["nccl_tune"]["source"] == "kept"
    assert box.calls() == ["probe", "measure", "probe"]
    assert box.kept.read_bytes() == before


def test_new_weights_rescore_the_kept_timings_without_measuring(run_module, box, monkeypatch):
    monkeypatch.setenv("REPLAY_REPORT", str(FIXTURES / "nccl_tune" / "h200x2-p2p-disabled.json"))
    extra = [candidate for candidate in EXTRA_CANDIDATES if candidate["name"] != "p2p-off"]
    run_module(nccl_tune, box.args(candidates=extra))
    result = run_module(nccl_tune, box.args(candidates=extra, decode_weight=1.0, prefill_weight=0.0))
    facts = result["ansible_facts"]["nccl_tune"]
    assert result["changed"] is True and result["measurement_due"] is False
    assert facts["chosen"] == "ll-min8" and facts["source"] == "kept"
    assert box.calls() == ["probe", "measure", "probe"]
    assert json.loads(box.kept.read_text())["choice"]["chosen"] == "ll-min8"


def test_a_new_driver_means_a_new_measurement(run_module, box):
    run_module(nccl_tune, box.args())
    (box.data / "driver-version").write_text("580.200.01\n")
    result = run_module(nccl_tune, box.args())
    assert result["changed"] is True
    assert result["ansible_facts"]["nccl_tune"]["because"] == f"driver {H200_DRIVER} -> 580.200.01"
    assert box.calls() == ["probe", "measure", "probe", "measure"]


def test_reading_only_warns_when_the_box_changed_since(run_module, box):
    run_module(nccl_tune, box.args())
    (box.data / "driver-version").write_text("580.200.01\n")
    result = run_module(nccl_tune, box.args(measure=False))
    facts = result["ansible_facts"]["nccl_tune"]
    assert result["changed"] is False
    assert facts["source"] == "kept" and facts["env"] == {}
    assert facts["stale"] == [f"driver {H200_DRIVER} -> 580.200.01"]
    assert "re-measure with playbooks/tune_nccl.yml" in result["warnings"][0]["event"]["msg"]
    # Reading starts no Python and touches no GPU.
    assert box.calls() == ["probe", "measure"]


def test_reading_only_without_a_measurement_leaves_the_topology_rule(run_module, box):
    result = run_module(nccl_tune, box.args(measure=False))
    assert result["ansible_facts"]["nccl_tune"] == {
        "source": "none",
        "env": None,
        "reason": "nothing measured on this box: the topology rule applies",
    }
    assert box.calls() == []


def test_check_mode_says_a_measurement_is_due_and_runs_none(run_module, box):
    result = run_module(nccl_tune, box.args(_ansible_check_mode=True))
    assert result["changed"] is True and result["measurement_due"] is True
    assert result["ansible_facts"]["nccl_tune"]["reason"] == "would measure: nothing measured yet"
    assert box.calls() == ["probe"]
    assert not box.kept.exists()


def test_check_mode_on_a_fresh_box_without_the_script(run_module, box, tmp_path):
    result = run_module(nccl_tune, box.args(_ansible_check_mode=True, script=str(tmp_path / "absent.py")))
    assert result["measurement_due"] is True
    assert result["ansible_facts"]["nccl_tune"]["reason"].startswith("would measure once ")


def test_refuses_while_a_process_holds_the_gpus(run_module, box):
    (box.data / "compute-apps.csv").write_text("4242, /opt/vllm/venv/bin/python3\n")
    result = run_module(nccl_tune, box.args())
    assert result["failed"] is True
    assert result["msg"] == (
        "GPUs are in use (4242, /opt/vllm/venv/bin/python3); measuring now would measure them too"
    )
    assert box.calls() == ["probe"]
    assert not box.kept.exists()


def test_one_gpu_has_nothing_to_tune(run_module, box):
    result = run_module(nccl_tune, box.args(topology=topology("h200-1gpu")))
    assert result["changed"] is False
    assert result["ansible_facts"]["nccl_tune"]["reason"] == "one GPU: there is no all-reduce to tune"


def test_a_measurement_past_its_bound_is_killed_with_its_workers(run_module, box, tmp_path):
    # A measurement that hangs, as NCCL does on a deadlocking P2P level, with a forked worker.
    hanging = tmp_path / "hanging_bench.py"
    hanging.write_text(
        "import os, sys, time\n"
        "if sys.argv[1] == 'probe':\n"
        f"    print({json.dumps((FIXTURES / 'nccl_tune' / 'h200x2-probe.json').read_text().strip())})\n"
        "    sys.exit(0)\n"
        "if os.fork() == 0:\n"
        "    time.sleep(120)\n"
        "    os._exit(0)\n"
        "time.sleep(120)\n"
    )
    result = run_module(nccl_tune, box.args(script=str(hanging), timeout_s=3))
    assert result["msg"] == "the measurement exceeded its time bound of 3 s and was killed"
    assert not box.kept.exists()
    survivors = [pid for pid in os.listdir("/proc") if pid.isdigit() and hanging.name in _cmdline(pid)]
    assert survivors == []


def _cmdline(pid):
    try:
        return pathlib.Path(f"/proc/{pid}/cmdline").read_bytes().decode(errors="replace")
    except OSError:
        return ""


def test_a_failing_script_gives_its_last_line(run_module, box, monkeypatch):
    monkeypatch.setenv("REPLAY_PROBE", "not json")
    result = run_module(nccl_tune, box.args())
    assert result["msg"].startswith("replay_bench.py printed no JSON")


def test_the_measurement_runs_as_the_service_user(tmp_path):
    """As the inference service's user (its groups and home too), so that what its workers leave in
    /dev/shm is that user's to clean up at the server's next start; here 'nobody', a real account."""
    shared = pathlib.Path(tempfile.mkdtemp(prefix="nccl-tune-user-"))
    try:
        shared.chmod(0o755)
        script = shared / "whoami_bench.py"
        script.write_text(
            "import json, os\n"
            "print(json.dumps({'uid': os.getuid(), 'gid': os.getgid(), 'home': os.environ['HOME']}))\n"
        )
        script.chmod(0o755)
        nobody = pwd.getpwnam("nobody")

        def run_as(user):
            module = types.SimpleNamespace(
                params={"python": "/usr/bin/python3", "script": str(script), "user": user}
            )
            return nccl_tune.Box(module).script("probe", timeout=30)

        assert run_as("nobody") == {"uid": nobody.pw_uid, "gid": nobody.pw_gid, "home": nobody.pw_dir}
        assert run_as("")["uid"] == os.getuid()
        with pytest.raises(
            nccl_tune.MeasurementError, match="no user no-such-user on this box to measure as"
        ):
            run_as("no-such-user")
    finally:
        shutil.rmtree(shared)
