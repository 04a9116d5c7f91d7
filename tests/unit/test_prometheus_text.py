"""Unit tests for module_utils/prometheus_text.py, mostly on real vLLM /metrics captures.

Where each capture comes from: tests/fixtures/metrics/README.md.
"""

import ast
import importlib.util
import math
import pathlib
import re

import pytest
from ansible.module_utils import prometheus_text as pt

REPO = pathlib.Path(__file__).resolve().parents[2]
FIXTURES = REPO / "tests" / "fixtures" / "metrics"
DRAFTS = "vllm:spec_decode_num_drafts_total"
PER_POS = "vllm:spec_decode_num_accepted_tokens_per_pos_total"


def capture(name):
    return (FIXTURES / name).read_text()


def parsed(name):
    return pt.parse(capture(name))


# --- real captures ----------------------------------------------------------------------------------------

# (samples, TYPE lines, HELP lines) counted with grep on each file.
REAL = {
    "eagle3-accept-fresh.txt": (417, 96, 96),
    "eagle3-accept-before.txt": (432, 100, 100),
    "eagle3-accept-after.txt": (432, 100, 100),
    "eagle3-random-before.txt": (432, 100, 100),
    "eagle3-random-after.txt": (432, 100, 100),
    "no-spec.txt": (435, 92, 92),
}


@pytest.mark.parametrize("name", sorted(REAL))
def test_real_capture_counts(name):
    text = capture(name)
    exposition = pt.parse(text)
    lines = text.splitlines()
    assert len(exposition.samples) == REAL[name][0] == sum(1 for line in lines if not line.startswith("#"))
    assert len(exposition.types) == REAL[name][1] == sum(1 for line in lines if line.startswith("# TYPE "))
    assert len(exposition.helps) == REAL[name][2] == sum(1 for line in lines if line.startswith("# HELP "))


@pytest.mark.parametrize("name", sorted(REAL))
def test_every_real_sample_has_a_declared_type(name):
    exposition = parsed(name)
    for sample in exposition.samples:
        family, kind = pt.metric_type(exposition, sample.name)
        assert kind != "untyped", sample.name
        assert family in exposition.types


def test_counter_and_created_gauge_are_kept_apart():
    exposition = parsed("eagle3-accept-after.txt")
    assert pt.metric_type(exposition, DRAFTS) == (DRAFTS, "counter")
    created = "vllm:spec_decode_num_drafts_created"
    assert pt.metric_type(exposition, created) == (created, "gauge")
    assert pt.sum_samples(exposition.samples, DRAFTS) == 40.0
    assert pt.sum_samples(exposition.samples, created) == 1.7959621828039393e09
    # The family name without a suffix is not a sample name: nothing matches it.
    assert pt.sum_samples(exposition.samples, "vllm:spec_decode_num_drafts") == 0.0
    assert exposition.helps[DRAFTS] == "Number of spec decoding drafts."
    assert exposition.helps[created] == "Number of spec decoding drafts."


def test_histogram_named_total_is_not_a_counter():
    # vLLM's iteration_tokens_total is a histogram; its _sum/_count/_bucket samples belong to it.
    exposition = parsed("eagle3-accept-after.txt")
    family = "vllm:iteration_tokens_total"
    assert exposition.types[family] == "histogram"
    assert pt.metric_type(exposition, family + "_count") == (family, "histogram")
    assert pt.metric_type(exposition, family + "_bucket") == (family, "histogram")
    assert pt.metric_type(exposition, family + "_created") == (family + "_created", "gauge")
    assert pt.select_samples(exposition.samples, family) == []


def test_real_capture_spec_counters():
    samples = parsed("eagle3-accept-after.txt").samples
    assert pt.sum_samples(samples, DRAFTS, engine="0", model_name="tiny") == 40.0
    assert pt.sum_samples(samples, "vllm:spec_decode_num_draft_tokens_total") == 120.0
    assert pt.sum_samples(samples, "vllm:spec_decode_num_accepted_tokens_total") == 120.0
    assert pt.group_by_label(samples, PER_POS, "position") == {"0": 40.0, "1": 40.0, "2": 40.0}
    assert pt.sum_samples(samples, DRAFTS, model_name="other") == 0.0
    assert pt.sum_samples(samples, DRAFTS, engine="1") == 0.0


