"""Parser for the Prometheus text exposition format 0.0.4, and helpers to sum and group its samples.

Pure standard library and no Ansible imports, so that a module imports it as
``ansible.module_utils.prometheus_text`` and a script under ``bench/`` can load it by path.

What it reads (https://prometheus.io/docs/instrumenting/exposition_formats/, text format 0.0.4):

- ``# HELP <name> <docstring>`` (docstring escapes ``\\\\`` and ``\\n``) and ``# TYPE <name> <type>``; any
  other line starting with ``#`` is a comment; blank lines are skipped.
- ``name{label="value",...} value [timestamp]``: metric names may hold colons (``vllm:...``), label values
  escape ``\\\\``, ``\\"`` and ``\\n``, a trailing comma in the label set is allowed, values are floats
  including ``NaN``, ``+Inf`` and ``-Inf``, the optional timestamp is an integer (milliseconds).

Anything else raises PrometheusParseError naming the line number, never a guess.

Counters and their ``_created`` gauges: prometheus_client (and so vLLM) exposes a counter ``foo`` as the
sample ``foo_total`` and, next to it, a gauge ``foo_created`` holding the counter's creation time (Unix
seconds). The helpers here select samples by their exact name, so summing ``foo_total`` never picks up
``foo_created``; ``metric_type`` tells which family and type a sample name belongs to.
"""

import math
import re
from collections import namedtuple

__all__ = [
    "PrometheusParseError",
    "Sample",
    "Exposition",
    "parse",
    "parse_samples",
    "metric_type",
    "select_samples",
    "sum_samples",
    "group_by_label",
    "series_key",
    "format_series",
]

METRIC_TYPES = ("counter", "gauge", "histogram", "summary", "untyped")
# Sample-name suffixes that belong to a family of another name, by the family's type.
FAMILY_SUFFIXES = {
    "counter": ("_total",),
    "histogram": ("_bucket", "_sum", "_count"),
    "summary": ("_sum", "_count"),
}

_NAME_RE = re.compile(r"[a-zA-Z_:][a-zA-Z0-9_:]*")
_LABEL_NAME_RE = re.compile(r"[a-zA-Z_][a-zA-Z0-9_]*")
_BLANK = " \t"
_LABEL_ESCAPES = {"\\": "\\", '"': '"', "n": "\n"}
_HELP_ESCAPES = {"\\": "\\", "n": "\n"}
# Go's strconv.ParseFloat spellings of the special values, which Prometheus writes as NaN, +Inf and -Inf.
_SPECIAL_VALUES = {
    "nan": math.nan,
    "inf": math.inf,
    "+inf": math.inf,
    "-inf": -math.inf,
    "infinity": math.inf,
    "+infinity": math.inf,
    "-infinity": -math.inf,
}
_FLOAT_RE = re.compile(r"[+-]?(?:\d+\.?\d*|\.\d+)(?:[eE][+-]?\d+)?")
_TIMESTAMP_RE = re.compile(r"[+-]?\d+")
# "# HELP name docstring" / "# TYPE name type"; the docstring is everything after the name and one blank.
_COMMENT_RE = re.compile(r"#[ \t]*(HELP|TYPE)(?:[ \t]+(\S*)(?:[ \t](.*))?)?$")


class PrometheusParseError(ValueError):
    """The text is not valid Prometheus text format; the message names the line."""


Sample = namedtuple("Sample", "name labels value timestamp")
Sample.__doc__ = (
    "One sample: metric name, labels (dict str -> str), value (float), timestamp (int ms or None)."
)

Exposition = namedtuple("Exposition", "samples types helps")
Exposition.__doc__ = "A parsed scrape: samples (list of Sample), types and helps (dicts keyed by the name)."


def _error(number, line, reason):
    shown = line if len(line) <= 120 else line[:120] + "..."
    return PrometheusParseError(f"line {number}: {reason}: {shown!r}")


def _unescape(text, escapes, number, line):
    out, i = [], 0
    while i < len(text):
        char = text[i]
        if char == "\\":
            if i + 1 >= len(text) or text[i + 1] not in escapes:
                raise _error(number, line, "invalid escape sequence")
            out.append(escapes[text[i + 1]])
            i += 2
        else:
            out.append(char)
            i += 1
    return "".join(out)


def _skip_blank(line, pos):
    while pos < len(line) and line[pos] in _BLANK:
        pos += 1
    return pos


def parse_value(token):
    """A sample value as a float: decimal or exponent notation, NaN, +Inf, -Inf. Raises ValueError."""
    special = _SPECIAL_VALUES.get(token.lower())
    if special is not None:
        return special
    if not _FLOAT_RE.fullmatch(token):
        raise ValueError(f"not a number: {token!r}")
    return float(token)


def _parse_labels(line, pos, number):
    """Parse the label set starting just after '{'; return (labels, position after '}')."""
    labels = {}
    while True:
        pos = _skip_blank(line, pos)
        if pos < len(line) and line[pos] == "}":
            return labels, pos + 1
        match = _LABEL_NAME_RE.match(line, pos)
        if not match:
            raise _error(number, line, "expected a label name or '}'")
        label = match.group(0)
        pos = _skip_blank(line, match.end())
        if pos >= len(line) or line[pos] != "=":
            raise _error(number, line, f"expected '=' after label {label}")
        pos = _skip_blank(line, pos + 1)
        if pos >= len(line) or line[pos] != '"':
            raise _error(number, line, f"expected '\"' to open the value of label {label}")
        pos += 1
        start = pos
        while pos < len(line) and line[pos] != '"':
            pos += 2 if line[pos] == "\\" else 1
        if pos >= len(line):
            raise _error(number, line, f"unterminated value of label {label}")
        if label in labels:
            raise _error(number, line, f"label {label} appears twice")
        labels[label] = _unescape(line[start:pos], _LABEL_ESCAPES, number, line)
        pos = _skip_blank(line, pos + 1)
        if pos < len(line) and line[pos] == ",":
            pos += 1
        elif pos >= len(line) or line[pos] != "}":
            raise _error(number, line, "expected ',' or '}' after a label value")


