// Models: the published models and their versions, the deployments with their replicas (status, GPU share,
// request rate), deploy, roll back and undeploy, and a form that sends one inference request to the serving
// entry point (another port: the browser calls it directly, with the session cookie and the CSRF token).
import {
  ago, api, bytes, empty, errorBox, fill, h, jobLink, keepFresh, kind, me, num, onEvent, params, section,
  setQuery, stateBadge, tableBox, waitingText,
} from "../app.js";
import { STATE, SUBJECT } from "../contracts.js";

const csrf = document.querySelector('meta[name="csrf-token"]')?.content ?? "";
const query = new URLSearchParams(location.search);
const RATE_EVERY_MS = 5000;
const SERVING_KEY = "gpuyard.serving"; // the serving address learned from model.ready, kept per browser
const PRIORITIES = ["high", "normal", "low"];

let models = []; // GET /v1/models items
let selected = query.get("model") ? { name: query.get("model"), tenant: query.get("tenant") ?? "" } : null;
let detail = null; // GET /v1/models/{name} of the selected model
let replicas = new Map(); // "tenant/name" -> ReplicaOut[]
let failures = []; // recent failed serve jobs (and model.failed seen while the page is open)
let rates = new Map(); // "tenant/name/version" -> {perSecond, total}
let rateNote = "";
let rollback = null; // {key, version}: undeploy the newer versions once this one is ready
let message = null; // the last action's outcome

const listEl = section("models", "Published models");
const detailEl = section("model", "Versions and deployments");
const inferEl = section("infer", "Try it: one inference request");

const keyOf = (m) => `${m.tenant}/${m.name}`;
const ownerQuery = (m) => (m.tenant && m.tenant !== me.tenant ? `?tenant=${encodeURIComponent(m.tenant)}` : "");
const modelPath = (m) => `/v1/models/${encodeURIComponent(m.name)}`;

// ---------------------------------------------------------------- loading

async function load() {
  try {
    models = (await api("/v1/models")).items;
  } catch (err) {
    fill(listEl, errorBox(err));
    return;
  }
  if (selected && !models.some((m) => m.name === selected.name && (!selected.tenant || m.tenant === selected.tenant))) {
    selected = null;
  }
  selected ??= models[0] ?? null;
  if (selected && !selected.tenant) selected = models.find((m) => m.name === selected.name) ?? null;
  const [lists, failed, view] = await Promise.all([
    Promise.all(models.map((m) => api(`${modelPath(m)}/deployments${ownerQuery(m)}`).catch(() => null))),
    api(`/v1/jobs?${new URLSearchParams({ state: STATE.FAILED, limit: "100" })}`).catch(() => null),
    selected ? api(`${modelPath(selected)}${ownerQuery(selected)}`).catch((err) => err) : null,
  ]);
  replicas = new Map(models.map((m, i) => [keyOf(m), lists[i]?.replicas ?? []]));
  if (failed) {
    const seen = failures.filter((f) => f.live);
    failures = [...seen, ...failed.items.filter((j) => j.spec?.serve).map(failureOf)];
  }
  detail = view;
  await rollBackOnceReady();
  drawList();
  drawDetail();
  drawInfer();
}

function failureOf(job) {
  const serve = job.spec.serve;
  return {
    key: `${serve.tenant ?? job.tenant}/${serve.model}`,
    version: serve.version,
    job,
    reason: job.failure?.message || job.message || STATE.FAILED,
    at: job.finished_at,
  };
}

// ---------------------------------------------------------------- the list

/** A live replica's state in a model's words (a running serve job is ready); an ended one's as it is. */
const REPLICA_WORDS = { [STATE.RUNNING]: "ready", [STATE.PLACED]: "loading", [STATE.QUEUED]: "waiting" };

function status(r) {
  return h("span", { class: `state state-${r.state}` }, REPLICA_WORDS[r.state] ?? r.state);
}

