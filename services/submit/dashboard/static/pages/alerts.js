// Alerts and usage: the alerts active and recent (live from alert events), and GPU-hours allocated against
// GPU-hours used per tenant or user over a period, as a chart drawn here in SVG, with its CSV.
import {
  ago, api, empty, errorBox, fill, h, jobLink, keepFresh, kind, me, num, params, section, setQuery, tableBox,
} from "../app.js";

const SVG = "http://www.w3.org/2000/svg";
const CHART_MIN_WIDTH = 560; // (app.css: .usage-chart svg's min-width)
const PERIODS = { "24h": "the last 24 hours", "7d": "the last 7 days", "30d": "the last 30 days" };
const BYS = { tenant: "by tenant", user: "by user" };
const CSV_COLUMNS = (params.usageColumns ?? "").split(","); // gpuyard usage --csv's (shared/reporting/usage.py)
const query = new URLSearchParams(location.search);
const usageQuery = {
  since: PERIODS[query.get("since")] ? query.get("since") : "7d",
  by: BYS[query.get("by")] ? query.get("by") : "tenant",
};

const activeEl = section("alerts-active", "Active alerts");
const recentEl = section("alerts-recent", "Recent alerts (resolved)");
const usageEl = section("usage", "GPU-hours: allocated and used");

// ---------------------------------------------------------------- alerts

function severity(a) {
  return h("span", { class: `sev sev-${a.severity}` }, a.severity);
}

function about(a) {
  const parts = [];
  if (a.job_id) parts.push(h("span", {}, "job ", jobLink({ job_id: a.job_id })));
  if (a.node) parts.push(h("span", {}, `${a.node}${a.gpu_index != null ? ` · GPU ${a.gpu_index}` : ""}`));
  if (a.tenant && me.admin) parts.push(h("span", { class: "muted" }, `tenant ${a.tenant}${a.user ? ` · ${a.user}` : ""}`));
  return parts.length ? parts.flatMap((p, i) => (i ? [h("br"), p] : [p])) : h("span", { class: "muted" }, "—");
}

function figure(a) {
  if (a.value == null) return h("span", { class: "muted" }, "—");
  return `${num(a.value, 1)}${a.threshold != null ? ` (threshold ${num(a.threshold, 1)})` : ""}`;
}

function alertTable(items, resolved) {
  const head = ["Severity", "Alert", "What happened", "About", "Figure", "Raised", ...(resolved ? ["Resolved"] : [])];
  return tableBox(h("table", { class: "alerts" },
    h("thead", {}, h("tr", {}, head.map((t) => h("th", { scope: "col" }, t)))),
    h("tbody", {}, items.map((a) => h("tr", { "data-alert": a.alert_id, "data-kind": a.kind, class: `alert-${a.severity}` },
      h("td", {}, severity(a)),
      h("td", { class: "mono" }, a.kind),
      h("td", {}, a.message),
      h("td", {}, about(a)),
      h("td", { class: "num" }, figure(a)),
      h("td", {}, ago(a.raised_at)),
      resolved ? h("td", {}, ago(a.resolved_at), a.resolved_message ? h("div", { class: "muted" }, a.resolved_message) : null) : null,
    ))),
  ));
}

async function loadAlerts() {
  const [active, resolved] = await Promise.all([
    api("/v1/alerts?state=active&limit=100").catch((err) => err),
    api("/v1/alerts?state=resolved&limit=25").catch((err) => err),
  ]);
  if (active instanceof Error) fill(activeEl, errorBox(active));
  else if (!active.items.length) {
    fill(activeEl, empty("No active alert: nothing needs attention now.",
      "The monitor raises alerts for idle or hot GPUs, XID errors, lost nodes and jobs waiting too long (docs/alerts.md)."));
  } else fill(activeEl, alertTable(active.items, false));
  if (resolved instanceof Error) fill(recentEl, errorBox(resolved));
  else if (!resolved.items.length) fill(recentEl, empty("No alert resolved recently.", "Alerts show here once their condition clears."));
  else fill(recentEl, alertTable(resolved.items, true));
}

// ---------------------------------------------------------------- usage

let usage = null;

async function loadUsage() {
  try {
    usage = await api(`/v1/usage?since=${encodeURIComponent(usageQuery.since)}&by=${usageQuery.by}`);
  } catch (err) {
    usage = err;
  }
  drawUsage();
}

