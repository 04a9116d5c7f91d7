"""Unit tests for library/spec_tune.py's read and record steps and its scorer (module_utils/spec_schedule.py),
with the gate's floors at each k (tests/unit/test_spec_floors.py). The measure step runs against the real
server in the default scenario.

The GPUs are simulated at the edge: the sim box's nvidia-smi over a real capture."""

import json

import pytest
import spec_tune
from ansible.module_utils import spec_schedule
from conftest import REPO
from test_spec_floors import spec_floors

FIXTURES = REPO / "tests" / "fixtures"
DRIVER = "575.57.08"
# The gate's default floor at each k, as roles/served hands it to the tuner: 2.2 at k=3.
FLOORS_BY_K = spec_floors({"mean_acceptance_length": 2.2}, 3, 3)["by_k"]


# Three rounds, each slowed or sped alike at every k (the machine's load in that round): paired, the gain of
# a k over speculation off is the same in every round, its interval of zero width.
ROUND_LOAD = (0.97, 1.0, 1.03)


def rows(speeds, rounds=ROUND_LOAD):
    """Table rows from {concurrency: [tokens/s at k=0, k=1, ...]}, each round's at the round's load."""
    return [
        {
            "k": k,
            "concurrency": c,
            "tokens_per_second": speed,
            "rounds_tokens_per_second": [round(speed * load, 6) for load in rounds],
            "inter_token_latency_ms": 1000 * c / speed,
        }
        for c, by_k in speeds.items()
        for k, speed in enumerate(by_k)
    ]


# Speculation pays at low concurrency and costs at high (the shape published deployments report).
CROSSOVER = {
    1: [100, 160, 190, 200],
    2: [190, 280, 300, 290],
    4: [360, 400, 380, 350],
    8: [650, 600, 540, 480],
}


# --- the scorer -----------------------------------------------------------------------------------


def test_best_k_per_concurrency_needs_the_min_gain_over_speculation_off():
    chosen = spec_schedule.best_k_per_concurrency(rows(CROSSOVER), min_gain=0.05)
    assert {c: k for c, (k, _gain) in chosen.items()} == {1: 3, 2: 2, 4: 1, 8: 0}
    assert chosen[1][1] == pytest.approx(2.0)
    # 400 / 360 = 1.11: under a 12% floor speculation stays off at 4.
    assert spec_schedule.best_k_per_concurrency(rows(CROSSOVER), min_gain=0.12)[4] == (0, 1.0)


def test_schedule_ranges_start_at_1_end_at_max_num_seqs_and_merge_neighbours():
    assert spec_schedule.schedule_ranges({1: 3, 2: 2, 4: 1, 8: 0}, 256) == [
        [1, 1, 3],
        [2, 3, 2],
        [4, 7, 1],
        [8, 256, 0],
    ]
    assert spec_schedule.schedule_ranges({1: 3, 2: 3, 4: 1, 8: 1}, 64) == [[1, 3, 3], [4, 64, 1]]
    with pytest.raises(spec_schedule.ScheduleError, match="concurrency 8 measured is above max_num_seqs 4"):
        spec_schedule.schedule_ranges({1: 3, 8: 1}, 4)


def test_k_for_batch_reads_a_schedule_as_vllm_expands_it():
    schedule = [[1, 1, 3], [2, 3, 2], [8, 256, 0]]
    assert [spec_schedule.k_for_batch(schedule, b, 3) for b in (1, 2, 3, 5, 8, 300)] == [3, 2, 2, 2, 0, 0]
    assert spec_schedule.k_for_batch(None, 4, 3) == 3
    assert spec_schedule.k_for_batch([[1, 256, 5]], 1, 3) == 3  # vLLM caps k at num_speculative_tokens


def test_choose_a_schedule():
    choice = spec_schedule.choose(rows(CROSSOVER), "schedule", 256, 0.05)
    assert choice["speculation"] is True
    assert choice["num_speculative_tokens"] == 3
    assert choice["schedule"] == [[1, 1, 3], [2, 3, 2], [4, 7, 1], [8, 256, 0]]
    assert choice["reason"] == "schedule 1-1: k=3, 2-3: k=2, 4-7: k=1, 8-256: k=0 (batch size: k)"
    spec_schedule.check_schedule(choice["schedule"], choice["num_speculative_tokens"])


