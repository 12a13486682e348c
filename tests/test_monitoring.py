"""The shipped monitoring: deploy/prometheus/prometheus.yml and deploy/grafana/chatsite.json.

Neither Prometheus nor Grafana runs here; these tests read the files as they would and check them
against the app: every metric a panel queries exists in chat.metrics' registry under the name
and type the query assumes, with the labels it groups by; the scrape config reaches every
instance of `make cluster` at the app's /metrics and names each one. tests/test_cluster.py
scrapes real instances for the same names.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from django.urls import resolve
from prometheus_client import Metric
from prometheus_client.metrics import MetricWrapperBase

from chat import metrics
from chat.ops import metrics_view  # registers the collector of live state, as the URLs do

ROOT = Path(__file__).resolve().parent.parent
DASHBOARD = ROOT / "deploy" / "grafana" / "chatsite.json"
SCRAPE_CONFIG = ROOT / "deploy" / "prometheus" / "prometheus.yml"

# Labels Prometheus adds to every series it scrapes, and the bucket bound of histograms.
SCRAPE_LABELS = {"instance", "job", "le"}
SAMPLE_SUFFIXES = {
    "counter": ("_total",),
    "gauge": ("",),
    "histogram": ("_bucket", "_sum", "_count"),
}
METRIC_NAME = re.compile(r"\b(?:chat|process|python)_[a-z0-9_]+\b")
GROUPING = re.compile(r"\b(?:by|without)\s*\(([^)]*)\)")
MATCHER = re.compile(r"([a-zA-Z_][a-zA-Z0-9_]*)\s*(?:=~|!~|!=|=)\s*\"")


def exported() -> dict[str, tuple[str, set[str]]]:
    """family name → (type, label names) of everything chat.metrics' registry exports."""
    labels = {
        wrapper._name: set(wrapper._labelnames)  # the wrapper's declared labels
        for wrapper in vars(metrics).values()
        if isinstance(wrapper, MetricWrapperBase)
    }
    families: list[Metric] = list(metrics.REGISTRY.collect())
    return {
        family.name: (
            family.type,
            labels.get(family.name, set()).union(*(s.labels for s in family.samples)),
        )
        for family in families
    }


def family_of(sample: str, families: dict[str, str]) -> str | None:
    """The family a sample name belongs to, given family → type (None: no such sample)."""
    for family, kind in families.items():
        if any(sample == family + suffix for suffix in SAMPLE_SUFFIXES.get(kind, ())):
            return family
    return None


def dashboard() -> dict[str, Any]:
    loaded: dict[str, Any] = json.loads(DASHBOARD.read_text())
    return loaded


def panels(container: dict[str, Any]) -> Iterator[dict[str, Any]]:
    for panel in container.get("panels", []):
        yield panel
        yield from panels(panel)  # a collapsed row holds its panels


def queries() -> list[tuple[str, str]]:
    """(where, PromQL) of every query in the dashboard: panels and template variables."""
    found = [
        (panel["title"], target["expr"])
        for panel in panels(dashboard())
        for target in panel.get("targets", [])
    ]
    for variable in dashboard()["templating"]["list"]:
        if variable["type"] == "query":
            found.append((f"variable {variable['name']}", variable["query"]["query"]))
    return found


def referenced_families() -> set[str]:
    """The metric families the dashboard queries."""
    samples = {sample for _, expr in queries() for sample in METRIC_NAME.findall(expr)}
    return {re.sub(r"_(?:total|bucket|sum|count)$", "", sample) for sample in samples}


@pytest.fixture(scope="module")
def families() -> dict[str, tuple[str, set[str]]]:
    return exported()


def test_every_metric_the_dashboard_queries_is_exported_with_that_name(
    families: dict[str, tuple[str, set[str]]],
) -> None:
    kinds = {name: kind for name, (kind, _) in families.items()}
    unknown = []
    for where, expr in queries():
        for sample in METRIC_NAME.findall(expr):
            if family_of(sample, kinds) is None:
                unknown.append(f"{where}: {sample}")
    assert unknown == []


