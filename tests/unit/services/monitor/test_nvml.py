"""`gpuyard.shared.gpus.nvml` against a fake NVML module (the same functions, constants and error classes as pynvml): every
figure read, XID errors from the event set, ECC counts, a GPU lost, figures a GPU does not report, and a
machine without the driver. `FakeNvml` is shared with the other monitor tests."""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from types import SimpleNamespace

import pytest

import gpuyard.shared.gpus.nvml
from gpuyard.services.executor.gpuwatch import GpuProcess, NvmlProcessReader
from gpuyard.shared.gpus.inventory import nvml_gpus
from gpuyard.shared.gpus.nvml import Nvml

GIB = 1 << 30


class NVMLError(Exception):
    def __init__(self, value: int = 999):
        super().__init__(value)
        self.value = value


class NVMLError_NotSupported(NVMLError):  # noqa: N801 (pynvml's names)
    pass


class NVMLError_GpuIsLost(NVMLError):  # noqa: N801
    pass


class NVMLError_Timeout(NVMLError):  # noqa: N801
    pass


class NVMLError_LibraryNotFound(NVMLError):  # noqa: N801
    pass


NOT_SUPPORTED = "not supported"


@dataclass
class FakeGpu:
    """One GPU's figures; a figure set to NOT_SUPPORTED raises NVMLError_NotSupported when read."""

    name: str = "NVIDIA H100 80GB HBM3"
    uuid: str = "GPU-0"
    bus_id: bytes = b"00000000:1B:00.0"
    total: int = 80 * GIB
    used: int | str = 10 * GIB
    util: int | str = 50
    mem_util: int = 20
    temperature: int | str = 61
    power_mw: int | str = 250_000
    limit_mw: int | str = 700_000
    sm_clock: int | str = 1980
    mem_clock: int | str = 2619
    ecc: tuple[int, int] | str = (0, 0)
    processes: list[tuple[int, int | None]] = field(default_factory=list)
    xid_events: bool = True
    lost: bool = False


class FakeNvml:
    """A stand-in for the pynvml module."""

    NVMLError = NVMLError
    NVMLError_NotSupported = NVMLError_NotSupported
    NVMLError_GpuIsLost = NVMLError_GpuIsLost
    NVMLError_Timeout = NVMLError_Timeout
    NVML_TEMPERATURE_GPU = 0
    NVML_CLOCK_SM = 1
    NVML_CLOCK_MEM = 2
    NVML_MEMORY_ERROR_TYPE_CORRECTED = 0
    NVML_MEMORY_ERROR_TYPE_UNCORRECTED = 1
    NVML_VOLATILE_ECC = 0
    nvmlEventTypeXidCriticalError = 0x8
    nvmlEventTypeSingleBitEccError = 0x1

    def __init__(self, gpus: list[FakeGpu], *, driver: bool = True):
        self.gpus = gpus
        self.driver = driver
        self.events: list[SimpleNamespace] = []
        self.registered: dict[int, int] = {}
        self.inits = 0
        self.shutdowns = 0

    # test controls
    def xid(self, index: int, code: int) -> None:
        self.events.append(SimpleNamespace(device=index, eventType=0x8, eventData=code))

    def other_event(self, index: int) -> None:
        self.events.append(SimpleNamespace(device=index, eventType=0x1, eventData=0))

    # pynvml's functions (a handle is the GPU's index)
    def nvmlInit(self):  # noqa: N802
        if not self.driver:
            raise NVMLError_LibraryNotFound(12)
        self.inits += 1

    def nvmlShutdown(self):  # noqa: N802
        self.shutdowns += 1

    def nvmlDeviceGetCount(self):  # noqa: N802
        return len(self.gpus)

    def gpu(self, h: int) -> FakeGpu:
        gpu = self.gpus[h]
        if gpu.lost:
            raise NVMLError_GpuIsLost(15)
        return gpu

    def value(self, h: int, name: str):
        v = getattr(self.gpu(h), name)
        if v == NOT_SUPPORTED:
            raise NVMLError_NotSupported(3)
        return v

    def nvmlDeviceGetHandleByIndex(self, i):  # noqa: N802
        return i

    def nvmlDeviceGetIndex(self, h):  # noqa: N802
        return h

    def nvmlDeviceGetUUID(self, h):  # noqa: N802
        return self.gpu(h).uuid

    def nvmlDeviceGetName(self, h):  # noqa: N802
        return self.gpu(h).name.encode()

    def nvmlDeviceGetPciInfo(self, h):  # noqa: N802
        return SimpleNamespace(busId=self.gpu(h).bus_id)

    def nvmlDeviceGetMemoryInfo(self, h):  # noqa: N802
        used = self.value(h, "used")
        total = self.gpu(h).total
        return SimpleNamespace(total=total, used=used, free=total - used)

    def nvmlDeviceGetUtilizationRates(self, h):  # noqa: N802
        return SimpleNamespace(gpu=self.value(h, "util"), memory=self.gpu(h).mem_util)

    def nvmlDeviceGetTemperature(self, h, sensor):  # noqa: N802
        assert sensor == self.NVML_TEMPERATURE_GPU
        return self.value(h, "temperature")

    def nvmlDeviceGetPowerUsage(self, h):  # noqa: N802
        return self.value(h, "power_mw")

    def nvmlDeviceGetEnforcedPowerLimit(self, h):  # noqa: N802
        return self.value(h, "limit_mw")

    def nvmlDeviceGetClockInfo(self, h, kind):  # noqa: N802
        return self.value(h, "sm_clock" if kind == self.NVML_CLOCK_SM else "mem_clock")

    def nvmlDeviceGetTotalEccErrors(self, h, error_type, counter):  # noqa: N802
        assert counter == self.NVML_VOLATILE_ECC
        return self.value(h, "ecc")[error_type]

    def nvmlDeviceGetComputeRunningProcesses(self, h):  # noqa: N802
        return [SimpleNamespace(pid=pid, usedGpuMemory=used) for pid, used in self.gpu(h).processes]

    def nvmlEventSetCreate(self):  # noqa: N802
        return "event-set"

    def nvmlDeviceGetSupportedEventTypes(self, h):  # noqa: N802
        return 0x8 | 0x1 if self.gpu(h).xid_events else 0x1

    def nvmlDeviceRegisterEvents(self, h, mask, es):  # noqa: N802
        self.registered[h] = mask

    def nvmlEventSetWait(self, es, timeout_ms):  # noqa: N802
        assert timeout_ms == 0  # never blocks a sample
        if not self.events:
            raise NVMLError_Timeout(10)
        return self.events.pop(0)

    def nvmlEventSetFree(self, es):  # noqa: N802
        pass