def test_one_range_needs_no_schedule_and_no_gain_at_1_turns_speculation_off():
    flat = {1: [100, 150, 170, 180], 2: [190, 260, 300, 330]}
    choice = spec_schedule.choose(rows(flat), "schedule", 256, 0.05)
    assert (choice["num_speculative_tokens"], choice["schedule"]) == (3, None)
    costly = {1: [100, 102, 98, 90], 2: [190, 230, 200, 180]}
    off = spec_schedule.choose(rows(costly), "schedule", 256, 0.05)
    assert off["speculation"] is False
    assert off["reason"] == (
        "speculation off: no k gains 5% at concurrency 1 (the low end of its 95% interval)"
    )


def test_a_gain_is_an_interval_over_paired_rounds():
    # log ratios 0.10 .. 0.30 over five rounds: mean 0.2, sd 0.079, t(0.975, 4) = 2.776.
    gain, low, high = spec_schedule.gain_interval([0.1, 0.15, 0.2, 0.25, 0.3], 0.95)
    assert (gain, low, high) == pytest.approx((1.2214, 1.1072, 1.3474), abs=1e-3)
    # One round: a figure, no interval.
    assert spec_schedule.gain_interval([0.2], 0.95) == (pytest.approx(1.2214, abs=1e-4), 0.0, None)


def test_a_gain_the_rounds_do_not_agree_on_is_not_chosen():
    steady = rows({1: [100, 108]}, rounds=(1.0, 1.0, 1.0))
    for row, ratios in zip(steady, ([1.0, 1.0, 1.0], [1.08, 1.09, 1.07])):
        row["rounds_tokens_per_second"] = [100 * ratio for ratio in ratios]
    noisy = [dict(row) for row in steady]
    noisy[1]["rounds_tokens_per_second"] = [120.0, 90.0, 114.0]  # the same mean gain, rounds apart
    assert spec_schedule.best_k_per_concurrency(steady, 0.05)[1][0] == 1
    assert spec_schedule.gains(noisy)[1][1][1] < 1.05
    assert spec_schedule.best_k_per_concurrency(noisy, 0.05) == {1: (0, 1.0)}
    # -1 takes the fastest as measured, whatever its interval.
    assert spec_schedule.best_k_per_concurrency(noisy, -1)[1][0] == 1


def test_a_longer_draft_is_taken_only_where_its_gain_over_the_shorter_is_shown():
    table = rows({1: [100, 130, 136]}, rounds=(1.0, 1.0, 1.0))
    off, short, long = (row["rounds_tokens_per_second"] for row in table)
    short[:] = [130.0, 131.0, 129.0]
    long[:] = [150.0, 124.0, 134.0]  # 4.6% over k=1 on average, one round slower
    assert spec_schedule.gains(table)[1][2][1] > 1.05  # shown over speculation off ...
    assert spec_schedule.best_k_per_concurrency(table, 0.05)[1][0] == 1  # ... but not over k=1
    long[:] = [143.0, 144.0, 142.0]  # 10% over k=1 in every round
    assert spec_schedule.best_k_per_concurrency(table, 0.05)[1][0] == 2


def test_one_measurement_per_cell_shows_nothing_and_k_never_rises_with_the_batch():
    """The demo box's measurement (one per cell, at concurrency 2 and 4 as reported; concurrency 1 for the
    example): with one round no gain is shown; taken as measured (min_gain -1), k stays off once it is
    lower, where the single cells said k=2, then 0, then 1 again."""
    demo = {1: [380, 420, 450], 2: [685, 715, 642], 4: [1254, 1401, 1212]}
    table = rows(demo, rounds=(1.0,))
    for row in table:
        del row["rounds_tokens_per_second"]  # a table kept before rounds: one each
    assert spec_schedule.choose(table, "schedule", 8, 0.05)["speculation"] is False
    fastest = spec_schedule.best_k_per_concurrency(table, -1)
    assert {c: k for c, (k, _gain) in fastest.items()} == {1: 2, 2: 1, 4: 1}
    # Over rounds that agree: k=1 gains 2% at 2 (under 5%, off), 12% at 4; off stays off at 4.
    choice = spec_schedule.choose(rows(demo | {2: [685, 700, 642]}), "schedule", 8, 0.05)
    assert choice["schedule"] == [[1, 1, 2], [2, 8, 0]], choice
    assert choice["per_concurrency"][4]["gains"][1] == [1.1172] * 3