function deployedText(m) {
  const live = replicas.get(keyOf(m)) ?? [];
  if (!live.length) return h("span", { class: "muted" }, "not deployed");
  const byVersion = new Map();
  for (const r of live) byVersion.set(r.version, [...(byVersion.get(r.version) ?? []), r]);
  return h("span", { class: "deployed" }, [...byVersion].sort((a, b) => b[0] - a[0]).map(([v, rs]) => {
    const ready = rs.filter((r) => r.state === STATE.RUNNING).length;
    return h("span", { class: "pill", title: rs.map((r) => `${r.job_id.slice(0, 12)} ${r.state}`).join("\n") },
      `v${v} · ${ready}/${rs.length} ready`);
  }));
}

function rateOf(key, version) {
  const found = [...rates].filter(([k]) => k === `${key}/${version}` || (version == null && k.startsWith(`${key}/`)));
  if (!found.length) return null;
  return found.reduce((sum, [, r]) => sum + (r.perSecond ?? 0), 0);
}

function rateCell(key, version) {
  const rate = rateOf(key, version);
  if (rate == null) return h("span", { class: "muted", title: rateNote || "no request counted yet" }, "—");
  return h("span", { title: "requests per second over the last few seconds (the serving entry point's /metrics)" }, `${num(rate, 1)}/s`);
}

function drawList() {
  if (!models.length) {
    fill(listEl, empty("No model published yet.",
      "Publish an ONNX file with `gpuyard models publish model.onnx --name NAME`, or from a job with `gpuyard.publish_model`."));
    return;
  }
  const rows = models.map((m) => {
    const isSelected = selected && keyOf(selected) === keyOf(m);
    return h("tr", { "data-model": m.name, "data-tenant": m.tenant, class: isSelected ? "selected" : null },
      h("td", {}, h("a", { href: `?model=${encodeURIComponent(m.name)}&tenant=${encodeURIComponent(m.tenant)}`, onclick: (e) => (e.preventDefault(), select(m)) }, m.name)),
      h("td", {}, m.tenant, m.tenant !== me.tenant ? h("span", { class: "muted" }, " (another tenant's)") : null),
      h("td", {}, m.public ? h("span", { class: "pill public" }, "public") : h("span", { class: "muted" }, "private")),
      h("td", { class: "num" }, m.latest == null ? "—" : `v${m.latest}`),
      h("td", { class: "num" }, num(m.versions)),
      h("td", {}, deployedText(m)),
      h("td", { class: "num" }, rateCell(keyOf(m), null)),
      h("td", {}, ago(m.updated_at)),
    );
  });
  fill(listEl,
    tableBox(h("table", { id: "models-table" },
      h("thead", {}, h("tr", {}, ["Model", "Tenant", "Visibility", "Latest", "Versions", "Deployed", "Requests", "Updated"]
        .map((t) => h("th", { scope: "col", class: ["Latest", "Versions", "Requests"].includes(t) ? "num" : null }, t)))),
      h("tbody", {}, rows))),
    h("p", { class: "hint" }, "Click a model for its versions, its deployment and the inference form."),
    rateNote ? h("p", { class: "hint", id: "rate-note" }, rateNote) : null);
}

function select(m) {
  selected = { name: m.name, tenant: m.tenant };
  setQuery({ model: m.name, tenant: m.tenant });
  message = null;
  refresh();
}

// ---------------------------------------------------------------- one model

function signature(tensors) {
  return tensors.map((t) => `${t.name} ${t.datatype}[${t.shape.join(",")}]`).join(", ");
}

