"""The Cluster and Nodes pages in a real browser: node-a's 8 GPUs in the heat map, a busy job's cell
turning allocated and busy from the monitor's samples without a reload, a 0.5-GPU job's cell shared, the
tenants' queue figures (or the page's word that the server has none), 1,000 generated nodes drawn at once and
the page staying a few screens high; the Nodes page with node-a's inventory and heartbeat, an admin cordoning a
GPU and uncordoning it while a tenant's page follows live, without the admin's buttons."""

from __future__ import annotations

import re

import httpx
import pytest

pytest.importorskip("playwright")
from playwright.sync_api import expect  # noqa: E402

from tests.browser.conftest import SCREENSHOTS  # noqa: E402

NODE = "node-a"
STAYED = """() => { window.__stayed = true; }"""
BUSY = 'python -c "while True: pass"'


def submit(board, name: str, command: str, gpus: float) -> str:
    """A job that asks for little of the node's CPUs and memory (the test machine has few): only its GPUs count."""
    spec = {"name": name, "command": command, "resources": {"gpus": gpus, "cpus": 0.1, "memory": "100MB"}}
    return board.api("POST", "/v1/jobs", json=spec)["job_id"]


def cell_of(page, job_id: str):
    return page.locator(f".cell[data-node='{NODE}'][data-jobs~='{job_id}']")


BUSIER = """([busy, idle]) => {
  const util = (job) => document.querySelector(`.cell[data-jobs~="${job}"]`)?.dataset.util || null;
  const [b, i] = [util(busy), util(idle)];
  return b !== null && i !== null && Number(b) > Number(i);
}"""


def wait_busier(page, busy: str, idle: str) -> None:
    """Until the busy job's cell shows more utilization than the idle one's, from the live samples. (A simulated
    GPU's utilization is its job's share of a CPU core: how much depends on how loaded the machine is, but a
    busy loop always gets more than a sleeper.)"""
    page.wait_for_function(BUSIER, arg=[busy, idle], timeout=30_000)


def test_the_heat_map_follows_jobs_live(dashboard):
    board = dashboard("vision")
    page = board.page
    page.goto("/")
    expect(page.locator(f".cell[data-node='{NODE}']")).to_have_count(8)
    expect(page.locator("#tile-total")).to_contain_text("8")
    expect(page.locator("#models-table tr[data-model='SIM-GPU']")).to_be_visible()
    page.evaluate(STAYED)
    busy = submit(board, "busy-loop", BUSY, 1)
    idle = submit(board, "sleeper", "sleep 600", 1)
    try:
        # allocated, then busy, from the samples alone (no reload)
        expect(cell_of(page, busy)).to_have_attribute("data-state", "allocated", timeout=20_000)
        expect(cell_of(page, idle)).to_have_attribute("data-state", "allocated", timeout=20_000)
        wait_busier(page, busy, idle)
        assert page.evaluate("window.__stayed") is True
        util, classes = cell_of(page, busy).evaluate("cell => [Number(cell.dataset.util), cell.className]")
        shade = f"u{min(9, int(util // 10))}"  # its shade on the utilization scale, from its figure
        assert shade in classes.split(), (util, classes)

        # the hover card: node, GPU, the job by name, utilization, memory and temperature
        cell_of(page, busy).hover()
        tip = page.locator("#gpu-tip")
        expect(tip).to_be_visible()
        expect(tip).to_contain_text(f"{NODE} · GPU")
        expect(tip).to_contain_text("busy-loop")
        expect(tip).to_contain_text(re.compile(r"temperature\s*\d+(\.\d)? °C"))
        expect(tip).to_contain_text(re.compile(r"memory\s*16 GiB of 16 GiB"))
        board.screenshot("cluster")

        # another tenant sees the GPUs held, never whose
        other = dashboard("nlp").page
        other.goto("/")
        theirs = other.locator(f".cell[data-node='{NODE}'][data-jobs='other']")
        expect(theirs).to_have_count(2)
        theirs.first.hover()
        expect(other.locator("#gpu-tip")).to_contain_text("another tenant's job")
        assert busy not in other.content() and "busy-loop" not in other.content()

        # by allocation: a 0.5-GPU job's GPU is shared
        half = submit(board, "half-gpu", "sleep 600", 0.5)
        try:
            page.select_option("#colour-by", "allocation")
            expect(cell_of(page, half)).to_have_attribute("data-state", "shared", timeout=20_000)
            expect(cell_of(page, half)).to_have_class(re.compile(r"\ba-shared\b"))
            expect(cell_of(page, busy)).to_have_class(re.compile(r"\ba-allocated\b"))
            expect(page.locator("#legend")).to_contain_text("fractionally shared")
            assert "colour=allocation" in page.url
            board.screenshot("cluster-allocation")
        finally:
            board.api("POST", f"/v1/jobs/{half}/cancel")

        # a click on a held GPU opens its job
        cell_of(page, busy).click()
        page.wait_for_url(f"**/jobs/{busy}")
    finally:
        for job_id in (busy, idle):
            board.api("POST", f"/v1/jobs/{job_id}/cancel")