def test_single_k_for_the_concurrency_profile():
    # All alike: geometric mean of the speed-ups over 1, 2, 4, 8 (k=2: 1.27, k=1: 1.25, k=3: 1.22). k=2 is
    # 1.6% over k=1: not the 5% a longer draft must show over a shorter one; it is with 1%.
    k, scores, intervals = spec_schedule.single_k(rows(CROSSOVER), {}, 0.05)
    assert k == 1 and scores[2] == pytest.approx((1.9 * 300 / 190 * 380 / 360 * 540 / 650) ** 0.25, abs=1e-4)
    assert intervals[2] == [pytest.approx(scores[2], abs=1e-4)] * 2  # the rounds agree
    assert spec_schedule.single_k(rows(CROSSOVER), {}, 0.01)[0] == 2
    # Mostly single requests: a deeper draft (k=2: 1.75x; k=3 only 3.5% over it).
    assert spec_schedule.single_k(rows(CROSSOVER), {1: 0.9, 8: 0.1}, 0.05)[0] == 2
    # Mostly batch 8: speculation off.
    choice = spec_schedule.choose(rows(CROSSOVER), "single", 256, 0.05, {8: 1})
    assert choice["speculation"] is False
    with pytest.raises(spec_schedule.ScheduleError, match="profile names 16, which was not measured"):
        spec_schedule.single_k(rows(CROSSOVER), {16: 1}, 0.05)


@pytest.mark.parametrize(
    ("schedule", "message"),
    [
        ([[2, 8, 3]], "starts at batch size 2: vLLM needs it to start at 1"),
        ([[1, 4, 3], [3, 8, 1]], "ranges must be sorted, non-empty and not overlap"),
        ([[1, 4, 4]], "k must be 0 to num_speculative_tokens 3 (vLLM caps a larger k silently)"),
        ([[1, 4]], "is not [start, end, k] of integers"),
        ([], "must be a non-empty list"),
    ],
)
def test_check_schedule_refuses_what_vllm_would_not_take_as_meant(schedule, message):
    with pytest.raises(spec_schedule.ScheduleError) as caught:
        spec_schedule.check_schedule(schedule, 3)
    assert message in str(caught.value)


def test_prediction_from_per_position_acceptance():
    curve = [0.895, 0.789, 0.684]
    assert [round(spec_schedule.predicted_mean_length(curve, k), 3) for k in (1, 2, 3)] == [
        1.895,
        2.684,
        3.368,
    ]


# --- the module: read and record ------------------------------------------------------------------


@pytest.fixture
def box(tmp_path, sim_nvidia_smi):
    """The sim box's nvidia-smi over a recorded 8x RTX 4090 PCIe box; releases, `current` at one."""
    smi_data, nvidia_smi = sim_nvidia_smi("rtx4090-8gpu-pcie", DRIVER)
    releases = tmp_path / "drafters" / "releases"
    for release in ("aaaa11112222", "bbbb33334444"):
        (releases / release).mkdir(parents=True)
    current = tmp_path / "drafters" / "current"
    current.symlink_to(releases / "aaaa11112222")

    class Box:
        data = smi_data
        kept = tmp_path / "kept" / "spec_tune.json"

        @staticmethod
        def switch(release):
            current.unlink()
            current.symlink_to(releases / release)

        @staticmethod
        def args(**overrides):
            args = {
                "speculative_config": {
                    "method": "eagle3",
                    "model": str(current),
                    "num_speculative_tokens": 3,
                },
                "identity": {"vllm_version": "0.33.0", "model": "/srv/models/kimi", "server": "abc"},
                "cache_path": str(Box.kept),
                "nvidia_smi": str(nvidia_smi),
                "concurrencies": [1, 2, 4, 8],
                "max_k": 3,
            }
            args.update(overrides)
            return args

    return Box


def facts_of(result):
    return result["ansible_facts"]["spec_tune"]


def test_nothing_kept_serves_the_drafter_untuned_and_says_a_measurement_is_due(run_module, box):
    result = run_module(spec_tune, box.args())
    assert result["changed"] is False and result["measurement_due"] is True
    facts = facts_of(result)
    assert facts["source"] == "none" and facts["choice"] is None
    assert facts["speculative_config"] == box.args()["speculative_config"]


