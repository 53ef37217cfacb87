// A job's page: its state and why, the timeline of its events, placement and attempts, the outputs it keeps,
// live logs per replica, cancel and resubmit.
import {
  ApiError, ago, api, bytes, duration, elapsed, empty, errorBox, fill, h, kind, main, num, onEvent, params,
  section, setQuery, stateBadge, tableBox, throttle,
} from "../app.js";
import { STATE, TERMINAL_STATES, WILDCARD } from "../contracts.js";
import { crumbs, fileTable, pathQuery } from "../files.js";
import { openTerminal } from "./terminal.js";

const jobId = params.jobId;
const LOG_KEEP = 512 * 1024; // characters of output kept on the page (the API has all of it)

const headEl = section("job-head", null);
const whyEl = section("job-why", "State and reason");
const row = h("div", { class: "row" });
const timelineSection = h("section", { id: "job-timeline" }, h("h2", {}, "Timeline"), h("div", { class: "body" }));
const placementSection = h("section", { id: "job-placement" }, h("h2", {}, "Placement and attempts"), h("div", { class: "body" }));
row.append(timelineSection, placementSection);
whyEl.parentElement.after(row);
const timelineEl = timelineSection.querySelector(".body");
const placementEl = placementSection.querySelector(".body");
const logsEl = section("job-logs", "Logs");
const outputsSection = h("section", { id: "job-outputs", hidden: true }, h("h2", {}, "Outputs"), h("div", { class: "body" }));
logsEl.parentElement.before(outputsSection);
const outputsEl = outputsSection.querySelector(".body");
const terminalSection = h("section", { id: "job-terminal", hidden: true }, h("h2", {}, "Terminal"), h("div", { class: "body" }));
logsEl.parentElement.before(terminalSection);
const terminalEl = terminalSection.querySelector(".body");

let job = null;
const WHY_REFRESH_MS = 5_000;

async function load() {
  try {
    job = await api(`/v1/jobs/${encodeURIComponent(jobId)}`);
  } catch (err) {
    fill(headEl, errorBox(err));
    return;
  }
  drawHead();
  drawPlacement();
  drawTerminal();
  loadWhy();
  loadTimeline();
  loadOutputs();
  logs.sync();
}

function drawHead() {
  const active = !TERMINAL_STATES.includes(job.state);
  const cancel = h("button", { class: "danger", id: "cancel", disabled: !active || job.cancel_requested, onclick: cancelJob },
    job.cancel_requested && active ? "Cancelling…" : "Cancel");
  const resubmit = h("button", { id: "resubmit", onclick: resubmitJob }, "Resubmit");
  const title = main.querySelector("h1");
  fill(title, job.name, " ", h("span", { id: "job-state" }, stateBadge(job.state)));
  document.title = `${job.name} · GPUYARD`;
  fill(headEl,
    h("div", { class: "row", style: { alignItems: "center", justifyContent: "space-between" } },
      h("div", {},
        h("div", { class: "mono" }, job.job_id),
        h("div", { class: "muted" }, `tenant ${job.tenant} · user ${job.user || "—"} · submitted `, ago(job.created_at),
          ` · ${num(job.gpus)} GPU${job.gpus === 1 ? "" : "s"} · attempt ${job.attempt}`),
        checkpointLine(job.checkpoint),
      ),
      h("div", { class: "row", style: { gap: "8px", flex: "0 0 auto" } },
        cancel, resubmit,
        h("a", { class: "button", href: `/v1/jobs/${encodeURIComponent(job.job_id)}/events`, target: "_blank" }, "Events as JSON"),
      ),
    ),
    h("div", { id: "action-result" }),
  );
}

/** The latest checkpoint the job reported (docs/storage.md): its step, size, when and by which attempt. */
function checkpointLine(c) {
  if (!c) return null;
  return h("div", { class: "muted", id: "job-checkpoint" },
    `latest checkpoint: step ${c.step} · ${bytes(c.size_bytes)} · saved `, ago(c.saved_at), ` by attempt ${c.attempt}`);
}