def _parse_sample(line, number):
    match = _NAME_RE.match(line)
    if not match:
        raise _error(number, line, "expected a metric name")
    name, pos = match.group(0), match.end()
    labels = {}
    after_blank = _skip_blank(line, pos)
    if after_blank < len(line) and line[after_blank] == "{":
        labels, pos = _parse_labels(line, after_blank + 1, number)
    elif pos < len(line) and line[pos] not in _BLANK:
        raise _error(number, line, "expected a space before the value")
    tokens = line[pos:].split()
    if not tokens:
        raise _error(number, line, "no value")
    if len(tokens) > 2:
        raise _error(number, line, "more than a value and a timestamp after the metric")
    try:
        value = parse_value(tokens[0])
    except ValueError:
        raise _error(number, line, f"value {tokens[0]!r} is not a number") from None
    timestamp = None
    if len(tokens) == 2:
        if not _TIMESTAMP_RE.fullmatch(tokens[1]):
            raise _error(number, line, f"timestamp {tokens[1]!r} is not an integer")
        timestamp = int(tokens[1])
    return Sample(name, labels, value, timestamp)


def _parse_comment(line, number, types, helps):
    match = _COMMENT_RE.match(line)
    if not match:
        return  # a plain comment
    keyword, name, rest = match.group(1), match.group(2) or "", match.group(3) or ""
    if not _NAME_RE.fullmatch(name):
        raise _error(number, line, f"# {keyword} without a valid metric name")
    if keyword == "HELP":
        if name in helps:
            raise _error(number, line, f"second HELP line for {name}")
        helps[name] = _unescape(rest, _HELP_ESCAPES, number, line)
        return
    kind = rest.strip(_BLANK)
    if kind not in METRIC_TYPES:
        raise _error(number, line, f"unknown metric type {kind!r} for {name}")
    if name in types:
        raise _error(number, line, f"second TYPE line for {name}")
    types[name] = kind


def parse(text):
    """Parse a whole scrape. Returns an Exposition(samples, types, helps); raises PrometheusParseError.

    A series (name plus labels) that appears twice is an error: summing it would count it twice.
    """
    samples, types, helps, seen = [], {}, {}, set()
    for number, raw in enumerate(text.split("\n"), 1):
        line = raw[:-1] if raw.endswith("\r") else raw
        stripped = line.strip(_BLANK)
        if not stripped:
            continue
        if stripped.startswith("#"):
            _parse_comment(stripped, number, types, helps)
            continue
        sample = _parse_sample(stripped, number)
        key = series_key(sample)
        if key in seen:
            raise _error(number, line, "this series appears twice")
        seen.add(key)
        samples.append(sample)
    return Exposition(samples, types, helps)


def parse_samples(text):
    """Only the samples of parse(text)."""
    return parse(text).samples


def metric_type(exposition, name):
    """(family, type) of a sample name, from the scrape's TYPE lines; ('name', 'untyped') when none applies.

    The sample's own name is looked up first, so ``foo_created`` (TYPE gauge) stays a gauge next to the
    counter ``foo``/``foo_total``, and a histogram named ``foo_total`` (vLLM's ``iteration_tokens_total``)
    is not mistaken for a counter.
    """
    if name in exposition.types:
        return name, exposition.types[name]
    for kind, suffixes in FAMILY_SUFFIXES.items():
        for suffix in suffixes:
            family = name[: -len(suffix)]
            if name.endswith(suffix) and exposition.types.get(family) == kind:
                return family, kind
    return name, "untyped"


def _matches(labels, label_filter):
    return all(labels.get(label) == wanted for label, wanted in label_filter.items())


def select_samples(samples, name, /, **label_filter):
    """Samples named exactly `name` whose labels include every label=value of `label_filter`."""
    return [sample for sample in samples if sample.name == name and _matches(sample.labels, label_filter)]


def sum_samples(samples, name, /, **label_filter):
    """Sum of the values of select_samples(samples, name, **label_filter); 0.0 when none match.

    Exact names only: sum_samples(s, "foo_total") never includes "foo_created".
    """
    return math.fsum(sample.value for sample in select_samples(samples, name, **label_filter))


def group_by_label(samples, name, label, /, **label_filter):
    """{value of `label`: summed value} over select_samples(); samples without `label` are left out.

    For example group_by_label(s, "vllm:spec_decode_num_accepted_tokens_per_pos_total", "position") sums
    every engine's counter per position: {"0": 40.0, "1": 38.0, "2": 31.0}.
    """
    groups = {}
    for sample in select_samples(samples, name, **label_filter):
        if label in sample.labels:
            key = sample.labels[label]
            groups[key] = groups.get(key, 0.0) + sample.value
    return groups


def series_key(sample):
    """A hashable identity of a sample's series: (name, sorted label pairs)."""
    return sample.name, tuple(sorted(sample.labels.items()))


def _escape_label_value(value):
    return value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


def format_series(name, labels):
    """The series as the text format writes it: name{a="1",b="2"} (labels sorted, values escaped)."""
    if not labels:
        return name
    inner = ",".join(f'{label}="{_escape_label_value(labels[label])}"' for label in sorted(labels))
    return f"{name}{{{inner}}}"
