// The dashboard's toolkit, shared by every page (static/pages/*.js): calls to the JSON API with the session,
// the live event stream, and small DOM helpers. Written here; no third-party code.

import { ACTIVE_STATES } from "./contracts.js";

const csrf = document.querySelector('meta[name="csrf-token"]')?.content ?? "";
const who = document.querySelector(".who");

/** Who is logged in: {tenant, admin}. */
export const me = { tenant: who?.dataset.tenant ?? "", admin: who?.dataset.admin === "true" };

/** The page's <main> element, its parameters in data-* attributes (data-job-id → params.jobId). */
export const main = document.getElementById("page");
export const params = main?.dataset ?? {};

export class ApiError extends Error {
  constructor(status, detail) {
    super(describe(detail) || `HTTP ${status}`);
    this.status = status;
    this.detail = detail;
  }
}

/** An API answer's `detail` in words: a string, or FastAPI's list of refused fields with their place. */
export function describe(detail) {
  if (detail == null) return "";
  if (typeof detail === "string") return detail;
  if (Array.isArray(detail)) {
    return detail
      .map((d) => {
        const where = (d.loc ?? []).filter((p) => p !== "body").join(".");
        return where ? `${where}: ${d.msg}` : d.msg;
      })
      .join("; ");
  }
  return JSON.stringify(detail);
}

/** Call the API as the logged-in user: JSON in and out; an ApiError with the API's reason otherwise. */
export async function api(path, { method = "GET", body, contentType, signal } = {}) {
  const headers = { Accept: "application/json" };
  if (method !== "GET") headers["X-CSRF-Token"] = csrf;
  if (body !== undefined) {
    headers["Content-Type"] = contentType ?? "application/json";
    if (typeof body !== "string") body = JSON.stringify(body);
  }
  const res = await fetch(path, { method, headers, body, signal, credentials: "same-origin" });
  if (res.status === 401) throw sessionEnded();
  return answer(res.status, await res.text());
}

/** Back to the login form, then here again: the session ended. */
function sessionEnded() {
  location.assign(`/?next=${encodeURIComponent(location.pathname + location.search)}`);
  return new ApiError(401, "your session ended: log in again");
}

/** An answer's JSON (or its text: logs); an ApiError with the API's reason for a status that is not 2xx. */
function answer(status, text) {
  let data = text;
  try {
    data = text ? JSON.parse(text) : null;
  } catch {
    /* a text answer (logs) */
  }
  if (status < 200 || status > 299) throw new ApiError(status, data?.detail ?? data?.error ?? text);
  return data;
}

/** Send a file's bytes to the API as the logged-in user (`PUT`, `application/octet-stream`), calling
 *  `progress(sent, total)` as they go out (XMLHttpRequest's upload progress: fetch reports none): the answer's
 *  JSON; an ApiError with the API's reason otherwise (status 0: the connection broke off). */
export function upload(path, file, { method = "PUT", progress = null } = {}) {
  return new Promise((resolve, reject) => {
    const xhr = new XMLHttpRequest();
    xhr.open(method, path);
    xhr.setRequestHeader("Accept", "application/json");
    xhr.setRequestHeader("Content-Type", "application/octet-stream");
    xhr.setRequestHeader("X-CSRF-Token", csrf);
    if (progress) xhr.upload.onprogress = (e) => progress(e.loaded, e.lengthComputable ? e.total : file.size);
    xhr.onload = () => {
      if (xhr.status === 401) return reject(sessionEnded());
      try {
        resolve(answer(xhr.status, xhr.responseText));
      } catch (err) {
        reject(err);
      }
    };
    xhr.onerror = () => reject(new ApiError(0, "the upload broke off: the API did not answer it"));
    xhr.onabort = () => reject(new ApiError(0, "the upload was stopped"));
    xhr.send(file);
  });
}

// ---------------------------------------------------------------- the live event stream

