"""/metrics, scraped over HTTP and parsed with prometheus_client's own parser: the DCGM exporter's names, help
texts and labels for every GPU of every node, the holder's job, tenant and user, the platform figures, and no
series for what a GPU does not report."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from gpuyard.services.monitor.ingest import SampleIngest
from gpuyard.services.monitor.metrics import MetricsServer, make_registry
from gpuyard.services.monitor.platform import PlatformFigures, PlatformSnapshot, TenantQueue, TenantQuota
from gpuyard.shared.contracts.events.envelope import make_event
from gpuyard.shared.contracts.events.nodes import GpuHolder, GpuSample
from gpuyard.shared.gpus.nvml import Nvml
from tests.unit.services.monitor.test_nvml import NOT_SUPPORTED, FakeGpu, FakeNvml

GIB = 1 << 30
MIB = 1 << 20
DCGM = {
    "DCGM_FI_DEV_GPU_UTIL": ("gauge", "GPU utilization (in %)."),
    "DCGM_FI_DEV_MEM_COPY_UTIL": ("gauge", "Memory utilization (in %)."),
    "DCGM_FI_DEV_FB_USED": ("gauge", "Framebuffer memory used (in MiB)."),
    "DCGM_FI_DEV_FB_FREE": ("gauge", "Framebuffer memory free (in MiB)."),
    "DCGM_FI_DEV_GPU_TEMP": ("gauge", "GPU temperature (in C)."),
    "DCGM_FI_DEV_POWER_USAGE": ("gauge", "Power draw (in W)."),
    "DCGM_FI_DEV_SM_CLOCK": ("gauge", "SM clock frequency (in MHz)."),
    "DCGM_FI_DEV_MEM_CLOCK": ("gauge", "Memory clock frequency (in MHz)."),
    "DCGM_FI_DEV_XID_ERRORS": ("gauge", "Value of the last XID error encountered."),
}


def node_sample(node: str, fake: FakeNvml, holders: dict[int, list[GpuHolder]], when: datetime):
    readings = Nvml(fake).open().read()
    gpus = [r.model_copy(update={"holders": holders.get(r.index, [])}) for r in readings]
    return make_event(GpuSample(node=node, gpus=gpus), source="/test", time=when)


@pytest.fixture
def served():
    servers = []

    def serve(ingest, figures=None, node=None) -> str:
        server = MetricsServer(make_registry(ingest, figures, node=node), "127.0.0.1", 0).start()
        servers.append(server)
        return f"http://127.0.0.1:{server.port}"

    yield serve
    for server in servers:
        server.stop()


def scrape(url: str) -> dict:
    answer = httpx.get(f"{url}/metrics", timeout=10)
    assert answer.status_code == 200
    assert answer.headers["content-type"].startswith("text/plain")
    return {f.name: f for f in text_string_to_metric_families(answer.text)}


def samples(family, **labels) -> list:
    return [s for s in family.samples if all(s.labels.get(k) == v for k, v in labels.items())]


def test_every_nodes_gpus_under_the_dcgm_names_and_labels(served):
    now = datetime.now(UTC)
    fake_a = FakeNvml([FakeGpu(uuid="GPU-a0", ecc=(2, 1)), FakeGpu(uuid="GPU-a1", used=GIB, util=0)])
    fake_a.xid(1, 79)
    share = GpuHolder(job_id="j-share", tenant="nlp", user="bo", fraction=0.5, memory_bytes=8 * GIB)
    other = GpuHolder(job_id="j-other", tenant="vision", user="cy", fraction=0.5)
    ingest = SampleIngest()
    ingest.ingest(
        node_sample("node-a", fake_a, {0: [GpuHolder(job_id="j-whole", tenant="vision", user="ana")]}, now)
    )
    ingest.ingest(node_sample("node-b", FakeNvml([FakeGpu(uuid="GPU-b0")]), {0: [share, other]}, now))
    families = scrape(served(ingest))

    for name, (kind, help_text) in DCGM.items():
        assert families[name].type == kind and families[name].documentation == help_text, name
        assert len(families[name].samples) == 3, name  # every GPU of every node
    [util] = samples(families["DCGM_FI_DEV_GPU_UTIL"], UUID="GPU-a0")
    assert util.labels == {
        "gpu": "0",
        "UUID": "GPU-a0",
        "pci_bus_id": "00000000:1B:00.0",
        "device": "nvidia0",
        "modelName": "H100",
        "hostname": "node-a",
        "job": "j-whole",
        "tenant": "vision",
        "user": "ana",
    }
    assert util.value == 50
    [idle] = samples(families["DCGM_FI_DEV_GPU_UTIL"], UUID="GPU-a1")
    assert idle.value == 0 and (idle.labels["job"], idle.labels["tenant"]) == ("", "")  # nobody holds it
    assert samples(families["DCGM_FI_DEV_FB_USED"], UUID="GPU-a1")[0].value == GIB / MIB
    assert samples(families["DCGM_FI_DEV_FB_FREE"], UUID="GPU-a1")[0].value == 79 * GIB / MIB
    assert samples(families["DCGM_FI_DEV_POWER_USAGE"], UUID="GPU-a0")[0].value == 250
    assert samples(families["DCGM_FI_DEV_XID_ERRORS"], UUID="GPU-a1")[0].value == 79
    assert samples(families["DCGM_FI_DEV_XID_ERRORS"], UUID="GPU-a0")[0].value == 0

    # a shared GPU: its series once, its holders joined; one holder_info series each
    [shared] = samples(families["DCGM_FI_DEV_GPU_UTIL"], hostname="node-b")
    assert (shared.labels["job"], shared.labels["tenant"]) == ("j-other,j-share", "nlp,vision")
    info = samples(families["gpuyard_gpu_holder_info"], hostname="node-b")
    assert sorted((s.labels["job"], s.labels["fraction"]) for s in info) == [
        ("j-other", "0.5"),
        ("j-share", "0.5"),
    ]

    # ECC: the exporter's own names (typed gauge: a counter's name would get _total added)
    sbe = families["DCGM_FI_DEV_ECC_SBE_VOL_TOTAL"]
    assert sbe.documentation == "Total number of single-bit volatile ECC errors."
    assert samples(sbe, UUID="GPU-a0")[0].value == 2
    assert samples(families["DCGM_FI_DEV_ECC_DBE_VOL_TOTAL"], UUID="GPU-a0")[0].value == 1
    assert {s.labels["hostname"] for s in families["gpuyard_node_gpus"].samples} == {"node-a", "node-b"}


def test_what_a_gpu_does_not_report_has_no_series_and_a_lost_gpu_says_so(served):
    fake = FakeNvml(
        [FakeGpu(uuid="GPU-0", temperature=NOT_SUPPORTED, ecc=NOT_SUPPORTED), FakeGpu(uuid="GPU-1")]
    )
    nvml = Nvml(fake).open()
    fake.gpus[1].lost = True
    ingest = SampleIngest()
    ingest.ingest(make_event(GpuSample(node="n", gpus=nvml.read()), source="/test"))
    families = scrape(served(ingest))
    assert [s.labels["UUID"] for s in families["DCGM_FI_DEV_GPU_TEMP"].samples] == []
    assert "DCGM_FI_DEV_ECC_SBE_VOL_TOTAL" not in families or not samples(
        families["DCGM_FI_DEV_ECC_SBE_VOL_TOTAL"], UUID="GPU-0"
    )
    assert [s.labels["UUID"] for s in families["DCGM_FI_DEV_GPU_UTIL"].samples] == ["GPU-0"]
    lost = {s.labels["UUID"]: s.value for s in families["gpuyard_gpu_lost"].samples}
    assert lost == {"GPU-0": 0, "GPU-1": 1}


def test_a_node_scoped_monitor_shows_its_own_node_only_and_a_silent_node_goes(served):
    clock = [datetime.now(UTC).timestamp()]
    ingest = SampleIngest(clock=lambda: clock[0])
    now = datetime.fromtimestamp(clock[0], UTC)
    for node in ("node-a", "node-b"):
        ingest.ingest(node_sample(node, FakeNvml([FakeGpu(uuid=f"{node}-0")]), {}, now))
    mine = scrape(served(ingest, node="node-a"))
    assert {s.labels["hostname"] for s in mine["DCGM_FI_DEV_GPU_UTIL"].samples} == {"node-a"}
    everyone = served(ingest)
    assert {s.labels["hostname"] for s in scrape(everyone)["DCGM_FI_DEV_GPU_UTIL"].samples} == {
        "node-a",
        "node-b",
    }
    clock[0] += 60
    ingest.ingest(
        node_sample("node-b", FakeNvml([FakeGpu(uuid="node-b-0")]), {}, now + timedelta(seconds=60))
    )
    assert {s.labels["hostname"] for s in scrape(everyone)["DCGM_FI_DEV_GPU_UTIL"].samples} == {"node-b"}


def test_platform_figures(served):
    figures = PlatformFigures({"vision": 4})
    figures.snapshot = PlatformSnapshot(
        jobs={("queued", "vision"): 3, ("running", "nlp"): 2},
        queues={"vision": TenantQueue(3, 125.0)},
        quotas={"vision": TenantQuota(4, 0, 0), "nlp": TenantQuota(0, 1.5, 1.5)},
        ended={("failed", "nlp"): 1},
        taken_at=datetime.now(UTC),
    )
    figures.start_wait.observe(0.4)
    figures.start_wait.observe(12)
    families = scrape(served(SampleIngest(), figures))
    jobs = {(s.labels["state"], s.labels["tenant"]): s.value for s in families["gpuyard_jobs"].samples}
    assert jobs == {("queued", "vision"): 3, ("running", "nlp"): 2}
    assert samples(families["gpuyard_queue_length"], tenant="vision")[0].value == 3
    assert samples(families["gpuyard_queue_oldest_wait_seconds"], tenant="vision")[0].value == 125
    assert samples(families["gpuyard_quota_guaranteed_gpus"], tenant="vision")[0].value == 4
    assert samples(families["gpuyard_quota_used_gpus"], tenant="nlp")[0].value == 1.5
    assert samples(families["gpuyard_quota_borrowed_gpus"], tenant="nlp")[0].value == 1.5
    assert samples(families["gpuyard_jobs_ended"], state="failed")[0].value == 1
    wait = families["gpuyard_job_start_wait_seconds"]
    assert wait.type == "histogram"
    by_name = {(s.name, s.labels.get("le")): s.value for s in wait.samples}
    assert by_name[("gpuyard_job_start_wait_seconds_bucket", "0.5")] == 1
    assert by_name[("gpuyard_job_start_wait_seconds_bucket", "+Inf")] == 2
    assert by_name[("gpuyard_job_start_wait_seconds_count", None)] == 2


def test_only_metrics_is_served(served):
    url = served(SampleIngest())
    assert httpx.get(f"{url}/", timeout=10).status_code == 404
    families = scrape(url)
    assert families["gpuyard_monitor_samples_ingested"].type == "counter"