def test_record_keeps_the_table_with_its_identity_and_hands_on_the_schedule(run_module, box):
    result = run_module(spec_tune, box.args(step="record", rows=rows(CROSSOVER), started_at=1.0))
    facts = facts_of(result)
    assert result["changed"] is True and facts["source"] == "measured"
    schedule = [[1, 1, 3], [2, 3, 2], [4, 7, 1], [8, 256, 0]]
    assert facts["speculative_config"] == {
        "method": "eagle3",
        "model": box.args()["speculative_config"]["model"],
        "num_speculative_tokens": 3,
        "num_speculative_tokens_per_batch_size": schedule,
    }
    kept = json.loads(box.kept.read_text())
    identity = kept["identity"]
    assert identity["drafter_release"] == "aaaa11112222"
    assert identity["driver"] == DRIVER and len(identity["gpus"]) == 8
    assert identity["vllm_version"] == "0.33.0"
    assert identity["plan"] == {
        "ks": [0, 1, 2, 3],
        "concurrencies": [1, 2, 4, 8],
        "rounds": 3,
        "max_tokens": 64,
    }
    assert kept["cost"]["server_starts"] == 4 and kept["cost"]["seconds"] > 0
    assert facts["summary"][0].startswith("concurrency 1: k=0 100.0 tok/s 10.0 ms, k=1 160.0 tok/s")
    assert facts["summary"][0].endswith("-> k=3")


def test_kept_table_is_reused_and_rescored_without_measuring(run_module, box):
    run_module(spec_tune, box.args(step="record", rows=rows(CROSSOVER)))
    again = run_module(spec_tune, box.args())
    assert again["changed"] is False and again["measurement_due"] is False
    assert facts_of(again)["source"] == "kept"
    # New weights: one k for a profile of mostly single requests, from the same table.
    rescored = run_module(spec_tune, box.args(output="single", profile={1: 0.9, 8: 0.1}))
    assert rescored["changed"] is True and rescored["measurement_due"] is False
    config = facts_of(rescored)["speculative_config"]
    assert config["num_speculative_tokens"] == 2 and "num_speculative_tokens_per_batch_size" not in config
    assert json.loads(box.kept.read_text())["scoring"]["output"] == "single"


@pytest.mark.parametrize(
    ("change", "stale"),
    [
        ("release", "drafter_release aaaa11112222 -> bbbb33334444"),
        ("vllm", "vllm_version 0.33.0 -> 0.34.0"),
        ("driver", "driver 575.57.08 -> 580.159.04"),
        ("workload", "workload changed"),
    ],
)
def test_a_changed_box_voids_the_kept_table(run_module, box, change, stale):
    run_module(spec_tune, box.args(step="record", rows=rows(CROSSOVER)))
    overrides = {}
    if change == "release":
        box.switch("bbbb33334444")
    elif change == "vllm":
        overrides["identity"] = dict(box.args()["identity"], vllm_version="0.34.0")
    elif change == "driver":
        (box.data / "driver-version").write_text("580.159.04\n")
    else:
        overrides["requests"] = [{"messages": [{"role": "user", "content": "hello"}]}]
    result = run_module(spec_tune, box.args(**overrides))
    facts = facts_of(result)
    assert result["measurement_due"] is True and facts["source"] == "none"
    assert stale in facts["stale"]
    assert any(stale in json.dumps(warning) for warning in result["warnings"]), result["warnings"]
    assert facts["speculative_config"]["num_speculative_tokens"] == 3
    assert "num_speculative_tokens_per_batch_size" not in facts["speculative_config"]


def test_record_refuses_an_incomplete_table(run_module, box):
    partial = [row for row in rows(CROSSOVER) if not (row["k"] == 2 and row["concurrency"] == 4)]
    result = run_module(spec_tune, box.args(step="record", rows=partial))
    assert result["failed"] is True and result["msg"] == "the table lacks k=2 at concurrency 4"
    assert not box.kept.exists()


def test_speculation_that_never_pays_is_turned_off(run_module, box):
    costly = {
        1: [100, 101, 99, 95],
        2: [190, 185, 180, 170],
        4: [360, 340, 330, 300],
        8: [650, 600, 540, 480],
    }
    facts = facts_of(run_module(spec_tune, box.args(step="record", rows=rows(costly))))
    assert facts["speculative_config"] == {}
    assert facts["choice"]["reason"].startswith("speculation off:")


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        ({"concurrencies": [2, 4]}, "concurrencies must be ascending and distinct, from 1: [2, 4]"),
        ({"concurrencies": [1, 2, 512]}, "concurrency 512 is above the server's max_num_seqs 256"),
        ({"k": 5}, "k must be 0 to max_k 3, got 5"),
    ],
)
def test_bad_parameters_fail_in_one_line(run_module, box, overrides, message):
    result = run_module(spec_tune, box.args(**overrides))
    assert result["failed"] is True and result["msg"] == message