function deployForm(m) {
  const form = h("form", { class: "filters", id: "deploy-form", onsubmit: (e) => (e.preventDefault(), deploy(m, null)) },
    h("div", {}, h("label", { for: "d-version" }, "Version"),
      h("select", { id: "d-version", name: "version" },
        [...m.versions].reverse().map((v) => h("option", { value: v.version }, `v${v.version}${v.version === m.latest ? " (newest)" : ""}`)))),
    h("div", {}, h("label", { for: "d-gpus" }, "GPU share per replica"),
      h("input", { id: "d-gpus", name: "gpus", type: "number", min: "0", max: "64", step: "0.05", value: "0.25", size: 6 })),
    h("div", {}, h("label", { for: "d-replicas" }, "Replicas"),
      h("input", { id: "d-replicas", name: "replicas", type: "number", min: "1", max: "64", step: "1", value: "1", size: 4 })),
    h("div", {}, h("label", { for: "d-cpus" }, "CPUs"),
      h("input", { id: "d-cpus", name: "cpus", type: "number", min: "0.05", step: "0.05", placeholder: "1", size: 4 })),
    h("div", {}, h("label", { for: "d-memory" }, "Memory"),
      h("input", { id: "d-memory", name: "memory", placeholder: "2GB", size: 6 })),
    h("div", {}, h("label", { for: "d-priority" }, "Priority"),
      h("select", { id: "d-priority", name: "priority" }, PRIORITIES.map((p) => h("option", { value: p, selected: p === "normal" }, p)))),
    h("button", { type: "submit", class: "primary", id: "deploy" }, "Deploy"),
  );
  return form;
}

let kept = { key: null, form: null }; // the deploy form stays as typed across redraws

function keptDeployForm(m) {
  const key = `${keyOf(m)}:${m.versions.map((v) => v.version).join(",")}`;
  if (kept.key !== key) kept = { key, form: deployForm(m) };
  return kept.form;
}

function drawDetail() {
  if (!selected) {
    fill(detailEl, empty("No model to show.", "Once a model is published, its versions and deployments show here."));
    return;
  }
  if (detail instanceof Error) {
    fill(detailEl, errorBox(detail));
    return;
  }
  if (!detail) return;
  const m = detail;
  const key = keyOf(m);
  const live = replicas.get(key) ?? [];
  const deployedVersions = [...new Set(live.map((r) => r.version))];
  const newestDeployed = Math.max(0, ...deployedVersions);
  const versionRows = [...m.versions].reverse().map((v) => {
    const mine = live.filter((r) => r.version === v.version);
    const older = newestDeployed && v.version < newestDeployed && !mine.length;
    const button = older
      ? h("button", { class: "rollback", "data-version": v.version, onclick: () => startRollback(m, v.version, newestDeployed) }, `Roll back to v${v.version}`)
      : h("button", { class: "deploy-version", "data-version": v.version, onclick: () => deploy(m, v.version) }, mine.length ? "Add a replica" : `Deploy v${v.version}`);
    return h("tr", { "data-version": v.version },
      h("td", { class: "num" }, `v${v.version}`),
      h("td", {}, ago(v.published_at), h("div", { class: "muted" }, v.job_id ? `by job ${v.job_id.slice(0, 12)}` : v.user ? `by ${v.user}` : "")),
      h("td", { class: "num" }, bytes(v.size_bytes)),
      h("td", { class: "mono sig" }, signature(v.inputs), h("div", { class: "muted" }, "→ ", signature(v.outputs))),
      h("td", {}, mine.length ? `${mine.filter((r) => r.state === STATE.RUNNING).length}/${mine.length} ready` : h("span", { class: "muted" }, "—")),
      h("td", { class: "num" }, rateCell(key, v.version)),
      h("td", {}, button),
    );
  });
  const replicaRows = live.map((r) => h("tr", { "data-job": r.job_id, "data-state": r.state },
    h("td", {}, jobLink({ job_id: r.job_id, name: r.job_id.slice(0, 12) })),
    h("td", { class: "num" }, `v${r.version}`),
    h("td", { class: "replica-status" }, status(r)),
    h("td", {}, r.node ? `${r.node}${r.gpu_index != null ? ` · GPU ${r.gpu_index}` : ""}` : h("span", { class: "muted" }, "—")),
    h("td", { class: "num" }, num(r.gpus)),
    h("td", { class: "muted" }, r.state === STATE.QUEUED ? waitingText(r.pending) || "waiting for the scheduler" : r.message || ""),
    h("td", {}, h("button", { class: "danger undeploy-version", onclick: () => undeploy(m, r.version) }, `Undeploy v${r.version}`)),
  ));
  const failed = failures.filter((f) => f.key === key).slice(0, 5);
  fill(detailEl,
    h("div", { class: "model-head" },
      h("h3", { id: "model-name" }, m.name, h("span", { class: "muted" }, ` · tenant ${m.tenant} · ${m.public ? "public" : "private"}`)),
      live.length ? h("button", { class: "danger", id: "undeploy", onclick: () => undeploy(m, null) }, "Undeploy all") : null,
    ),
    h("div", { id: "model-message" }, message),
    rollback && rollback.key === key ? h("p", { class: "hint", id: "rollback-note" },
      `Rolling back to v${rollback.version}: the newer versions are undeployed once it is ready.`) : null,
    keptDeployForm(m),
    tableBox(h("table", { id: "versions-table" },
      h("thead", {}, h("tr", {}, ["Version", "Published", "Size", "Inputs → outputs", "Replicas", "Requests", ""]
        .map((t) => h("th", { scope: "col", class: ["Version", "Size", "Requests"].includes(t) ? "num" : null }, t)))),
      h("tbody", {}, versionRows))),
    h("h3", {}, "Replicas"),
    live.length
      ? tableBox(h("table", { id: "replicas-table" },
        h("thead", {}, h("tr", {}, ["Serve job", "Version", "Status", "Where", "GPU share", "Why", ""]
          .map((t) => h("th", { scope: "col", class: ["Version", "GPU share"].includes(t) ? "num" : null }, t)))),
        h("tbody", {}, replicaRows)))
      : empty("Not deployed.", "Deploy a version above: each replica is a serve job the scheduler places like any job."),
    failed.length ? h("div", { id: "failures" }, h("h3", {}, "Recent failures"),
      h("ul", { class: "failures" }, failed.map((f) => h("li", {},
        stateBadge(STATE.FAILED), ` v${f.version} `,
        f.job ? jobLink({ job_id: f.job.job_id, name: f.job.job_id.slice(0, 12) }) : null, " ",
        h("span", { class: "error-text" }, f.reason), " ", ago(f.at))))) : null,
  );
}