async function cancelJob() {
  const out = document.getElementById("action-result");
  try {
    const answer = await api(`/v1/jobs/${encodeURIComponent(jobId)}/cancel`, { method: "POST" });
    fill(out, h("p", { class: "ok" }, answer.message));
    load();
  } catch (err) {
    fill(out, errorBox(err));
  }
}

async function resubmitJob() {
  const out = document.getElementById("action-result");
  try {
    const accepted = await api("/v1/jobs", { method: "POST", body: job.spec });
    location.assign(`/jobs/${encodeURIComponent(accepted.job_id)}`);
  } catch (err) {
    fill(out, errorBox(err));
  }
}

// A running job's Terminal part (pages/terminal.js): a shell in the replica chosen, in its directory, with its
// environment and user; it closes with the job.
const terminal = { close: null, replica: 0 };

function drawTerminal() {
  const running = job.state === STATE.RUNNING;
  terminalSection.hidden = !running && !terminal.close;
  if (!running && terminal.close) {
    terminal.close();
    terminal.close = null;
    fill(terminalEl, h("p", { class: "muted", id: "terminal-ended" }, `The job is ${job.state}: its terminal has closed.`));
  }
  if (!running || terminal.close || terminalEl.querySelector("#terminal-open")) return;
  const replicas = (job.placements ?? []).map((p) => p.replica);
  const choice = h("select", { id: "terminal-replica", "aria-label": "Replica" },
    replicas.map((r) => h("option", { value: r }, `replica ${r}`)));
  fill(terminalEl, h("div", { class: "row", style: { alignItems: "center" } },
    replicas.length > 1 ? choice : null,
    h("button", { id: "terminal-open", onclick: () => startTerminal(Number(choice.value || 0)) }, "Open a terminal"),
    h("span", { class: "muted" }, "A shell in the job: its working directory, environment and user.")));
}

function startTerminal(replica) {
  const screen = h("div", { id: "terminal", style: { height: "360px", marginTop: "8px" } });
  const status = h("p", { class: "muted", id: "terminal-status" }, `replica ${replica}`);
  const close = h("button", { id: "terminal-close", onclick: () => stopTerminal("Closed.") }, "Close");
  fill(terminalEl, h("div", { class: "row", style: { alignItems: "center", justifyContent: "space-between" } }, status, close), screen);
  terminal.replica = replica;
  terminal.close = openTerminal(screen, jobId, replica, (text) => fill(status, text));
}

function stopTerminal(text) {
  terminal.close?.();
  terminal.close = null;
  fill(terminalEl, h("p", { class: "muted", id: "terminal-ended" }, text));
  if (job?.state === STATE.RUNNING) {
    terminalEl.append(h("button", { id: "terminal-open", onclick: () => startTerminal(terminal.replica) }, "Open a terminal"));
  }
}

async function loadWhy() {
  let why = null;
  try {
    why = await api(`/v1/jobs/${encodeURIComponent(jobId)}/why`);
  } catch (err) {
    if (!(err instanceof ApiError)) throw err;
  }
  const rows = why?.rows ?? [];
  fill(whyEl,
    why ? h("p", { id: "why-summary" }, why.summary) : null,
    rows.length ? h("dl", { class: "kv", id: "why" }, rows.map(([k, v]) => [h("dt", {}, k), h("dd", {}, v)])) : null,
  );
}

function drawPlacement() {
  const parts = [];
  if (job.placements?.length) {
    parts.push(tableBox(h("table", { id: "placements" },
      h("thead", {}, h("tr", {}, ["Replica", "Node", "GPUs", "CPUs", "Memory"].map((t) => h("th", {}, t)))),
      h("tbody", {}, job.placements.map((p) => h("tr", {},
        h("td", {}, p.replica), h("td", {}, p.node),
        h("td", {}, p.gpus.map((g) => (g.fraction < 1 ? `#${g.index} × ${num(g.fraction)}` : `#${g.index}`)).join(", ") || "—"),
        h("td", {}, num(p.cpus)), h("td", {}, bytes(p.memory_bytes)),
      ))),
    )));
  } else if (!TERMINAL_STATES.includes(job.state)) {
    parts.push(empty("Not placed yet.", "The scheduler places it when the GPUs it asks for are free: see the reason above."));
  }
  if (job.attempts?.length) {
    parts.push(h("h2", { style: { marginTop: "12px" } }, "Attempts"), tableBox(h("table", { id: "attempts" },
      h("thead", {}, h("tr", {}, ["#", "Queued", "Started", "Ran", "Nodes", "Outcome", "Exit code"].map((t) => h("th", {}, t)))),
      h("tbody", {}, job.attempts.map((a) => h("tr", {},
        h("td", {}, a.number), h("td", {}, ago(a.queued_at)), h("td", {}, ago(a.started_at)),
        h("td", {}, elapsed(a.started_at, a.ended_at)),
        h("td", {}, a.nodes.join(", ") || "—"),
        h("td", {}, a.summary ?? a.outcome ?? "in progress", a.message ? h("div", { class: "muted" }, a.message) : null),
        h("td", {}, a.exit_code ?? "—"),
      ))),
    )));
  }
  fill(placementEl, parts);
}

