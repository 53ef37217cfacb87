"""What a Grafana dashboard (deploy/grafana/*.json) queries, for the tests that hold it to what is exported."""

from __future__ import annotations

import re


def dashboard_queries(dashboard: dict) -> list[str]:
    """Every PromQL query: its panels' targets' and its query variables'."""
    queries = [t["expr"] for p in dashboard["panels"] for t in p["targets"]]
    return queries + [v["definition"] for v in dashboard["templating"]["list"] if v["type"] == "query"]


def queried_metrics(dashboard: dict, *prefixes: str) -> set[str]:
    """The names starting with one of `prefixes` that the dashboard's queries read."""
    name = re.compile(r"\b(?:" + "|".join(re.escape(p) + r"\w+" for p in prefixes) + ")")
    return {found for query in dashboard_queries(dashboard) for found in name.findall(query)}