function deployBody(version) {
  const f = document.getElementById("deploy-form")?.elements;
  const body = { replicas: Number(f?.replicas.value || 1), gpus: Number(f?.gpus.value || 0.25), priority: f?.priority.value || "normal" };
  if (f?.cpus.value) body.cpus = Number(f.cpus.value);
  if (f?.memory.value.trim()) body.memory = f.memory.value.trim();
  body.version = Number(version ?? f?.version.value);
  return body;
}

async function act(what, run) {
  message = h("p", { class: "muted" }, `${what}…`);
  drawDetail();
  try {
    const text = await run();
    message = h("p", { class: "ok", role: "status" }, text);
  } catch (err) {
    message = errorBox(err);
  }
  await load();
}

function deploy(m, version) {
  const body = deployBody(version);
  return act(`Deploying v${body.version}`, async () => {
    const done = await api(`${modelPath(m)}/deployments${ownerQuery(m)}`, { method: "POST", body });
    return `Deploying ${m.name} v${done.version}: ${done.jobs.length} serve job${done.jobs.length === 1 ? "" : "s"} queued.`;
  });
}

function startRollback(m, version, from) {
  if (!confirm(`Roll ${m.name} back to v${version}? v${version} is deployed now, and the newer versions (v${from}) are undeployed once it is ready.`)) return;
  rollback = { key: keyOf(m), version, model: { name: m.name, tenant: m.tenant } };
  return deploy(m, version);
}

async function rollBackOnceReady() {
  if (!rollback) return;
  const live = replicas.get(rollback.key) ?? [];
  if (!live.some((r) => r.version === rollback.version && r.state === STATE.RUNNING)) return;
  const newer = [...new Set(live.filter((r) => r.version > rollback.version).map((r) => r.version))];
  const { model, version } = rollback;
  rollback = null;
  try {
    for (const v of newer) await api(`${modelPath(model)}/deployments${withVersion(model, v)}`, { method: "DELETE" });
    message = h("p", { class: "ok", role: "status" }, `Rolled back to v${version}${newer.length ? `: v${newer.join(", v")} undeployed` : ""}.`);
  } catch (err) {
    message = errorBox(err);
  }
  const lists = await api(`${modelPath(model)}/deployments${ownerQuery(model)}`).catch(() => null);
  if (lists) replicas.set(keyOf(model), lists.replicas);
}