async function loadTimeline() {
  try {
    const events = await api(`/v1/jobs/${encodeURIComponent(jobId)}/events`);
    let previous = null;
    fill(timelineEl, h("ol", { class: "timeline", id: "timeline" }, events.map(({ event }) => {
      const at = new Date(event.time);
      const after = previous ? duration((at - previous) / 1000) : null;
      previous = at;
      return h("li", { "data-kind": kind(event) },
        h("strong", {}, kind(event).replace(/^job\./, "").replace(/_/g, " ")),
        h("span", { class: "t" }, ago(event.time), after ? ` · +${after}` : ""),
        eventNote(event),
      );
    })));
  } catch (err) {
    fill(timelineEl, errorBox(err));
  }
}

function eventNote(event) {
  const d = event.data ?? {};
  const saved = d.step != null ? `step ${d.step} · ${bytes(d.size_bytes)}` : ""; // (a job.checkpointed)
  const note = saved || (d.cause ? causeText(d) : "") || d.message || d.reason || (d.exit_code != null ? `exit code ${d.exit_code}` : "") || (d.node ? `on ${d.node}` : "");
  return note ? h("div", { class: "muted" }, typeof note === "string" ? note : reasonText(note)) : null;
}

/** A preemption's cause in words: the cause, the node it names, its message, the work it loses
 * (`priority · lost about 12 min of work`, `drain · node n1`). */
function causeText(d) {
  return [d.cause, d.node ? `node ${d.node}` : "", d.message, lostWorkText(d.lost_work_seconds)].filter(Boolean).join(" · ");
}

/** A preemption's lost work in words, as the CLI says it (`lost_work_text`); "" where not known. */
function lostWorkText(seconds) {
  if (seconds == null) return "";
  return seconds < 60 ? "lost under a minute of work" : `lost about ${Math.floor(seconds / 60 + 0.5)} min of work`;
}

/** A structured reason (a job.pending's) in words: the API's own sentence for it, else its fields. */
function reasonText(reason) {
  return reason.text || reason.message || JSON.stringify(reason);
}

// ---------------------------------------------------------------- outputs: what it keeps (GPUYARD_OUTPUT_DIR)

let outputsPath = new URLSearchParams(location.search).get("outputs") ?? ""; // the folder of them shown
const artifacts = () => `/v1/jobs/${encodeURIComponent(jobId)}/artifacts`;
const outputsHref = (path) => (path ? `?${new URLSearchParams({ outputs: path })}` : location.pathname);

/** The job's outputs, shown once it has any: one folder of them, each entry with its download link. */
async function loadOutputs() {
  let listing;
  try {
    listing = await api(`${artifacts()}${pathQuery(outputsPath)}`);
  } catch (err) {
    if (!(err instanceof ApiError)) throw err;
    if (err.status === 404 && outputsPath) return openOutputs(""); // (that folder is gone: the top instead)
    if (!outputsSection.hidden) fill(outputsEl, errorBox(err)); // (none shown yet: nothing to say)
    return;
  }
  if (!listing.items.length && !outputsPath) {
    outputsSection.hidden = true;
    return;
  }
  outputsSection.hidden = false;
  fill(outputsEl,
    h("div", { class: "row files-head" },
      crumbs(outputsPath, { top: "outputs", href: outputsHref, open: openOutputs, id: "outputs-path" }),
      h("a", { class: "button download", id: "outputs-download", href: `${artifacts()}/content`, download: `${jobId}-outputs.tar` },
        "Download all (tar)")),
    fileTable(listing, {
      id: "outputs-table",
      href: outputsHref,
      open: openOutputs,
      download: (path) => `${artifacts()}/content${pathQuery(path)}`,
      emptyText: "This folder is empty.",
    }),
  );
}