def opened(*gpus: FakeGpu) -> tuple[Nvml, FakeNvml]:
    fake = FakeNvml(list(gpus))
    return Nvml(fake).open(), fake


def test_every_figure_is_read_in_its_unit():
    nvml, _ = opened(FakeGpu(processes=[(4242, 3 * GIB), (4343, None)]))
    [g] = nvml.read()
    assert (g.index, g.uuid, g.model, g.pci_bus_id) == (0, "GPU-0", "H100", "00000000:1B:00.0")
    assert (g.utilization_pct, g.memory_util_pct) == (50.0, 20.0)
    assert (g.memory_used_bytes, g.memory_total_bytes) == (10 * GIB, 80 * GIB)
    assert (g.temperature_c, g.power_w, g.power_limit_w) == (61.0, 250.0, 700.0)
    assert (g.sm_clock_mhz, g.memory_clock_mhz) == (1980, 2619)
    assert (g.ecc_corrected, g.ecc_uncorrected) == (0, 0)
    assert [(p.pid, p.used_bytes) for p in g.processes] == [(4242, 3 * GIB), (4343, None)]
    assert not g.lost and g.xids == [] and g.last_xid is None


def test_a_figure_a_gpu_does_not_report_is_none_not_an_error():
    old = FakeGpu(
        util=NOT_SUPPORTED,
        temperature=NOT_SUPPORTED,
        power_mw=NOT_SUPPORTED,
        limit_mw=NOT_SUPPORTED,
        sm_clock=NOT_SUPPORTED,
        ecc=NOT_SUPPORTED,  # e.g. a consumer GPU: no ECC
        xid_events=False,
    )
    nvml, fake = opened(old)
    [g] = nvml.read()
    assert g.utilization_pct is None and g.memory_util_pct is None
    assert g.temperature_c is None and g.power_w is None and g.power_limit_w is None
    assert g.sm_clock_mhz is None and g.memory_clock_mhz == 2619
    assert g.ecc_corrected is None and g.ecc_uncorrected is None
    assert g.memory_used_bytes == 10 * GIB and not g.lost
    assert fake.registered == {}  # no XID events on this GPU: none registered, no error