function rowLabel(r) {
  return usageQuery.by === "user" ? `${r.user || "—"} (${r.tenant})` : r.tenant;
}

function controls() {
  const choose = (key, value) => {
    usageQuery[key] = value;
    setQuery({ since: usageQuery.since === "7d" ? "" : usageQuery.since, by: usageQuery.by === "tenant" ? "" : usageQuery.by });
    loadUsage();
  };
  const group = (key, options, label) => h("div", { class: "seg", role: "group", "aria-label": label },
    Object.entries(options).map(([value, text]) => h("button", {
      type: "button", "data-value": value, "aria-pressed": String(usageQuery[key] === value),
      class: usageQuery[key] === value ? "on" : null, onclick: () => choose(key, value),
    }, key === "since" ? value : text)));
  return h("div", { class: "filters usage-controls" },
    group("by", BYS, "Group"),
    group("since", PERIODS, "Period"),
    h("button", { type: "button", id: "usage-csv", disabled: !(usage && !(usage instanceof Error) && usage.rows.length), onclick: downloadCsv }, "Download CSV"),
  );
}

function drawUsage() {
  if (usage instanceof Error) {
    fill(usageEl, controls(), errorBox(usage));
    return;
  }
  if (!usage) return;
  const since = new Date(usage.since);
  const when = h("p", { class: "hint" }, `${PERIODS[usageQuery.since]}, since `,
    h("time", { datetime: since.toISOString() }, since.toLocaleString()),
    ". Allocated: a job's GPU share × the time it held it. Used: that time weighted by the GPUs' utilization.");
  if (!usage.rows.length) {
    fill(usageEl, controls(), when, empty(`No GPU time allocated in ${PERIODS[usageQuery.since]}.`,
      "Each job that holds GPUs adds its GPU-hours here, live as it runs."));
    return;
  }
  const rows = [...usage.rows].sort((a, b) => b.allocated_gpu_hours - a.allocated_gpu_hours);
  fill(usageEl, controls(), when, chart(rows), usageTable(rows));
}

function svg(tag, attrs = {}, ...children) {
  const el = document.createElementNS(SVG, tag);
  for (const [k, v] of Object.entries(attrs)) if (v != null) el.setAttribute(k, v);
  for (const c of children.flat()) if (c != null) el.append(c instanceof Node ? c : document.createTextNode(String(c)));
  return el;
}

function hours(x) {
  if (x === 0) return "0";
  if (x < 0.01) return x.toFixed(4);
  return x < 10 ? x.toFixed(2) : num(x, 1);
}

/** A ruler's steps: 1, 2 or 5 × a power of ten, about `count` of them up to `top`. */
function ticks(top, count = 5) {
  const raw = top / count;
  const power = 10 ** Math.floor(Math.log10(raw));
  const step = [1, 2, 5, 10].map((m) => m * power).find((s) => s >= raw);
  const out = [0];
  while (out.at(-1) < top * (1 - 1e-9)) out.push(Number((out.length * step).toPrecision(6)));
  return out;
}

/** Horizontal bars, one per tenant or user: the allocated GPU-hours as the whole bar, the used part dark and
 *  the waste light, with the figures at its end. */