def test_the_tenants_queue_figures_or_the_word_that_there_are_none(dashboard):
    board = dashboard("vision")
    page = board.page
    page.goto("/")
    answer = httpx.get(f"{board.yard.server}/v1/tenants", headers={"Authorization": f"Bearer {board.token}"})
    if answer.status_code == 404:  # (the route lands with another change)
        expect(page.locator("#queues-unavailable")).to_contain_text("Queue figures unavailable")
        return
    tenants = answer.json()["items"]
    row = page.locator("#queues-table tr[data-tenant='vision']")
    expect(row).to_be_visible()
    mine = next(t for t in tenants if t["tenant"] == "vision")
    expect(row.locator("td").nth(1)).to_have_text(str(mine["queued"]))
    assert [t["tenant"] for t in tenants] == ["vision"]  # a tenant sees its own row only


def test_the_heat_map_filters_folds_and_groups(dashboard):
    page = dashboard("nlp").page
    page.goto("/")
    cells = page.locator(f".cell[data-node='{NODE}']")
    expect(cells).to_have_count(8)
    page.fill("#node-filter", "no-such-node")
    expect(page.locator("#heatmap .empty")).to_contain_text("No node's name contains")
    page.fill("#node-filter", "node-a")
    expect(cells).to_have_count(8)
    page.select_option("#group-by", "prefix")
    expect(page.locator("#heatmap details.group[data-group='node'] summary")).to_contain_text(
        "1 node · 8 GPUs"
    )
    page.locator("#heatmap details.group summary").click()  # folded: the group's GPUs hidden
    expect(cells.first).to_be_hidden()
    page.reload()  # the view's choices are in the address
    expect(page.locator("#group-by")).to_have_value("prefix")
    expect(page.locator("#node-filter")).to_have_value("node-a")


TENANTS = {  # GET /v1/tenants as TenantListOut gives it (the route lands with another change)
    "items": [
        {
            "tenant": "nlp",
            "guaranteed_gpus": 4,
            "used_gpus": 1.5,
            "borrowed_gpus": 0,
            "queued": 0,
            "placed": 0,
            "running": 2,
            "oldest_queued_seconds": None,
        },
        {
            "tenant": "vision",
            "guaranteed_gpus": 0,
            "used_gpus": 2,
            "borrowed_gpus": 2,
            "queued": 3,
            "placed": 1,
            "running": 1,
            "oldest_queued_seconds": 125.0,
        },
    ]
}


def test_the_queue_table_reads_the_tenants_route(dashboard):
    page = dashboard("admin").page
    SCREENSHOTS.mkdir(parents=True, exist_ok=True)
    page.route("**/v1/tenants", lambda route: route.fulfill(json=TENANTS))
    page.goto("/")
    vision = page.locator("#queues-table tr[data-tenant='vision'] td")
    expect(vision.nth(1)).to_have_text("3")
    expect(vision.nth(2)).to_have_text(re.compile(r"^2 min \d+ s$"))  # 125 s, and growing
    expect(vision.nth(7)).to_have_text("2")
    nlp = page.locator("#queues-table tr[data-tenant='nlp'] td")
    expect(nlp.nth(2)).to_have_text("—")
    expect(nlp.nth(6)).to_have_text("4")
    page.locator("#queues").screenshot(path=str(SCREENSHOTS / "cluster-queues.png"))


GENERATE = """(count) => {
  const models = ["H100", "A100", "L40S"];
  const nodes = [];
  for (let n = 0; n < count; n++) {
    const model = models[n % models.length];
    nodes.push({
      node: `gpu-${model.toLowerCase()}-${String(n).padStart(4, "0")}`, state: n % 97 ? "ready" : "cordoned",
      reason: "", last_seen_seconds_ago: 1, cpus: 64, memory_bytes: 2 ** 40, simulated: true, sampled_seconds_ago: 1,
      gpus: Array.from({length: 8}, (_, i) => ({
        index: i, uuid: `GPU-${n}-${i}`, model, memory_bytes: 80 * 2 ** 30, utilization_pct: (n * 7 + i * 13) % 101,
        memory_used_bytes: 2 ** 30 * i, healthy: (n + i) % 211 !== 0, unhealthy_reason: null, cordoned: false,
        holders: i % 3 ? [{job_id: `job-${n}-${i}`, tenant: "vision", user: "ana", fraction: i % 4 ? 1 : 0.5}] : [],
      })),
    });
  }
  window.gpuyardCluster.drawHeatmap(nodes);
  return {height: document.documentElement.scrollHeight, screen: innerHeight,
          cells: document.querySelectorAll("#heatmap-groups .cell").length,
          groups: document.querySelectorAll("#heatmap-groups details.group").length};
}"""


