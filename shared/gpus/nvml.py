"""The one module that reads NVIDIA GPUs, through NVML (nvidia-ml-py, module `pynvml`).

`Nvml` opens NVML once and reads every GPU of the node: its identity (`devices`, what the executor announces),
its figures (`read`: a `GpuReading` per GPU, what the monitor samples), and the memory of each process on it
(`processes`, what the executor's slice watch checks). The node discovery (`gpuyard.shared.gpus.inventory.nvml_gpus`), the
executor's slice watch (`services/executor/gpuwatch.py`) and the monitor all read through it.

- A figure a GPU does not report (NVML raises NotSupported, NoPermission, FunctionNotFound, an old driver...)
  is None, never an error. A GPU for which NVML raises GpuIsLost is read as `lost`, its figures None.
- XID errors come from an NVML event set (`nvmlEventTypeXidCriticalError`), drained without blocking at each
  `read` (`nvmlEventSetWait` with a 0 ms timeout; NVMLError_Timeout means no more events).
- A machine without the driver (or without nvidia-ml-py) has zero GPUs: `available` is False, `why` says
  why, and the process logs it once, at INFO, whoever asked.
- The NVML module is injectable: tests pass a fake object with the same functions, constants and error
  classes, and cover XIDs, ECC, lost GPUs and missing figures without a GPU.
"""

from __future__ import annotations

import contextlib
import logging
import threading
from dataclasses import dataclass
from types import ModuleType
from typing import Any

from gpuyard.shared.contracts.events.nodes import GpuInfo, GpuProcessUse, GpuReading

log = logging.getLogger(__name__)

XID_EVENT = 0x8
"""nvmlEventTypeXidCriticalError (where the module does not name it)."""
EVENTS_PER_READ = 256
"""Most XID events drained at one read: a storm of them never holds a sample up."""
_said_absent = False
_said_lock = threading.Lock()


def _say_absent_once(why: str) -> None:
    global _said_absent
    with _said_lock:
        if _said_absent:
            return
        _said_absent = True
    log.info("no NVIDIA GPU on this machine (%s): zero GPUs", why)


def short_model(name: str) -> str:
    """'NVIDIA H100 80GB HBM3' -> 'H100'; the model names users write in gpu_model constraints."""
    for token in name.replace("NVIDIA", "").replace("Tesla", "").split():
        if any(c.isdigit() for c in token) and token[0].isalpha():
            return token.upper()
    return name.strip()


def _text(value: Any) -> str:
    return value.decode(errors="replace") if isinstance(value, bytes) else str(value)


@dataclass(frozen=True)
class Device:
    """What does not change about one GPU while NVML is open."""

    index: int
    handle: Any
    uuid: str
    name: str
    pci_bus_id: str
    memory_total: int


@dataclass(frozen=True)
class ProcessMemory:
    """One process's memory on one GPU, as NVML reports it (None where it cannot say)."""

    gpu_index: int
    pid: int
    used_bytes: int | None


class Lost(Exception):
    """NVML raised GpuIsLost for this GPU."""