function chart(rows) {
  // drawn at the box's own width (from 560 px: narrower, it scrolls in its box), so that its text keeps its size
  const width = Math.round(Math.min(1000, Math.max(CHART_MIN_WIDTH, usageEl.clientWidth)));
  const labelWidth = width < 760 ? 120 : 170;
  const figureWidth = width < 760 ? 230 : 260;
  const barHeight = 20;
  const gap = 12;
  const top = 24;
  const plot = width - labelWidth - figureWidth;
  const most = Math.max(...rows.map((r) => Math.max(r.allocated_gpu_hours, r.used_gpu_hours)), 1e-9);
  const scale = ticks(most);
  const max = scale.at(-1) || most;
  const x = (v) => labelWidth + (v / max) * plot;
  const height = top + rows.length * (barHeight + gap) + 10;
  const grid = scale.map((t) => svg("g", { class: "tick" },
    svg("line", { x1: x(t), x2: x(t), y1: top - 4, y2: height - 8 }),
    svg("text", { x: x(t), y: top - 10, "text-anchor": "middle" }, String(Number(t.toPrecision(4))))));
  const bars = rows.map((r, i) => {
    const y = top + i * (barHeight + gap);
    const used = Math.min(r.used_gpu_hours, r.allocated_gpu_hours);
    const share = r.allocated_gpu_hours ? Math.round((100 * r.used_gpu_hours) / r.allocated_gpu_hours) : 0;
    const title = `${rowLabel(r)}: ${hours(r.allocated_gpu_hours)} GPU-h allocated, ${hours(r.used_gpu_hours)} used, ` +
      `${hours(r.waste_gpu_hours)} wasted (${r.jobs} job${r.jobs === 1 ? "" : "s"})`;
    return svg("g", { class: "bar", "data-key": rowLabel(r) },
      svg("title", {}, title),
      svg("text", { class: "label", x: labelWidth - 10, y: y + barHeight / 2 + 4, "text-anchor": "end" }, clip(rowLabel(r), Math.floor(labelWidth / 7))),
      svg("rect", { class: "allocated", x: x(0), y, width: Math.max(x(r.allocated_gpu_hours) - x(0), r.allocated_gpu_hours ? 2 : 0), height: barHeight, rx: 3 }),
      svg("rect", { class: "used", x: x(0), y, width: Math.max(x(used) - x(0), used ? 2 : 0), height: barHeight, rx: 3 }),
      svg("text", { class: "figure", x: x(r.allocated_gpu_hours) + 8, y: y + barHeight / 2 + 4 },
        `${hours(r.used_gpu_hours)} of ${hours(r.allocated_gpu_hours)} GPU-h used (${share}%)`),
    );
  });
  const legend = h("div", { class: "legend" },
    h("span", { class: "key used" }), "used", h("span", { class: "key allocated" }, ""), "allocated, not used (waste)");
  return h("figure", { class: "usage-chart", id: "usage-chart" },
    svg("svg", { viewBox: `0 0 ${width} ${height}`, width: "100%", role: "img",
      "aria-label": `GPU-hours allocated and used ${BYS[usageQuery.by]}, ${PERIODS[usageQuery.since]}` }, grid, bars),
    h("figcaption", {}, legend));
}

function clip(text, n) {
  return text.length > n ? `${text.slice(0, n - 1)}…` : text;
}

function usageTable(rows) {
  const who = usageQuery.by === "user" ? ["Tenant", "User"] : ["Tenant"];
  return tableBox(h("table", { id: "usage-table" },
    h("thead", {}, h("tr", {}, [...who, "Jobs", "Allocated GPU-h", "Used GPU-h", "Waste GPU-h", "Used %"]
      .map((t, i) => h("th", { scope: "col", class: i >= who.length ? "num" : null }, t)))),
    h("tbody", {}, rows.map((r) => h("tr", {},
      h("td", {}, r.tenant),
      usageQuery.by === "user" ? h("td", {}, r.user || "—") : null,
      h("td", { class: "num" }, num(r.jobs)),
      h("td", { class: "num" }, hours(r.allocated_gpu_hours)),
      h("td", { class: "num" }, hours(r.used_gpu_hours)),
      h("td", { class: "num" }, hours(r.waste_gpu_hours)),
      h("td", { class: "num" }, r.allocated_gpu_hours ? `${Math.round((100 * r.used_gpu_hours) / r.allocated_gpu_hours)}%` : "—"),
    ))),
  ));
}

/** The rows as `gpuyard usage --csv` writes them: the same columns, an empty cell for a missing value. */
export function usageCsv(rows) {
  const cell = (v) => {
    const text = v == null ? "" : String(v);
    return /[",\r\n]/.test(text) ? `"${text.replace(/"/g, '""')}"` : text;
  };
  return [CSV_COLUMNS.join(","), ...rows.map((r) => CSV_COLUMNS.map((c) => cell(r[c])).join(","))].join("\n") + "\n";
}

function downloadCsv() {
  if (!usage || usage instanceof Error) return;
  const blob = new Blob([usageCsv(usage.rows)], { type: "text/csv" });
  const link = h("a", { href: URL.createObjectURL(blob), download: `gpuyard-usage-${usageQuery.since}-by-${usageQuery.by}.csv` });
  document.body.append(link);
  link.click();
  link.remove();
  setTimeout(() => URL.revokeObjectURL(link.href), 10_000);
}

keepFresh(loadAlerts, { filter: (e) => kind(e).startsWith("alert."), everyMs: 60_000 });
keepFresh(loadUsage, { filter: (e) => /^job\.(placed|started|succeeded|failed|cancelled|requeued)$/.test(kind(e)), everyMs: 30_000 });