function openOutputs(path) {
  outputsPath = path;
  setQuery({ outputs: path });
  return loadOutputs();
}

// ---------------------------------------------------------------- logs: one follower per replica

const logs = {
  replica: 0,
  attempt: null,
  controller: null,
  pre: h("pre", { class: "log", id: "log", "aria-live": "off" }),
  status: h("span", { class: "muted", id: "log-status" }),
  tabs: h("div", { class: "row", style: { gap: "6px", marginBottom: "8px" } }),

  /** Follow the current attempt's output of the chosen replica (again when the attempt changed). */
  sync() {
    if (!job) return;
    if (!logsEl.contains(this.pre)) fill(logsEl, this.tabs, this.pre, this.status);
    fill(this.tabs, Array.from({ length: job.spec.replicas }, (_, i) =>
      h("button", { class: i === this.replica ? "primary" : "", onclick: () => this.show(i) }, `replica ${i}`)),
      h("a", { class: "button", href: this.url(false), target: "_blank" }, "Whole log"));
    if (this.attempt === job.attempt && this.controller) return;
    if (job.state === STATE.QUEUED && !job.attempts?.some((a) => a.started_at)) {
      fill(this.pre, "");
      this.status.textContent = "No output yet: the job has not started.";
      return;
    }
    this.start();
  },
  show(replica) {
    this.replica = replica;
    this.attempt = null;
    this.controller?.abort();
    this.controller = null;
    this.sync();
  },
  url(follow) {
    const q = new URLSearchParams({ replica: this.replica, attempt: job.attempt });
    if (follow) {
      q.set("follow", "true");
      q.set("tail", "2000");
    }
    return `/v1/jobs/${encodeURIComponent(job.job_id)}/logs?${q}`;
  },
  async start() {
    this.controller?.abort();
    const controller = new AbortController();
    this.controller = controller;
    this.attempt = job.attempt;
    fill(this.pre, "");
    this.status.textContent = TERMINAL_STATES.includes(job.state) ? "" : "following…";
    try {
      const res = await fetch(this.url(true), { signal: controller.signal, credentials: "same-origin" });
      if (!res.ok) {
        const detail = await res.json().catch(() => ({}));
        throw new Error(detail.detail ?? `HTTP ${res.status}`);
      }
      const reader = res.body.pipeThrough(new TextDecoderStream()).getReader();
      for (;;) {
        const { value, done } = await reader.read();
        if (done) break;
        this.append(value);
      }
      if (this.controller === controller) {
        this.status.textContent = this.pre.textContent ? "end of output" : "This replica wrote nothing.";
        this.controller = null;
      }
    } catch (err) {
      if (err.name !== "AbortError") this.status.textContent = `Logs: ${err.message}`;
    }
  },
  append(text) {
    const atBottom = this.pre.scrollTop + this.pre.clientHeight >= this.pre.scrollHeight - 4;
    this.pre.append(text);
    if (this.pre.textContent.length > LOG_KEEP * 1.5) this.pre.textContent = this.pre.textContent.slice(-LOG_KEEP);
    if (atBottom) this.pre.scrollTop = this.pre.scrollHeight;
  },
};

load();
const refresh = throttle(load, 300);
onEvent((event) => event.data?.job_id === jobId && refresh(), WILDCARD.JOB, () => refresh());
// What the API words from the clock moves without events of the job's own: a queued job's place in line and
// wait (the whole job is read again), a running job's "running on node-a for 40s" (its explanation). The
// page's own relative times and durations advance by themselves (app.js).
setInterval(() => {
  if (!job || TERMINAL_STATES.includes(job.state) || document.hidden) return;
  if (job.state === STATE.QUEUED) refresh();
  else {
    loadWhy();
    loadOutputs(); // (a running job writes them without an event)
  }
}, WHY_REFRESH_MS);