class Nvml:
    """NVML, opened once (`open`), read many times, closed once (`close`). Thread-safe enough for one reader
    at a time per instance (NVML itself is thread-safe); `shared()` is the process's instance."""

    _shared: Nvml | None = None
    _shared_lock = threading.Lock()

    def __init__(self, module: ModuleType | Any | None = None):
        """`module`: pynvml or a fake with its functions; None imports pynvml."""
        self.module: Any = module
        """pynvml (untyped) or a fake with its functions; None once closed or when there is no NVML."""
        self.devices_: list[Device] = []
        self.why: str | None = None
        """Why there are no GPUs (no driver, no nvidia-ml-py), when there are none for a reason."""
        self.opened = False
        self.events: Any = None
        self.last_xid: dict[int, int] = {}
        self.lost: set[int] = set()

    @classmethod
    def shared(cls) -> Nvml:
        """This process's NVML, opened at the first call (every reader of the process shares it)."""
        with cls._shared_lock:
            if cls._shared is None:
                nvml = cls()
                nvml.open()
                cls._shared = nvml
            return cls._shared

    # ------------------------------------------------------------------ opening

    def open(self) -> Nvml:
        if self.opened:
            return self
        self.opened = True
        nv = self.module
        if nv is None:
            try:
                import pynvml
            except ImportError:
                self.why = "nvidia-ml-py is not installed"
                _say_absent_once(self.why)
                return self
            nv = self.module = pynvml
        try:
            nv.nvmlInit()
            count = nv.nvmlDeviceGetCount()
        except nv.NVMLError as exc:
            self.why = f"NVML: {exc}"
            self.module = None  # (nothing to shut down)
            _say_absent_once(self.why)
            return self
        for index in range(count):
            device = self._device(index)
            if device is not None:
                self.devices_.append(device)
        self._register_xid_events()
        log.info("NVML: %d NVIDIA GPU(s): %s", len(self.devices_), ", ".join(d.name for d in self.devices_))
        return self

    def _device(self, index: int) -> Device | None:
        nv = self.module
        try:
            handle = nv.nvmlDeviceGetHandleByIndex(index)
        except nv.NVMLError as exc:
            log.warning("NVML: GPU %d cannot be opened: %s", index, exc)
            if isinstance(exc, nv.NVMLError_GpuIsLost):
                self.lost.add(index)
                return Device(index, None, "", "", "", 0)
            return None
        try:
            uuid = _text(nv.nvmlDeviceGetUUID(handle))
        except nv.NVMLError_GpuIsLost:
            self.lost.add(index)
            return Device(index, handle, "", "", "", 0)
        name = self._figure(lambda: _text(nv.nvmlDeviceGetName(handle)), index) or ""
        pci = self._figure(lambda: nv.nvmlDeviceGetPciInfo(handle), index)
        memory = self._figure(lambda: nv.nvmlDeviceGetMemoryInfo(handle), index)
        return Device(
            index,
            handle,
            uuid,
            name,
            _text(getattr(pci, "busId", "")) if pci is not None else "",
            int(memory.total) if memory is not None else 0,
        )

    def _register_xid_events(self) -> None:
        nv = self.module
        xid = getattr(nv, "nvmlEventTypeXidCriticalError", XID_EVENT)
        try:
            events = nv.nvmlEventSetCreate()
        except nv.NVMLError as exc:
            log.info("NVML: no event set (%s): XID errors are not read", exc)
            return
        registered = 0
        for device in self.devices_:
            if device.handle is None:
                continue
            try:
                supported = nv.nvmlDeviceGetSupportedEventTypes(device.handle)
                if supported & xid:
                    nv.nvmlDeviceRegisterEvents(device.handle, xid, events)
                    registered += 1
                    continue
            except nv.NVMLError as exc:
                log.info("NVML: GPU %d: XID events not available: %s", device.index, exc)
                continue
            log.info("NVML: GPU %d does not report XID events", device.index)
        if registered:
            self.events = events
        else:
            with contextlib.suppress(Exception):
                nv.nvmlEventSetFree(events)

    # ------------------------------------------------------------------ reading

    @property
    def available(self) -> bool:
        return self.module is not None and self.opened

    @property
    def count(self) -> int:
        return len(self.devices_)

    def devices(self) -> list[GpuInfo]:
        """The GPUs as the node announces them (lost ones left out)."""
        return [
            GpuInfo(index=d.index, uuid=d.uuid, model=short_model(d.name), memory_bytes=d.memory_total)
            for d in self.devices_
            if d.index not in self.lost
        ]

    def _figure(self, call, index: int):
        """`call()`, or None for a figure the GPU does not report; Lost when NVML says the GPU is lost."""
        nv = self.module
        try:
            return call()
        except nv.NVMLError_GpuIsLost as exc:
            raise Lost(index) from exc
        except nv.NVMLError:
            return None

    def read(self) -> list[GpuReading]:
        """Every GPU's figures now, and the XID errors reported since the previous read."""
        if not self.available:
            return []
        xids = self._drain_xids()
        readings = []
        for device in self.devices_:
            found = xids.get(device.index, [])
            if found:
                self.last_xid[device.index] = found[-1]
            try:
                if device.index in self.lost or device.handle is None:
                    raise Lost(device.index)
                readings.append(self._read(device, found))
            except Lost:
                if device.index not in self.lost:
                    log.error("NVML: GPU %d (%s) is lost (fallen off the bus)", device.index, device.uuid)
                self.lost.add(device.index)
                readings.append(
                    GpuReading(
                        index=device.index,
                        uuid=device.uuid,
                        model=short_model(device.name),
                        pci_bus_id=device.pci_bus_id,
                        memory_total_bytes=device.memory_total,
                        xids=found,
                        last_xid=self.last_xid.get(device.index),
                        lost=True,
                    )
                )
        return readings

    def _read(self, device: Device, xids: list[int]) -> GpuReading:
        nv, h, i = self.module, device.handle, device.index
        figure = self._figure
        rates = figure(lambda: nv.nvmlDeviceGetUtilizationRates(h), i)
        memory = figure(lambda: nv.nvmlDeviceGetMemoryInfo(h), i)
        temperature = figure(lambda: nv.nvmlDeviceGetTemperature(h, nv.NVML_TEMPERATURE_GPU), i)
        power_mw = figure(lambda: nv.nvmlDeviceGetPowerUsage(h), i)
        limit_mw = figure(lambda: nv.nvmlDeviceGetEnforcedPowerLimit(h), i)
        sm_clock = figure(lambda: nv.nvmlDeviceGetClockInfo(h, nv.NVML_CLOCK_SM), i)
        memory_clock = figure(lambda: nv.nvmlDeviceGetClockInfo(h, nv.NVML_CLOCK_MEM), i)
        corrected = figure(
            lambda: nv.nvmlDeviceGetTotalEccErrors(
                h, nv.NVML_MEMORY_ERROR_TYPE_CORRECTED, nv.NVML_VOLATILE_ECC
            ),
            i,
        )
        uncorrected = figure(
            lambda: nv.nvmlDeviceGetTotalEccErrors(
                h, nv.NVML_MEMORY_ERROR_TYPE_UNCORRECTED, nv.NVML_VOLATILE_ECC
            ),
            i,
        )
        processes = figure(lambda: nv.nvmlDeviceGetComputeRunningProcesses(h), i) or []
        return GpuReading(
            index=i,
            uuid=device.uuid,
            model=short_model(device.name),
            pci_bus_id=device.pci_bus_id,
            utilization_pct=float(rates.gpu) if rates is not None else None,
            memory_util_pct=float(rates.memory) if rates is not None else None,
            memory_used_bytes=int(memory.used) if memory is not None else None,
            memory_total_bytes=int(memory.total) if memory is not None else device.memory_total,
            temperature_c=float(temperature) if temperature is not None else None,
            power_w=power_mw / 1000 if power_mw is not None else None,
            power_limit_w=limit_mw / 1000 if limit_mw is not None else None,
            sm_clock_mhz=int(sm_clock) if sm_clock is not None else None,
            memory_clock_mhz=int(memory_clock) if memory_clock is not None else None,
            ecc_corrected=int(corrected) if corrected is not None else None,
            ecc_uncorrected=int(uncorrected) if uncorrected is not None else None,
            xids=xids,
            last_xid=self.last_xid.get(i),
            processes=[
                GpuProcessUse(pid=int(p.pid), used_bytes=_used(p)) for p in processes if p is not None
            ],
        )

    def _drain_xids(self) -> dict[int, list[int]]:
        """GPU index -> the XIDs reported since the last drain, oldest first; never blocks."""
        if self.events is None:
            return {}
        nv = self.module
        xid = getattr(nv, "nvmlEventTypeXidCriticalError", XID_EVENT)
        found: dict[int, list[int]] = {}
        for _ in range(EVENTS_PER_READ):
            try:
                data = nv.nvmlEventSetWait(self.events, 0)
            except nv.NVMLError_Timeout:
                break  # no (more) events
            except nv.NVMLError as exc:
                log.warning("NVML: reading XID events failed: %s", exc)
                break
            if not data.eventType & xid:
                continue
            index = self._index_of(data.device)
            if index is not None:
                found.setdefault(index, []).append(int(data.eventData))
        return found

    def _index_of(self, handle: Any) -> int | None:
        nv = self.module
        try:
            return int(nv.nvmlDeviceGetIndex(handle))
        except Exception:  # (a lost GPU, a fake without it): match the handle
            return next((d.index for d in self.devices_ if d.handle == handle), None)

    def processes(self) -> list[ProcessMemory]:
        """Every compute process's memory on every GPU (lost GPUs and GPUs that cannot tell left out)."""
        if not self.available:
            return []
        found = []
        for device in self.devices_:
            if device.index in self.lost or device.handle is None:
                continue
            try:
                procs = self._figure(
                    lambda h=device.handle: self.module.nvmlDeviceGetComputeRunningProcesses(h), device.index
                )
            except Lost:
                self.lost.add(device.index)
                continue
            found += [ProcessMemory(device.index, int(p.pid), _used(p)) for p in procs or []]
        return found

    def close(self) -> None:
        nv, self.module = self.module, None
        if nv is None or not self.opened:
            return
        if self.events is not None:
            with contextlib.suppress(Exception):
                nv.nvmlEventSetFree(self.events)
            self.events = None
        with contextlib.suppress(Exception):
            nv.nvmlShutdown()


def _used(process: Any) -> int | None:
    used = getattr(process, "usedGpuMemory", None)  # None: NVML cannot tell (e.g. no access to the process)
    return int(used) if used is not None else None