def test_the_dashboard_groups_and_filters_only_by_labels_the_metrics_have(
    families: dict[str, tuple[str, set[str]]],
) -> None:
    kinds = {name: kind for name, (kind, _) in families.items()}
    wrong = []
    for where, expr in queries():
        names = {family_of(sample, kinds) for sample in METRIC_NAME.findall(expr)}
        known = SCRAPE_LABELS.union(*(families[name][1] for name in names if name))
        clauses = GROUPING.findall(expr)
        grouped = {label.strip() for clause in clauses for label in clause.split(",")}
        used = (grouped | set(MATCHER.findall(expr))) - {""}
        if used - known:
            wrong.append(f"{where}: {sorted(used - known)} not among {sorted(known)}")
    assert wrong == []


def test_the_numbers_operators_ask_for_first_keep_their_names_types_and_labels(
    families: dict[str, tuple[str, set[str]]],
) -> None:
    # A rename breaks dashboards and alerts elsewhere: these are documented in deployment.md.
    stable = {
        "chat_streams_active": ("gauge", set()),
        "chat_turns_finished": ("counter", {"tier", "status"}),
        "chat_added_ttft_seconds": ("histogram", {"tier"}),
        "chat_ttft_seconds": ("histogram", {"tier"}),
        "chat_upstream_errors": ("counter", {"kind"}),
        "chat_rate_limit_rejections": ("counter", {"reason", "channel"}),
        "chat_ws_slow_reader_closed": ("counter", set()),
        "chat_sockets_active": ("gauge", set()),
    }
    found = {name: families.get(name, ("missing", set())) for name in stable}
    # A histogram's samples carry `le` besides its own labels.
    assert {name: (kind, labels - {"le"}) for name, (kind, labels) in found.items()} == stable


def test_the_dashboard_covers_what_operators_ask_for_first() -> None:
    asked = {
        "streams active": "chat_streams_active",
        "turns per second by status": "chat_turns_finished_total",
        "time to first token": "chat_ttft_seconds_bucket",
        "added time to first token": "chat_added_ttft_seconds_bucket",
        "upstream errors by kind": "chat_upstream_errors_total",
        "limiter refusals by limit": "chat_rate_limit_rejections_total",
        "slow-reader cuts": "chat_ws_slow_reader_closed_total",
        "socket count": "chat_sockets_active",
    }
    timeseries = [p for p in panels(dashboard()) if p["type"] == "timeseries"]
    missing = [
        need
        for need, sample in asked.items()
        if not any(sample in t["expr"] for p in timeseries for t in p["targets"])
    ]
    assert missing == []
    quantile_panels = [p for p in timeseries if "histogram_quantile" in str(p["targets"])]
    assert all(p["fieldConfig"]["defaults"]["unit"] == "s" for p in quantile_panels)


def test_every_panel_queries_the_chosen_prometheus_and_instances() -> None:
    for panel in panels(dashboard()):
        if panel["type"] == "row":
            continue
        assert panel["datasource"] == {"type": "prometheus", "uid": "${datasource}"}
        for target in panel["targets"]:
            assert 'instance=~"$instance"' in target["expr"], (panel["title"], target["expr"])
    ids = [panel["id"] for panel in panels(dashboard())]
    assert len(ids) == len(set(ids)), "panel ids must be unique"


def test_the_scrape_config_reaches_each_instance_of_make_cluster_by_name() -> None:
    config = yaml.safe_load(SCRAPE_CONFIG.read_text())
    (job,) = [job for job in config["scrape_configs"] if job["job_name"] == "chatsite"]
    # The app's URL for it, as Django routes it.
    assert resolve(job["metrics_path"]).func is metrics_view.metrics_view
    targets = {
        target: group["labels"]["instance"]
        for group in job["static_configs"]
        for target in group["targets"]
    }
    # deploy/nginx.conf's upstream is what `make cluster` runs; each server has a target.
    nginx = (ROOT / "deploy" / "nginx.conf").read_text()
    upstream = re.findall(r"server (127\.0\.0\.1:\d+) .*# cluster\.sh: (web\d+)", nginx)
    assert upstream and targets == dict(upstream)
    # The dashboard's instance picker reads the label the scrape config sets.
    variables = {v["name"]: v for v in dashboard()["templating"]["list"]}
    assert 'job="chatsite"' in variables["instance"]["query"]["query"]
    assert variables["instance"]["query"]["query"].endswith(", instance)")