def test_real_le_plus_inf_bucket_label():
    samples = parsed("eagle3-accept-after.txt").samples
    buckets = pt.select_samples(samples, "vllm:request_generation_tokens_bucket", le="+Inf")
    assert len(buckets) == 1
    assert buckets[0].labels == {"engine": "0", "le": "+Inf", "model_name": "tiny"}
    assert buckets[0].value == 6.0  # the two warm-up requests and the four of the window
    assert pt.sum_samples(samples, "vllm:request_generation_tokens_count") == buckets[0].value


def test_real_escaped_label_values():
    samples = parsed("no-spec.txt").samples
    name = 'tiny "base" C:\\models\nno-spec'
    info = pt.select_samples(samples, "vllm:num_requests_running")
    assert [sample.labels for sample in info] == [{"engine": "0", "model_name": name}]
    assert pt.sum_samples(samples, "vllm:request_success_total", model_name=name) == 1.0
    assert pt.sum_samples(samples, "vllm:request_success_total", finished_reason="length") == 1.0
    assert pt.sum_samples(samples, "vllm:request_success_total", model_name="tiny") == 0.0
    # format_series writes the label back the way prometheus_client did.
    line = next(
        line for line in capture("no-spec.txt").splitlines() if line.startswith("vllm:num_requests_running")
    )
    assert line.rsplit(" ", 1)[0] == pt.format_series("vllm:num_requests_running", info[0].labels)


def test_no_spec_capture_has_no_spec_family():
    exposition = parsed("no-spec.txt")
    assert not [sample for sample in exposition.samples if sample.name.startswith("vllm:spec_decode")]
    assert not [name for name in exposition.types if name.startswith("vllm:spec_decode")]


def test_group_by_label_sums_engines():
    samples = parsed("variant-two-engines-after.txt").samples
    assert pt.group_by_label(samples, PER_POS, "position") == {"0": 73.0, "1": 67.0, "2": 61.0}
    assert pt.group_by_label(samples, PER_POS, "position", engine="1") == {"0": 33.0, "1": 27.0, "2": 21.0}
    assert pt.group_by_label(samples, DRAFTS, "engine") == {"0": 40.0, "1": 50.0}
    assert pt.sum_samples(samples, DRAFTS) == 90.0


def test_missing_position_variant():
    samples = parsed("variant-missing-position-fresh.txt").samples
    assert pt.group_by_label(samples, PER_POS, "position") == {"0": 0.0, "1": 0.0}


# --- the format, line by line -----------------------------------------------------------------------------


def test_special_values_and_timestamps():
    text = (
        '# TYPE a gauge\na NaN\nb{x="1"} +Inf 1712345678901\nb{x="2"} -Inf -5\nc 1.5e-3\nd -0.25 0\ne Inf\n'
    )
    samples = pt.parse_samples(text)
    assert math.isnan(samples[0].value) and samples[0].timestamp is None
    assert samples[1] == pt.Sample("b", {"x": "1"}, math.inf, 1712345678901)
    assert samples[2] == pt.Sample("b", {"x": "2"}, -math.inf, -5)
    assert samples[3].value == 0.0015
    assert (samples[4].value, samples[4].timestamp) == (-0.25, 0)
    assert samples[5].value == math.inf


def test_label_escapes_and_layout():
    text = 'm:x_y{a="q\\"uote",b="back\\\\slash",c="new\\nline",d="",e="{,}=",} 7\n'
    (sample,) = pt.parse_samples(text)
    assert sample.name == "m:x_y"
    assert sample.labels == {"a": 'q"uote', "b": "back\\slash", "c": "new\nline", "d": "", "e": "{,}="}
    assert sample.value == 7.0
    spaced = pt.parse_samples('m { a = "1" , b="2" }\t3\n')
    assert spaced == [pt.Sample("m", {"a": "1", "b": "2"}, 3.0, None)]
    assert pt.parse_samples("m{} 1\r\n") == [pt.Sample("m", {}, 1.0, None)]


