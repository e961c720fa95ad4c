"""The metric names a PromQL expression reads, and the series names a registry exports.

Not a PromQL parser: it strips what cannot be a metric name (strings, label matchers, ranges,
grouping label lists, numbers and durations, Grafana variables), then every identifier left is a
function (followed by `(`), a keyword, or a metric name. Unknown functions are reported too, so a
typo such as `rat(` does not pass as "no metric here".
"""

from __future__ import annotations

import re
from collections.abc import Iterable

from prometheus_client.metrics_core import Metric

# https://prometheus.io/docs/prometheus/latest/querying/functions/
FUNCTIONS = frozenset(
    """
    abs absent absent_over_time acos acosh asin asinh atan atanh avg_over_time ceil changes clamp
    clamp_max clamp_min cos cosh count_over_time day_of_month day_of_week day_of_year days_in_month
    deg delta deriv double_exponential_smoothing exp floor histogram_avg histogram_count
    histogram_fraction histogram_quantile histogram_stddev histogram_stdvar histogram_sum
    holt_winters hour idelta increase info irate label_join label_replace last_over_time ln log10
    log2 mad_over_time max_over_time min_over_time minute month pi predict_linear
    present_over_time quantile_over_time rad rate resets round scalar sgn sin sinh sort
    sort_by_label sort_by_label_desc sort_desc sqrt stddev_over_time stdvar_over_time
    sum_over_time tan tanh time timestamp vector year
    """.split()
)
# https://prometheus.io/docs/prometheus/latest/querying/operators/#aggregation-operators
AGGREGATIONS = frozenset(
    "sum min max avg group stddev stdvar count count_values bottomk topk quantile limitk limit_ratio".split()
)
KEYWORDS = frozenset(
    "by without on ignoring group_left group_right offset bool and or unless atan2 inf nan".split()
)
# Series Prometheus itself adds to every scrape target.
SYNTHETIC = frozenset({"up", "scrape_duration_seconds", "scrape_samples_scraped"})

_GRAFANA_VARIABLE = re.compile(r"\$\{[^}]*\}|\$\w+")
_STRING = re.compile(r'"(?:[^"\\]|\\.)*"|\'(?:[^\'\\]|\\.)*\'|`[^`]*`')
_MATCHERS = re.compile(r"\{[^{}]*\}")
_RANGE = re.compile(r"\[[^\[\]]*\]")
_GROUPING = re.compile(r"\b(by|without|on|ignoring|group_left|group_right)\s*\([^()]*\)")
_NUMBER = re.compile(r"(?<![\w:])\d[\w.]*")
_IDENTIFIER = re.compile(r"[A-Za-z_:][A-Za-z0-9_:]*")
# Grafana's templating query `label_values(<series selector>, <label>)`.
_LABEL_VALUES = re.compile(r"^\s*label_values\((.*),\s*\w+\s*\)\s*$", re.S)


class UnknownFunction(ValueError):
    """The expression calls something PromQL does not have."""


def grafana_query(query: str) -> str:
    """A templating query as the PromQL it runs (`label_values(expr, label)` -> `expr`)."""
    match = _LABEL_VALUES.match(query)
    return match.group(1) if match else query


def metric_names(expr: str) -> set[str]:
    text = _GRAFANA_VARIABLE.sub(" ", expr)
    text = _STRING.sub(" ", text)
    text = _MATCHERS.sub(" ", text)
    text = _RANGE.sub(" ", text)
    text = _GROUPING.sub(r"\1", text)
    text = _NUMBER.sub(" ", text)
    names: set[str] = set()
    for match in _IDENTIFIER.finditer(text):
        word = match.group()
        called = text[match.end() :].lstrip().startswith("(")
        if word in KEYWORDS or (word in AGGREGATIONS and not _is_series(text, match.end())):
            continue
        if called:
            if word not in FUNCTIONS and word not in AGGREGATIONS:
                raise UnknownFunction(f"{word}() in {expr!r}")
            continue
        names.add(word)
    return names


def _is_series(text: str, end: int) -> bool:
    """`sum` alone followed by an operator is a metric called sum; `sum by (...)` / `sum (` is not."""
    rest = text[end:].lstrip()
    return not (rest.startswith("(") or re.match(r"(by|without)\b", rest))


def exported_series(families: Iterable[Metric]) -> set[str]:
    """The series names a scrape of these families can return, by the exposition format's rules."""
    names: set[str] = set()
    for family in families:
        if family.type == "counter":
            names.add(f"{family.name}_total")
        elif family.type == "histogram":
            names.update(f"{family.name}{suffix}" for suffix in ("_bucket", "_sum", "_count"))
        elif family.type == "summary":
            names.update({family.name, f"{family.name}_sum", f"{family.name}_count"})
        else:
            names.add(family.name)
        names.update(sample.name for sample in family.samples if not sample.name.endswith("_created"))
    return names