function withVersion(m, version) {
  const q = new URLSearchParams();
  if (m.tenant && m.tenant !== me.tenant) q.set("tenant", m.tenant);
  if (version != null) q.set("version", version);
  const text = q.toString();
  return text ? `?${text}` : "";
}

function undeploy(m, version) {
  const what = version == null ? `every replica of ${m.name}` : `${m.name} v${version}`;
  if (!confirm(`Undeploy ${what}? Requests to it are refused once its replicas have stopped.`)) return;
  return act(`Undeploying ${what}`, async () => {
    const done = await api(`${modelPath(m)}/deployments${withVersion(m, version)}`, { method: "DELETE" });
    return `Undeploying ${what}: ${done.cancelled.length} serve job${done.cancelled.length === 1 ? "" : "s"} stopping.`;
  });
}

// ---------------------------------------------------------------- the serving entry point

function isLoopback(host) {
  return host === "127.0.0.1" || host === "localhost" || host === "[::1]";
}

/** The serving entry point as this browser reaches it: a model.ready's endpoint on the page's own host name
 *  (cookies are per host: 127.0.0.1 and localhost are two), else the default port on this host. */
function defaultServing() {
  const known = params.servingUrl || localStorage.getItem(SERVING_KEY);
  if (known) return known;
  return `${location.protocol}//${location.hostname}:8000`;
}

function learnServing(endpoint) {
  try {
    const url = new URL(endpoint);
    if (isLoopback(url.hostname) && isLoopback(location.hostname)) url.hostname = location.hostname;
    const base = url.origin;
    if (localStorage.getItem(SERVING_KEY) === base) return;
    localStorage.setItem(SERVING_KEY, base);
    const input = document.getElementById("i-serving");
    if (input && (!input.dataset.edited || !input.value)) input.value = base;
  } catch {
    /* not a URL: keep what there is */
  }
}

let blockedByPolicy = ""; // the serving address this page's Content-Security-Policy kept it from

document.addEventListener("securitypolicyviolation", (e) => {
  if (e.violatedDirective.startsWith("connect-src") || e.effectiveDirective === "connect-src") blockedByPolicy = e.blockedURI;
});

function unreachable(base) {
  if (blockedByPolicy) {
    return `This dashboard's Content-Security-Policy (connect-src) does not let its pages call ${base}: the ` +
      "submit service must name the serving entry point there.";
  }
  return `The serving entry point at ${base} did not answer: is it running there, and is this page's origin ` +
    `(${location.origin}) among its dashboard_origins (GPUYARD_DASHBOARD_ORIGINS)?`;
}

const tick = () => new Promise((resolve) => setTimeout(resolve, 0));

function servingBase() {
  return (document.getElementById("i-serving")?.value || defaultServing()).replace(/\/+$/, "");
}

const METRIC = /^gpuyard_inference_requests_total\{([^}]*)\}\s+([0-9.eE+-]+)/;
let lastCounts = null; // {at, counts: Map(key -> total)}

