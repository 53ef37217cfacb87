"""What a service is started with (its bus, event store, job ledger, log store) is read through `Service`'s
properties, typed as open: one read before `Service.start` opened it, or one the service does not open, says
so in one clear error."""

from __future__ import annotations

import pytest

from gpuyard.shared.runtime.service import NotOpen, Service
from gpuyard.shared.settings.common import CommonSettings


@pytest.mark.parametrize(
    ("what", "said"),
    [("bus", "bus"), ("store", "event store"), ("ledger", "job ledger"), ("logs", "log store")],
)
def test_each_read_before_the_start_says_to_start_first(what, said):
    service = Service("scheduler", CommonSettings(), needs_logs=True)
    with pytest.raises(NotOpen, match=rf"^the scheduler service's {said} is not open: call start\(\) first$"):
        getattr(service, what)


def test_one_the_service_does_not_open_says_why():
    service = Service("monitor", CommonSettings(), needs_store=False)
    with pytest.raises(
        NotOpen, match=r"event store is not open: the service is made without needs_store=True"
    ):
        assert service.store is None  # (never: it raises)
    with pytest.raises(NotOpen, match=r"log store is not open: the service is made without needs_logs=True"):
        assert service.logs is None  # (never: it raises)