def test_help_type_and_comments():
    text = (
        "# a free comment\n"
        "#\n"
        "# HELP h Line one\\nline two with a \\\\ backslash\n"
        "# HELP empty\n"
        "# TYPE h counter\n"
        "# TYPE s summary\n"
        "h_total 3\n"
        "h_created 1.7e9\n"
        's{quantile="0.5"} 1\n'
        "s_sum 2\n"
        "s_count 2\n"
        "\n"
    )
    exposition = pt.parse(text)
    assert exposition.helps == {"h": "Line one\nline two with a \\ backslash", "empty": ""}
    assert exposition.types == {"h": "counter", "s": "summary"}
    assert pt.metric_type(exposition, "h_total") == ("h", "counter")
    assert pt.metric_type(exposition, "h_created") == ("h_created", "untyped")
    assert pt.metric_type(exposition, "s_sum") == ("s", "summary")
    assert pt.metric_type(exposition, "s") == ("s", "summary")
    assert pt.sum_samples(exposition.samples, "h_total") == 3.0


def test_label_named_like_the_helper_arguments():
    samples = pt.parse_samples('m{name="a",samples="b",label="c"} 1\nm{name="x"} 2\n')
    assert pt.sum_samples(samples, "m", name="a") == 1.0
    assert pt.group_by_label(samples, "m", "name") == {"a": 1.0, "x": 2.0}
    assert pt.group_by_label(samples, "m", "samples") == {"b": 1.0}


@pytest.mark.parametrize(
    "text, reason",
    [
        ("m\n", "line 1: no value"),
        ("ok 1\nm{a=1} 1\n", "line 2: expected '\"' to open the value of label a"),
        ('m{a="1"\n', "expected ',' or '}' after a label value"),
        ('m{a="1} 2\n', "unterminated value of label a"),
        ('m{a="\\t"} 1\n', "invalid escape sequence"),
        ('m{a="1",a="2"} 1\n', "label a appears twice"),
        ('m{1a="1"} 1\n', "expected a label name or '}'"),
        ("m one\n", "value 'one' is not a number"),
        ("m 1_000\n", "value '1_000' is not a number"),
        ("m 1 2.5\n", "timestamp '2.5' is not an integer"),
        ("m 1 2 3\n", "more than a value and a timestamp"),
        ("9m 1\n", "expected a metric name"),
        ("m-x 1\n", "expected a space before the value"),
        ("# TYPE m countr\n", "unknown metric type 'countr' for m"),
        ("# TYPE m counter\n# TYPE m gauge\n", "second TYPE line for m"),
        ("# HELP m a\n# HELP m b\n", "second HELP line for m"),
        ("# TYPE\n", "# TYPE without a valid metric name"),
        ("# HELP m bad \\q escape\n", "invalid escape sequence"),
        ('m{a="1"} 1\nm{a="1"} 2\n', "line 2: this series appears twice"),
    ],
)
def test_malformed_lines_raise(text, reason):
    with pytest.raises(pt.PrometheusParseError, match=re.escape(reason)):
        pt.parse(text)


def test_error_message_is_one_line_and_quotes_the_line():
    with pytest.raises(pt.PrometheusParseError) as caught:
        pt.parse("ok 1\n\nbroken{ 1\n")
    assert str(caught.value) == "line 3: expected a label name or '}': 'broken{ 1'"


def test_format_series_round_trips():
    labels = {"b": 'x"y', "a": "p\\q\nr"}
    line = pt.format_series("m", labels) + " 1"
    assert line == 'm{a="p\\\\q\\nr",b="x\\"y"} 1'
    assert pt.parse_samples(line) == [pt.Sample("m", labels, 1.0, None)]
    assert pt.format_series("m", {}) == "m"


# --- usable outside Ansible -------------------------------------------------------------------------------


def test_stdlib_only_and_loadable_by_path():
    path = REPO / "module_utils" / "prometheus_text.py"
    imported = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            imported.update(alias.name.split(".")[0] for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            imported.add((node.module or "").split(".")[0])
    assert imported == {"math", "re", "collections"}
    spec = importlib.util.spec_from_file_location("prometheus_text_by_path", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    assert module.sum_samples(module.parse_samples(capture("eagle3-random-after.txt")), DRAFTS) == 154.0