async function loadRates() {
  let text;
  try {
    const res = await fetch(`${servingBase()}/metrics`, { credentials: "include" });
    if (!res.ok) throw new Error(`HTTP ${res.status}`);
    text = await res.text();
  } catch {
    await tick();
    rateNote = `request rates come from the serving entry point's /metrics: ${unreachable(servingBase())}`;
    rates = new Map();
    lastCounts = null;
    drawRates();
    return;
  }
  const counts = new Map();
  for (const line of text.split("\n")) {
    const m = METRIC.exec(line);
    if (!m) continue;
    const labels = Object.fromEntries([...m[1].matchAll(/(\w+)="((?:[^"\\]|\\.)*)"/g)].map((x) => [x[1], x[2]]));
    const key = `${labels.tenant}/${labels.model}/${labels.version}`;
    counts.set(key, (counts.get(key) ?? 0) + Number(m[2]));
  }
  const now = performance.now();
  const visible = new Set(models.map(keyOf));
  rates = new Map();
  for (const [key, total] of counts) {
    if (!visible.has(key.split("/").slice(0, 2).join("/"))) continue; // only models the API showed
    const before = lastCounts ? lastCounts.counts.get(key) ?? 0 : null; // (a new series started at 0)
    const perSecond = before == null ? null : Math.max(0, total - before) / ((now - lastCounts.at) / 1000);
    rates.set(key, { perSecond, total });
  }
  lastCounts = { at: now, counts };
  rateNote = "";
  drawRates();
}

function drawRates() {
  drawList();
  drawDetail();
}

// ---------------------------------------------------------------- the inference form

const SAMPLE = { BOOL: () => false, BYTES: () => "" };

/** A request from a version's input signature: each input's shape with -1 as 1, sample data of its datatype. */
function sampleRequest(version) {
  const inputs = (version?.inputs ?? []).map((t) => {
    const shape = t.shape.map((d) => (d < 0 ? 1 : d));
    const count = shape.reduce((a, b) => a * b, 1);
    const value = SAMPLE[t.datatype] ?? ((i) => (t.datatype.startsWith("FP") ? (i % 10) / 10 + 0.5 : i % 10));
    return { name: t.name, datatype: t.datatype, shape, data: Array.from({ length: count }, (_, i) => value(i)) };
  });
  return JSON.stringify({ inputs }, null, 2);
}

let inferFor = null; // the model and version the editor was filled for
let lastAnswer = null;

function drawInfer() {
  if (!models.length) {
    fill(inferEl, empty("Nothing to call yet.", "Publish and deploy a model: this form then sends it one request."));
    return;
  }
  const existing = document.getElementById("infer-form");
  const m = selected && detail && !(detail instanceof Error) ? detail : null;
  if (existing && inferFor === (m ? `${keyOf(m)}` : "")) {
    updateReadiness(m);
    return;
  }
  inferFor = m ? keyOf(m) : "";
  const versions = m ? [...m.versions].reverse() : [];
  const form = h("form", { id: "infer-form", onsubmit: (e) => (e.preventDefault(), sendInference(m)) },
    h("div", { class: "filters" },
      h("div", {}, h("label", {}, "Model"), h("div", { class: "mono picked" }, m ? `${m.name} (${m.tenant})` : "pick one above")),
      h("div", {}, h("label", { for: "i-version" }, "Version"),
        h("select", { id: "i-version", name: "version", onchange: () => refillEditor(m) },
          h("option", { value: "" }, "newest ready"),
          versions.map((v) => h("option", { value: v.version }, `v${v.version}`)))),
      h("div", { class: "grow" }, h("label", { for: "i-serving" }, "Serving entry point"),
        h("input", { id: "i-serving", name: "serving", value: defaultServing(), size: 30, oninput: (e) => (e.target.dataset.edited = "1") })),
    ),
    h("label", { for: "i-body" }, "Request (Open Inference Protocol v2, JSON): prefilled from the version's inputs"),
    h("textarea", { id: "i-body", name: "body", rows: 8, spellcheck: false, class: "mono" }),
    h("div", { class: "pager" },
      h("button", { type: "submit", class: "primary", id: "infer-send", disabled: !m }, "Send"),
      h("span", { class: "hint", id: "infer-ready" }),
    ),
    h("div", { id: "infer-result", "aria-live": "polite" }, lastAnswer),
  );
  fill(inferEl, form);
  refillEditor(m);
  updateReadiness(m);
}

function refillEditor(m) {
  const chosen = document.getElementById("i-version")?.value;
  const version = m?.versions.find((v) => String(v.version) === chosen) ?? m?.versions.at(-1);
  const editor = document.getElementById("i-body");
  if (editor) editor.value = sampleRequest(version);
}

