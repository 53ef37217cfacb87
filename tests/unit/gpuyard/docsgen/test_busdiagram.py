"""The README's picture of the bus is the bus users' grants (gpuyard.docsgen.busdiagram): who publishes which event
into which stream, who reads which stream, who hears what live; made anew by `make docs`."""

from __future__ import annotations

import pytest

from gpuyard.docsgen import busdiagram
from gpuyard.shared.contracts.events.subjects import EVENTS_STREAM, TELEMETRY_STREAM, Subject
from tests.unit.project.test_packaging import ROOT


def test_the_readmes_picture_of_the_bus_is_the_grants():
    readme = (ROOT / "README.md").read_text()
    assert busdiagram.written(readme) == readme, "the README's bus is stale: make docs"


def test_the_picture_says_what_each_service_publishes_and_reads():
    drawn = busdiagram.diagram().splitlines()
    publishes = {
        line.split(" -->|")[0].strip(): line for line in drawn if " -->|" in line and "events" in line
    }
    assert "model.published" in publishes["submit"] and "model.published" not in publishes["monitor"]
    assert "  events --> serving" in drawn  # job.placed reaches serving, which hosts serve jobs
    assert "  telemetry -. live .-> scheduler" in drawn  # node heartbeats, heard live
    assert "  supervisor -->|service.status| telemetry" in drawn


def test_which_stream_carries_and_hears_what():
    assert busdiagram.carries(EVENTS_STREAM, Subject.JOB_PLACED)
    assert busdiagram.carries(EVENTS_STREAM, Subject.NODE_CONTROL)
    assert not busdiagram.carries(EVENTS_STREAM, Subject.NODE_HEARTBEAT)
    assert busdiagram.carries(TELEMETRY_STREAM, Subject.NODE_HEARTBEAT)
    assert busdiagram.heard(TELEMETRY_STREAM, "node.heartbeat") and not busdiagram.heard(
        EVENTS_STREAM, "gpu.sample"
    )
    assert busdiagram.heard(EVENTS_STREAM, "node.>") and busdiagram.heard(TELEMETRY_STREAM, "node.>")


def test_a_readme_without_the_markers_is_said_so():
    with pytest.raises(ValueError, match="the README has no"):
        busdiagram.written("# a README\n")