const EVENT_TYPES = (document.querySelector('meta[name="event-types"]')?.content ?? "").split(",");
const streams = new Map(); // subject filter -> {source, listeners}

/** Call `fn(event)` for each CloudEvent of the platform's stream matching `subject` (a NATS filter) that the
 *  user may see, and `opened()` each time the stream (re)connects: what happened before, or while it was
 *  down, never comes through it. One EventSource per filter and page, reconnecting by itself. */
export function onEvent(fn, subject = ">", opened = null) {
  let stream = streams.get(subject);
  if (!stream) {
    stream = { listeners: new Set(), openers: new Set(), source: connect(subject) };
    streams.set(subject, stream);
  }
  stream.listeners.add(fn);
  if (opened) stream.openers.add(opened);
  return () => {
    stream.listeners.delete(fn);
    stream.openers.delete(opened);
  };
}

const LIVE_DOT = {
  on: ["live", "live on", "Live updates from the event stream"],
  reconnecting: ["reconnecting…", "live off", "The event stream broke off: reconnecting (what it missed is read again)"],
  closed: ["not live", "live off", "The event stream was refused: reload the page"],
  none: ["not live", "live", "This page does not follow the event stream: reload it for what changed"],
};

/** The dot at the top right: the state of the page's event stream, in words. */
function showLive(state) {
  const dot = document.getElementById("live");
  if (!dot) return;
  const [text, className, title] = LIVE_DOT[state];
  dot.textContent = text;
  dot.className = className;
  dot.title = title;
  dot.dataset.state = state;
}

function connect(subject) {
  const source = new EventSource(`/v1/events/stream?subject=${encodeURIComponent(subject)}`);
  source.onopen = () => {
    showLive("on");
    for (const fn of streams.get(subject)?.openers ?? []) fn();
  };
  // (the browser retries a broken stream by itself; one answered with an error status it gives up)
  source.onerror = () => showLive(source.readyState === EventSource.CLOSED ? "closed" : "reconnecting");
  const deliver = (msg) => {
    let event;
    try {
      event = JSON.parse(msg.data);
    } catch {
      return;
    }
    for (const fn of streams.get(subject)?.listeners ?? []) fn(event);
  };
  for (const type of EVENT_TYPES) if (type) source.addEventListener(type, deliver); // (named SSE events)
  source.onmessage = deliver;
  return source;
}

// A page's script runs right after this module: a page that opened no stream by the next task says so.
setTimeout(() => streams.size || showLive("none"), 0);

/** An event's kind without the CloudEvents prefix: "job.placed". */
export function kind(event) {
  return (event.type ?? "").replace(/^io\.gpuyard\./, "");
}

/** `fn` run at most once per `ms`, the last call always honoured: a burst of events, one refresh. */
export function throttle(fn, ms = 500) {
  let timer = null;
  let again = false;
  return (...args) => {
    if (timer) {
      again = true;
      return;
    }
    fn(...args);
    timer = setTimeout(() => {
      timer = null;
      if (again) {
        again = false;
        fn(...args);
      }
    }, ms);
  };
}

/** Refresh with `load()` now, then whenever an event passes `filter` (throttled), and every `everyMs`. */
export function keepFresh(load, { subject = ">", filter = () => true, everyMs = 0 } = {}) {
  const run = throttle(load, 400);
  run();
  onEvent((e) => filter(e) && run(), subject, run); // (and again once live: nothing missed before)
  if (everyMs) setInterval(run, everyMs);
  return run;
}

// ---------------------------------------------------------------- DOM

/** An element: h("a", {href: "/jobs"}, "Jobs"). Text is always text (never parsed as HTML). */
export function h(tag, attrs = {}, ...children) {
  const el = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs ?? {})) {
    if (v == null || v === false) continue;
    if (k.startsWith("on") && typeof v === "function") el.addEventListener(k.slice(2), v);
    else if (k === "class") el.className = v;
    else if (k === "style" && typeof v === "object") Object.assign(el.style, v);
    else if (k in el && typeof v !== "string") el[k] = v;
    else el.setAttribute(k, v === true ? "" : v);
  }
  for (const c of children.flat(Infinity)) {
    if (c == null || c === false) continue;
    el.append(c instanceof Node ? c : document.createTextNode(String(c)));
  }
  return el;
}

