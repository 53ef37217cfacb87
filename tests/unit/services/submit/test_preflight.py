"""What the submit service refuses to start with, in one line (`preflight.py`)."""

from __future__ import annotations

from gpuyard.services.submit.preflight import preflight
from gpuyard.shared.settings.submit import SubmitSettings


def test_a_volume_store_fsspec_does_not_know_is_refused_with_its_url(tmp_path):
    said = preflight(SubmitSettings(data_dir=tmp_path, volume_store="nosuchstore://bucket/prefix"))
    assert said is not None and said.startswith(
        "the volume store nosuchstore://bucket/prefix is not a URL fsspec knows"
    )


def test_a_public_address_without_tokens_is_refused_and_loopback_is_not(tmp_path):
    said = preflight(SubmitSettings(data_dir=tmp_path, submit_host="0.0.0.0"))
    assert said is not None and "0.0.0.0 is not loopback" in said
    assert preflight(SubmitSettings(data_dir=tmp_path)) is None
