"""`/metrics`: the per-model request counts and latency histograms of `stats.Stats` in the Prometheus text
format (version 0.0.4), written here: a few lines per model, no client library needed.

Series (labels `tenant`, `model`, `version`):
- `gpuyard_inference_requests_total{...,outcome="success"|"failure"}`
- `gpuyard_inference_request_seconds_bucket{...,le="…"}`, `_sum`, `_count` (from the request's arrival at the
  model to its answer: decoding, batching queue, `session.run`, encoding; a forwarded request counts on the
  node that answers it)."""

from __future__ import annotations

from services.serving.held import split_key
from services.serving.stats import LATENCY_BUCKETS, Stats

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"
REQUESTS = "gpuyard_inference_requests_total"
LATENCY = "gpuyard_inference_request_seconds"


def _escape(value: str) -> str:
    return value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


def _labels(key: str, version: str) -> str:
    tenant, name = split_key(key) if "/" in key else ("", key)
    return f'tenant="{_escape(tenant)}",model="{_escape(name)}",version="{_escape(version)}"'


def render(stats: Stats) -> str:
    lines = [
        f"# HELP {REQUESTS} Inference requests answered, per model version and outcome.",
        f"# TYPE {REQUESTS} counter",
    ]
    models = sorted(stats.models.items())
    for (key, version), s in models:
        labels = _labels(key, version)
        lines.append(f'{REQUESTS}{{{labels},outcome="success"}} {s.success}')
        lines.append(f'{REQUESTS}{{{labels},outcome="failure"}} {s.failure}')
    lines += [
        f"# HELP {LATENCY} Time to answer an inference request, per model version.",
        f"# TYPE {LATENCY} histogram",
    ]
    for (key, version), s in models:
        labels = _labels(key, version)
        cumulative = 0
        for bound, count in zip(LATENCY_BUCKETS, s.buckets, strict=False):
            cumulative += count
            lines.append(f'{LATENCY}_bucket{{{labels},le="{bound:g}"}} {cumulative}')
        lines.append(f'{LATENCY}_bucket{{{labels},le="+Inf"}} {s.count}')
        lines.append(f"{LATENCY}_sum{{{labels}}} {s.latency_sum!r}")
        lines.append(f"{LATENCY}_count{{{labels}}} {s.count}")
    return "\n".join(lines) + "\n"