def test_ecc_counts_are_the_volatile_totals():
    nvml, fake = opened(FakeGpu(ecc=(3, 0)))
    assert nvml.read()[0].ecc_corrected == 3
    fake.gpus[0].ecc = (5, 1)
    [g] = nvml.read()
    assert (g.ecc_corrected, g.ecc_uncorrected) == (5, 1)


def test_xid_errors_come_from_the_event_set_once_each_and_the_last_one_stays():
    nvml, fake = opened(FakeGpu(uuid="GPU-0"), FakeGpu(uuid="GPU-1"))
    assert fake.registered == {0: 0x8, 1: 0x8}
    fake.xid(1, 79)
    fake.other_event(0)  # not an XID: passed over
    fake.xid(1, 48)
    first = nvml.read()
    assert [g.xids for g in first] == [[], [79, 48]]
    assert [g.last_xid for g in first] == [None, 48]
    again = nvml.read()  # drained: each XID is reported in one sample only
    assert [g.xids for g in again] == [[], []]
    assert again[1].last_xid == 48  # DCGM_FI_DEV_XID_ERRORS: the last XID seen


def test_a_gpu_nvml_reports_lost_is_marked_lost_and_the_others_still_read():
    nvml, fake = opened(FakeGpu(uuid="GPU-0"), FakeGpu(uuid="GPU-1"))
    fake.gpus[0].lost = True
    lost, fine = nvml.read()
    assert lost.lost and lost.uuid == "GPU-0" and lost.pci_bus_id == "00000000:1B:00.0"
    assert lost.utilization_pct is None and lost.memory_used_bytes is None
    assert lost.memory_total_bytes == 80 * GIB  # (known from when it was opened)
    assert not fine.lost and fine.utilization_pct == 50.0
    assert nvml.read()[0].lost  # stays lost
    assert [d.uuid for d in nvml.devices()] == ["GPU-1"]  # not announced any more
    assert [p.gpu_index for p in nvml.processes()] == []


def test_no_driver_means_zero_gpus_said_once(caplog, monkeypatch):
    monkeypatch.setattr(gpuyard.shared.gpus.nvml, "_said_absent", False)
    with caplog.at_level(logging.INFO, logger="gpuyard.shared.gpus.nvml"):
        for _ in range(3):
            nvml = Nvml(FakeNvml([], driver=False)).open()
            assert not nvml.available and nvml.read() == [] and nvml.devices() == []
            assert nvml.processes() == [] and "NVML" in nvml.why
            assert nvml_gpus(nvml) == []
            nvml.close()
    said = [r for r in caplog.records if "no NVIDIA GPU" in r.getMessage()]
    assert len(said) == 1 and said[0].levelno == logging.INFO
    assert not [r for r in caplog.records if r.levelno >= logging.WARNING]


def test_the_node_discovery_and_the_slice_watch_read_through_the_same_nvml():
    nvml, fake = opened(
        FakeGpu(uuid="GPU-a", processes=[(11, 2 * GIB), (12, None)]),
        FakeGpu(uuid="GPU-b", name="Tesla V100-SXM2-16GB", total=16 * GIB),
    )
    assert [(g.index, g.uuid, g.model, g.memory_bytes) for g in nvml_gpus(nvml)] == [
        (0, "GPU-a", "H100", 80 * GIB),
        (1, "GPU-b", "V100-SXM2-16GB", 16 * GIB),
    ]
    reader = NvmlProcessReader(nvml)
    assert reader.available and reader() == [GpuProcess(pid=11, gpu_index=0, used_bytes=2 * GIB)]
    reader.close()
    assert fake.inits == 1  # opened once


def test_the_slice_watch_says_why_without_a_driver():
    reader = NvmlProcessReader(Nvml(FakeNvml([], driver=False)).open())
    assert not reader.available and "NVML" in reader.error and reader() == []


def test_close_shuts_nvml_down_once():
    nvml, fake = opened(FakeGpu())
    nvml.close()
    nvml.close()
    assert fake.shutdowns == 1 and nvml.read() == []


@pytest.mark.parametrize("name,short", [("NVIDIA A100-SXM4-80GB", "A100-SXM4-80GB"), ("NVIDIA L4", "L4")])
def test_short_model_names(name, short):
    assert gpuyard.shared.gpus.nvml.short_model(name) == short