function updateReadiness(m) {
  const note = document.getElementById("infer-ready");
  if (!note) return;
  const live = m ? replicas.get(keyOf(m)) ?? [] : [];
  const ready = live.filter((r) => r.state === STATE.RUNNING).length;
  note.textContent = !m ? "" : ready ? `${ready} replica${ready === 1 ? "" : "s"} ready` : "no replica ready: deploy a version first";
}

async function sendInference(m) {
  const result = document.getElementById("infer-result");
  let body;
  try {
    body = JSON.parse(document.getElementById("i-body").value);
  } catch (err) {
    fill(result, errorBox(`The request is not JSON: ${err.message}`));
    return;
  }
  const version = document.getElementById("i-version").value;
  const base = servingBase();
  const modelPath = m.tenant && m.tenant !== me.tenant ? `${encodeURIComponent(m.tenant)}/${encodeURIComponent(m.name)}` : encodeURIComponent(m.name);
  const url = `${base}/v2/models/${modelPath}${version ? `/versions/${encodeURIComponent(version)}` : ""}/infer`;
  fill(result, h("p", { class: "muted" }, `Sending to ${url}…`));
  const started = performance.now();
  let res;
  try {
    res = await fetch(url, {
      method: "POST",
      credentials: "include",
      headers: { "Content-Type": "application/json", Accept: "application/json", "X-CSRF-Token": csrf },
      body: JSON.stringify(body),
    });
  } catch {
    await tick(); // (the policy's violation event comes after the failed fetch)
    lastAnswer = errorBox(unreachable(base));
    fill(result, lastAnswer);
    return;
  }
  const ms = performance.now() - started;
  const text = await res.text();
  let data = null;
  try {
    data = JSON.parse(text);
  } catch {
    /* not JSON */
  }
  if (!res.ok) {
    lastAnswer = errorBox(`Refused (${res.status}): ${data?.error ?? text ?? res.statusText}`);
  } else {
    lastAnswer = h("div", { class: "infer-answer" },
      h("p", { class: "ok", role: "status" }, `Answered by ${data.model_name} v${data.model_version} in ${num(ms, 0)} ms`),
      tableBox(h("table", { id: "infer-outputs" },
        h("thead", {}, h("tr", {}, ["Output", "Datatype", "Shape", "Data"].map((t) => h("th", { scope: "col" }, t)))),
        h("tbody", {}, (data.outputs ?? []).map((o) => h("tr", { "data-output": o.name },
          h("td", { class: "mono" }, o.name),
          h("td", {}, o.datatype),
          h("td", { class: "mono" }, `[${(o.shape ?? []).join(", ")}]`),
          h("td", { class: "mono data" }, dataText(o.data))))),
      )),
    );
  }
  fill(result, lastAnswer);
  loadRates();
}

function dataText(data) {
  if (!Array.isArray(data)) return JSON.stringify(data);
  const shown = data.slice(0, 48).map((x) => (typeof x === "number" && !Number.isInteger(x) ? Number(x.toPrecision(6)) : x));
  return JSON.stringify(shown).replace(/,/g, ", ") + (data.length > 48 ? ` … (${data.length} values)` : "");
}

// ---------------------------------------------------------------- live

onEvent((e) => {
  const k = kind(e);
  if (k === SUBJECT.MODEL_READY && e.data?.endpoint) learnServing(e.data.endpoint);
  if (k === SUBJECT.MODEL_FAILED && e.data) {
    failures.unshift({
      key: `${e.data.tenant}/${e.data.name}`, version: e.data.version, job: { job_id: e.data.job_id },
      reason: `${e.data.reason}: ${e.data.message}`, at: e.time, live: true,
    });
  }
});
const refresh = keepFresh(load, { subject: ">", filter: (e) => /^(model|job)\./.test(kind(e)), everyMs: 30_000 });
setInterval(loadRates, RATE_EVERY_MS);
setTimeout(loadRates, 800);