/** Replace `el`'s content. */
export function fill(el, ...children) {
  el.replaceChildren(...children.flat(Infinity).filter((c) => c != null && c !== false));
  return el;
}

/** A section of the page under its title (created once, then refilled). */
export function section(id, title) {
  let el = document.getElementById(id);
  if (!el) {
    el = h("section", { id }, title ? h("h2", {}, title) : null, h("div", { class: "body" }));
    main.append(el);
  }
  return el.querySelector(".body");
}

/** Text with its `quoted` parts (commands, fields: the API's messages quote them so too) as <code>. */
export function prose(text) {
  return String(text)
    .split(/`([^`\n]+)`/)
    .map((part, i) => (i % 2 ? h("code", {}, part) : part))
    .filter((part) => part !== "");
}

/** What an empty list says: what it waits for, and a hint. */
export function empty(text, hint) {
  return h("div", { class: "empty" }, h("p", {}, prose(text)), hint ? h("p", { class: "hint" }, prose(hint)) : null);
}

export function errorBox(err) {
  return h("p", { class: "error", role: "alert" }, prose(err instanceof Error ? err.message : String(err)));
}

/** A table in its own box: on a narrow screen a wide table scrolls sideways there, and the page does not. */
export function tableBox(tableEl) {
  return h("div", { class: "table-box" }, tableEl);
}

/** A table (in its own box: `tableBox`): columns [{title, cell: row => node|string, sort?: row => value, class?}]. */
export function table(columns, rows, { rowClass, caption } = {}) {
  const head = h("tr", {}, columns.map((c) => h("th", { scope: "col", class: c.class }, c.title)));
  const body = rows.map((r) =>
    h(
      "tr",
      { class: rowClass?.(r) },
      columns.map((c) => h("td", { class: c.class }, c.cell(r))),
    ),
  );
  return tableBox(h("table", {}, caption ? h("caption", {}, caption) : null, h("thead", {}, head), h("tbody", {}, body)));
}

// ---------------------------------------------------------------- words and numbers

const rtf = new Intl.RelativeTimeFormat(undefined, { numeric: "auto" });
const UNITS = [
  ["year", 31536000],
  ["month", 2592000],
  ["week", 604800],
  ["day", 86400],
  ["hour", 3600],
  ["minute", 60],
  ["second", 1],
];

/** `date` relative to now: "3 minutes ago", "in 2 hours", in the browser's language. */
function relative(date) {
  const seconds = (date.getTime() - Date.now()) / 1000;
  const [unit, size] = UNITS.find(([, s]) => Math.abs(seconds) >= s) ?? ["second", 1];
  return rtf.format(Math.round(seconds / size), unit);
}

/** "3 minutes ago" in the browser's language, the absolute time in the browser's zone on hover; it advances
 *  by itself (see `tick`). */
export function ago(when) {
  if (!when) return h("span", { class: "muted" }, "—");
  const date = new Date(when);
  return h("time", { datetime: date.toISOString(), title: date.toLocaleString(), "data-ago": "" }, relative(date));
}

/** The time from `start` to `end` as a duration ("3 min 20 s"); without an end, to now, and it keeps counting
 *  (see `tick`). "—" without a start. */
export function elapsed(start, end = null) {
  if (!start) return h("span", { class: "muted" }, "—");
  const from = new Date(start);
  if (end) return h("span", { class: "elapsed" }, duration((new Date(end) - from) / 1000));
  return h("span", { class: "elapsed", "data-since": from.toISOString() }, duration((Date.now() - from) / 1000));
}

/** Every relative time and running duration on the page, brought up to now: nothing else redraws them while
 *  no event comes (a job running quietly, a token's age). */
function tick() {
  if (document.hidden) return;
  for (const el of document.querySelectorAll("time[data-ago]")) {
    const text = relative(new Date(el.dateTime));
    if (el.textContent !== text) el.textContent = text;
  }
  for (const el of document.querySelectorAll("[data-since]")) {
    const text = duration((Date.now() - new Date(el.dataset.since)) / 1000);
    if (el.textContent !== text) el.textContent = text;
  }
}
setInterval(tick, 1000);

/** A duration in seconds as people say it: 45 s, 3 min 20 s, 2 h 5 min, 3 d 4 h. */
export function duration(seconds) {
  if (seconds == null || !isFinite(seconds)) return "—";
  seconds = Math.max(0, seconds);
  if (seconds < 10) return `${seconds.toFixed(1).replace(/\.0$/, "")} s`;
  seconds = Math.round(seconds);
  if (seconds < 60) return `${seconds} s`;
  if (seconds < 3600) return `${Math.floor(seconds / 60)} min ${seconds % 60} s`;
  if (seconds < 86400) return `${Math.floor(seconds / 3600)} h ${Math.floor((seconds % 3600) / 60)} min`;
  return `${Math.floor(seconds / 86400)} d ${Math.floor((seconds % 86400) / 3600)} h`;
}

// Sizes as the API and the CLI write them (shared/contracts/units.py, format_size: mirrored here, keep them alike): in
// the unit they were most likely written in when it divides them into at most four digits ("256 MB",
// "16 GiB", "1536 MiB"), else three figures in binary units ("1.5 GiB", "23.5 GiB", "900 B").
const WRITTEN_UNITS = [
  ["TiB", 2 ** 40], ["TB", 1e12], ["GiB", 2 ** 30], ["GB", 1e9], ["MiB", 2 ** 20], ["MB", 1e6], ["KiB", 2 ** 10], ["kB", 1e3],
];
const WRITTEN_DIGITS = 10_000;
const BINARY_UNITS = [["TiB", 2 ** 40], ["GiB", 2 ** 30], ["MiB", 2 ** 20], ["KiB", 2 ** 10]];

export function bytes(n) {
  if (n == null) return "—";
  n = Math.trunc(n);
  for (const [unit, factor] of WRITTEN_UNITS) {
    if (n >= factor && n % factor === 0 && n / factor < WRITTEN_DIGITS) return `${n / factor} ${unit}`;
  }
  for (const [unit, factor] of BINARY_UNITS) {
    if (n >= factor) {
      const value = n / factor;
      return `${value < 1000 ? Number(value.toPrecision(3)) : Math.round(value)} ${unit}`;
    }
  }
  return `${n} B`;
}

export function num(n, digits = 2) {
  if (n == null) return "—";
  return Number.isInteger(n) ? String(n) : n.toFixed(digits).replace(/\.?0+$/, "");
}

/** A job state as a coloured badge. */
export function stateBadge(state) {
  return h("span", { class: `state state-${state}` }, state);
}

/** A job's link, by its short id and name. */
export function jobLink(job) {
  return h("a", { href: `/jobs/${encodeURIComponent(job.job_id)}`, title: job.job_id }, job.name || job.job_id.slice(0, 12));
}

/** Why a queued job waits, in words, with its place in line (the API's message says it: "…; 2nd in line"). */
export function waitingText(pending) {
  return pending?.message ?? "";
}

/** Fill the query string with `values` (empty ones removed) without reloading. */
export function setQuery(values) {
  const q = new URLSearchParams(location.search);
  for (const [k, v] of Object.entries(values)) {
    if (v == null || v === "" || (Array.isArray(v) && !v.length)) q.delete(k);
    else q.set(k, Array.isArray(v) ? v.join(",") : v);
  }
  const text = q.toString();
  history.replaceState(null, "", location.pathname + (text ? `?${text}` : ""));
}

// ---------------------------------------------------------------- GPUs and nodes (Cluster and Nodes pages)

/** What a GPU is doing, the first that applies: its node lost, unhealthy, cordoned (or drained), shared
 *  (held in shares), allocated (held whole), free. */
export const GPU_STATES = [
  ["free", "free"],
  ["allocated", "allocated (whole)"],
  ["shared", "fractionally shared"],
  ["unhealthy", "unhealthy"],
  ["cordoned", "cordoned or draining"],
  ["lost", "node lost"],
];

/** Node names in their natural order (node-2 before node-10). */
export const byNodeName = new Intl.Collator(undefined, { numeric: true }).compare;

export function gpuState(gpu, node) {
  if (node.state === "lost") return "lost";
  if (!gpu.healthy) return "unhealthy";
  if (gpu.cordoned || node.state === "cordoned" || node.state === "draining") return "cordoned";
  if (gpu.holders.some((x) => x.fraction < 1)) return "shared";
  return gpu.holders.length ? "allocated" : "free";
}

/** A GPU's holders from a gpu.sample reading, as GET /v1/nodes gives them: another tenant's (the stream blanks
 *  its job) only as `other`, with its share. */
export function sampleHolders(reading) {
  return (reading.holders ?? []).map((x) =>
    x.job_id
      ? { job_id: x.job_id, tenant: x.tenant, user: x.user, fraction: x.fraction }
      : { fraction: x.fraction, other: true },
  );
}

/** Apply a gpu.sample's figures to the node (an item of GET /v1/nodes), in place: true when it changed it. */
export function applySample(node, sample) {
  if (!node || node.node !== sample.node) return false;
  const byIndex = new Map(sample.gpus.map((r) => [r.index, r]));
  for (const gpu of node.gpus) {
    const r = byIndex.get(gpu.index);
    if (!r) continue;
    gpu.utilization_pct = r.utilization_pct;
    gpu.memory_used_bytes = r.memory_used_bytes;
    gpu.temperature_c = r.temperature_c;
    gpu.holders = sampleHolders(r);
  }
  node.sampled_seconds_ago = 0;
  return true;
}

/** Carry over to a freshly read node (GET /v1/nodes) the figures only samples give (the temperature). */
export function keepSampled(fresh, old) {
  if (!old) return fresh;
  fresh.gpus.forEach((gpu, i) => {
    if (gpu.temperature_c === undefined && old.gpus[i]?.index === gpu.index) gpu.temperature_c = old.gpus[i].temperature_c;
  });
  return fresh;
}

/** Who holds a node's GPUs, as one string: to tell whether a sample changed it. */
export function holdersKey(node) {
  return node.gpus.map((g) => g.holders.map((x) => `${x.job_id ?? "other"}:${x.fraction}`).join(",")).join("|");
}

/** A holder in words: its job (a link where `asLink`) and share, or "another tenant's job". */
export function holderText(holder, names = new Map(), asLink = false) {
  const share = holder.fraction < 1 ? ` (${num(holder.fraction)} GPU)` : "";
  if (holder.other || !holder.job_id) return h("span", { class: "muted" }, `another tenant's job${share}`);
  const job = { job_id: holder.job_id, name: names.get(holder.job_id) };
  const who = me.admin && holder.tenant ? ` · ${holder.tenant}${holder.user ? `/${holder.user}` : ""}` : "";
  return h("span", {}, asLink ? jobLink(job) : job.name || holder.job_id.slice(0, 12), who + share);
}

/** The running and placed jobs the user may see (the API gives a tenant its own), up to `pages` pages of 500. */
export async function liveJobs(pages = 1) {
  const jobs = [];
  let cursor = null;
  for (let i = 0; i < pages; i++) {
    const q = new URLSearchParams([...ACTIVE_STATES.map((state) => ["state", state]), ["limit", "500"]]);
    if (cursor) q.set("cursor", cursor);
    const page = await api(`/v1/jobs?${q}`);
    jobs.push(...page.items);
    if (!(cursor = page.next_cursor)) break;
  }
  return jobs;
}