def test_a_thousand_nodes_draw_at_once_and_stay_a_few_screens_high(dashboard):
    page = dashboard("admin").page
    page.route("**/v1/events/stream*", lambda route: route.abort())  # nothing live redraws the generated map
    page.goto("/")
    expect(page.locator(f".cell[data-node='{NODE}']")).to_have_count(8)
    drawn = page.evaluate(GENERATE, 1000)
    assert drawn["cells"] == 8000 and drawn["groups"] == 3, drawn
    assert drawn["height"] < 3 * drawn["screen"], drawn
    page.locator("#heatmap-groups .cell[data-node='gpu-a100-0001']").first.hover()
    expect(page.locator("#gpu-tip")).to_contain_text("gpu-a100-0001 · GPU 0")
    SCREENSHOTS.mkdir(parents=True, exist_ok=True)
    page.locator("#heatmap").screenshot(path=str(SCREENSHOTS / "cluster-1000-nodes.png"))


def gpu_row(page, index: int):
    return page.locator(f"#gpus-{NODE} tr[data-gpu='{index}']")


def test_nodes_page_and_an_admin_cordons_a_gpu_while_a_tenant_watches(dashboard):
    tenant = dashboard("vision")
    watcher = tenant.page
    watcher.goto(f"/nodes?node={NODE}")
    expect(gpu_row(watcher, 7)).to_have_attribute("data-state", re.compile("free|allocated|shared"))
    expect(watcher.locator("#nodes-table button.cordon, #nodes-table button.drain")).to_have_count(0)
    watcher.evaluate(STAYED)

    sleeper = submit(tenant, "node-sleeper", "sleep 600", 1)
    try:
        expect(watcher.locator(f"tbody[data-node='{NODE}'] .running-jobs")).to_contain_text("node-sleeper")
        cordon_and_uncordon(dashboard, tenant)
    finally:
        tenant.api("POST", f"/v1/jobs/{sleeper}/cancel")
    expect(watcher.locator(f"tbody[data-node='{NODE}'] .running-jobs")).not_to_contain_text("node-sleeper")


def cordon_and_uncordon(dashboard, tenant):
    watcher = tenant.page
    admin = dashboard("admin")
    page = admin.page
    page.goto("/nodes")
    node = page.locator(f"#nodes-table tbody[data-node='{NODE}']")
    expect(node.locator(".node-state-ready")).to_have_text("ready")
    expect(node).to_contain_text("8 × SIM-GPU · 16 GiB")
    expect(node.locator(".running-jobs")).to_contain_text("node-sleeper running · vision")
    expect(node.locator(".heartbeat")).to_have_text(re.compile(r"^\d+ s ago$"))
    node.locator("button.toggle").click()
    expect(page.locator(f"#gpus-{NODE} tbody tr")).to_have_count(8)
    try:
        gpu_row(page, 7).locator("button.cordon").click()
        expect(page.locator("dialog#node-action")).to_contain_text(f"Cordon {NODE} GPU 7?")
        page.fill("#action-reason", "browser test")
        page.click("#action-confirm")
        expect(gpu_row(page, 7)).to_have_attribute("data-state", "cordoned")
        expect(node).to_contain_text("GPU 7 cordoned")
        expect(gpu_row(watcher, 7)).to_have_attribute("data-state", "cordoned")  # live, on the tenant's page
        admin.screenshot("nodes")

        gpu_row(page, 7).locator("button.uncordon").click()
        page.click("#action-confirm")
        expect(gpu_row(page, 7)).not_to_have_attribute("data-state", "cordoned")
        expect(gpu_row(watcher, 7)).not_to_have_attribute("data-state", "cordoned")
        assert watcher.evaluate("window.__stayed") is True

        # a drain asks first; cancelled, nothing happens
        node.locator("button.drain").first.click()
        expect(page.locator("dialog#node-action")).to_contain_text("stopped")
        page.locator("dialog#node-action button[value='cancel']").click()
        expect(page.locator("dialog#node-action")).to_have_count(0)
        expect(node.locator(".node-state-ready")).to_have_text("ready")
    finally:
        admin.api("POST", f"/v1/nodes/{NODE}/uncordon", json={"gpu": 7, "reason": "browser test cleanup"})
    tenant.screenshot("nodes-tenant")


def test_a_nodes_engine_notes_show_under_its_inventory(dashboard):
    """What a node's engine says of it (`NodeOut.notes`, from its heartbeat: GPUs Slurm jobs outside GPUYARD
    hold) under its inventory; the listing's answer is given a note here, as a Slurm node's carries one."""
    page = dashboard("admin").page
    note = "2 GPU(s) held by Slurm jobs outside GPUYARD: 4711 (2)"

    def with_note(route):
        answer = route.fetch()
        nodes = answer.json()
        for node in nodes:
            node["notes"] = [note] if node["node"] == NODE else []
        route.fulfill(response=answer, json=nodes)

    page.route(re.compile(r".*/v1/nodes(\?.*)?$"), with_note)
    page.goto("/nodes")
    row = page.locator(f"#nodes-table tbody[data-node='{NODE}']")
    expect(row.locator(".node-note")).to_have_text(note)