def test_a_k_the_gate_would_fail_is_never_chosen():
    """Measured on the sim (bench/spec_tune_table.py, eagle3-known-2.2): at k=1 the drafter's mean
    acceptance length was 1.600, under the gate's floor there (2.2 at k=3 is 1.607 at k=1); the fastest
    k at batch size 1 was 1, the gate then failed it. With the gate's floor the tuner takes the next."""
    table = rows(CROSSOVER)
    for row in table:
        row["mean_acceptance_length"] = {0: None, 1: 1.600, 2: 2.1, 3: 2.24}[row["k"]]
    eligible = spec_schedule.gate_floor({int(k): f["mean_acceptance_length"] for k, f in FLOORS_BY_K.items()})
    chosen = spec_schedule.best_k_per_concurrency(table, 0.05, eligible)
    # At 4, k=1 (400) was fastest; k=2 (380 over 360, +5.6%) now serves there.
    assert {c: k for c, (k, _gain) in chosen.items()} == {1: 3, 2: 2, 4: 2, 8: 0}
    assert spec_schedule.gate_floor({}) is None


def test_the_module_passes_the_gate_floor_to_the_choice(run_module, box):
    table = rows({1: [100, 190, 150, 140], 2: [190, 300, 250, 240]})
    for row in table:
        row["mean_acceptance_length"] = {0: None, 1: 1.5, 2: 2.0, 3: 2.3}[row["k"]]
    without = facts_of(
        run_module(spec_tune, box.args(step="record", rows=table, max_k=3, concurrencies=[1, 2]))
    )
    assert without["speculative_config"]["num_speculative_tokens"] == 1
    floored = run_module(spec_tune, box.args(floors_by_k=FLOORS_BY_K, max_k=3, concurrencies=[1, 2]))
    assert floored["changed"] is True  # re-scored: the floor is part of the scoring
    assert facts_of(floored)["speculative_config"]["num_speculative_tokens"] == 2


def speculation_off_of(run_module, box, **overrides):
    """k = 0 as the gate's baseline trial keeps it: the rows, and the identity the table's is but for the
    drafter and k (taken from a table the module kept on the same box)."""
    scratch = box.kept.with_name("scratch.json")
    run_module(spec_tune, box.args(step="record", rows=rows(CROSSOVER), cache_path=str(scratch), **overrides))
    identity = json.loads(scratch.read_text())["identity"]
    scratch.unlink()
    for field in ("drafter_release", "speculative_config"):
        del identity[field]
    identity["plan"] = {key: value for key, value in identity["plan"].items() if key != "ks"}
    return {
        "identity": identity,
        "rows": [row for row in rows(CROSSOVER) if row["k"] == 0],
        "measured_at": "2026-12-07T04:00:00+00:00",
    }


def test_k_0_from_the_gate_s_baseline_saves_a_server_start(run_module, box):
    off = speculation_off_of(run_module, box)
    due = run_module(spec_tune, box.args(speculation_off=off))
    assert due["measurement_due"] is True and facts_of(due)["trial_ks"] == [1, 2, 3]
    trials = [row for row in rows(CROSSOVER) if row["k"] > 0]
    recorded = run_module(
        spec_tune, box.args(step="record", rows=trials, speculation_off=off, started_at=1.0)
    )
    facts = facts_of(recorded)
    # The same table and choice as four trials would make, from three.
    assert sorted((row["k"], row["concurrency"]) for row in facts["table"]) == sorted(
        (row["k"], row["concurrency"]) for row in rows(CROSSOVER)
    )
    assert facts["choice"]["schedule"] == [[1, 1, 3], [2, 3, 2], [4, 7, 1], [8, 256, 0]]
    cost = json.loads(box.kept.read_text())["cost"]
    assert (cost["server_starts"], cost["speculation_off_measured_at"]) == (3, off["measured_at"])


@pytest.mark.parametrize("change", ["driver", "remeasure", "rounds"])
def test_k_0_is_measured_again_where_the_baseline_s_rows_no_longer_hold(run_module, box, change):
    off = speculation_off_of(run_module, box)
    overrides = {"speculation_off": off}
    if change == "driver":
        (box.data / "driver-version").write_text("580.159.04\n")
    elif change == "remeasure":
        overrides["remeasure"] = True
    else:
        overrides["rounds"] = 5
    assert facts_of(run_module(spec_tune, box.args(**overrides)))["trial_ks"] == [0, 1, 2, 3]
    trials = [row for row in rows(CROSSOVER) if row["k"] > 0]
    refused = run_module(spec_tune, box.args(step="record", rows=trials, **overrides))
    assert refused["failed"] is True and refused["msg"] == "the table lacks k=0 at concurrency 1"
