// Tenants and quotas: each tenant's guaranteed, used and borrowed GPUs and its jobs waiting (a tenant: its own
// row); for admins, the tokens: create (shown once), revoke.
import {
  ApiError, ago, api, elapsed, empty, errorBox, fill, h, keepFresh, kind, me, num, section, tableBox,
} from "../app.js";
import { STATE } from "../contracts.js";

const tenantsEl = section("tenants", "Tenants and quotas");
const tokensEl = me.admin ? section("tokens", "Tokens") : null;

let tokens = null; // admins: GET /v1/admin/tokens
let created = null; // the token just created: shown this once
let tokenMessage = null;

// ---------------------------------------------------------------- tenants

function waitingLink(tenant, count) {
  const q = new URLSearchParams({ state: STATE.QUEUED });
  if (me.admin) q.set("tenant", tenant);
  return h("a", { href: `/jobs?${q}`, class: "waiting", title: `${tenant}'s queued jobs` }, `${num(count)} waiting`);
}

/** How long the oldest queued job has waited (`seconds` when read), counting on. */
function waitingSince(seconds) {
  return elapsed(new Date(Date.now() - seconds * 1000));
}

/** Used against guaranteed: the guaranteed part as the track, used inside it, borrowed beyond it. */
function quotaBar(t) {
  const scale = Math.max(t.guaranteed_gpus, t.used_gpus, 1);
  const pct = (x) => `${Math.min(100, (100 * x) / scale)}%`;
  const own = Math.max(0, t.used_gpus - t.borrowed_gpus);
  return h("div", { class: "quota-bar", title: `${num(t.used_gpus)} used of ${num(t.guaranteed_gpus)} guaranteed; ${num(t.borrowed_gpus)} borrowed` },
    h("span", { class: "guaranteed", style: { width: pct(t.guaranteed_gpus) } }),
    h("span", { class: "own", style: { width: pct(own) } }),
    t.borrowed_gpus ? h("span", { class: "borrowed", style: { left: pct(own), width: pct(t.borrowed_gpus) } }) : null,
  );
}

function tenantRows(items) {
  return tableBox(h("table", { id: "tenants-table" },
    h("thead", {}, h("tr", {}, ["Tenant", "Guaranteed GPUs", "Used", "Borrowed", "", "Queued", "Placed", "Running", "Oldest wait"]
      .map((t, i) => h("th", { scope: "col", class: i && i !== 4 ? "num" : null }, t)))),
    h("tbody", {}, items.map((t) => h("tr", { "data-tenant": t.tenant },
      h("td", {}, h("strong", {}, t.tenant), t.tenant === me.tenant ? h("span", { class: "muted" }, " (yours)") : null),
      h("td", { class: "num guaranteed" }, t.guaranteed_gpus ? num(t.guaranteed_gpus) : h("span", { class: "muted", title: "no quota: it runs on idle GPUs only" }, "none")),
      h("td", { class: "num used" }, num(t.used_gpus)),
      h("td", { class: "num borrowed" }, t.borrowed_gpus ? h("span", { class: "borrowing", title: "on another tenant's idle quota: the first to be preempted" }, num(t.borrowed_gpus)) : "0"),
      h("td", { class: "bar-cell" }, quotaBar(t)),
      h("td", { class: "num" }, t.queued ? waitingLink(t.tenant, t.queued) : h("span", { class: "muted" }, "0")),
      h("td", { class: "num" }, num(t.placed)),
      h("td", { class: "num" }, num(t.running)),
      h("td", { class: "num" }, t.oldest_queued_seconds == null ? h("span", { class: "muted" }, "—") : waitingSince(t.oldest_queued_seconds)),
    ))),
  ));
}

/** Without /v1/tenants (an older API): the tenants known otherwise, and where their waiting jobs are. */
function withoutFigures() {
  const names = me.admin ? [...new Set((tokens ?? []).map((t) => t.tenant))].sort() : [me.tenant];
  return [
    h("p", { class: "error", id: "no-quota", role: "status" },
      "Quota figures unavailable: this platform's API does not answer GET /v1/tenants (guaranteed, used and borrowed GPUs)."),
    names.length ? tableBox(h("table", { id: "tenants-table" },
      h("thead", {}, h("tr", {}, h("th", { scope: "col" }, "Tenant"), h("th", { scope: "col" }, "Its jobs"))),
      h("tbody", {}, names.map((n) => h("tr", { "data-tenant": n },
        h("td", {}, h("strong", {}, n)),
        h("td", {}, h("a", { href: `/jobs?${new URLSearchParams(me.admin ? { state: STATE.QUEUED, tenant: n } : { state: STATE.QUEUED })}` }, "queued jobs"))))))) : null,
  ];
}

async function loadTenants() {
  let answer;
  try {
    answer = await api("/v1/tenants");
  } catch (err) {
    if (err instanceof ApiError && err.status === 404) {
      if (me.admin && tokens == null) await loadTokens(false);
      fill(tenantsEl, withoutFigures());
    } else fill(tenantsEl, errorBox(err));
    return;
  }
  const items = me.admin ? answer.items : answer.items.filter((t) => t.tenant === me.tenant);
  if (!items.length) {
    fill(tenantsEl, empty("No tenant has a quota or a job right now.",
      "Quotas are set with GPUYARD_QUOTAS (vision=4,nlp=2); a tenant shows here once it has one or runs a job."));
    return;
  }
  const total = items.reduce((s, t) => s + t.guaranteed_gpus, 0);
  fill(tenantsEl,
    tenantRows(items),
    h("div", { class: "legend quota-legend" },
      h("span", { class: "key own" }), "used within its quota", h("span", { class: "key borrowed" }), "borrowed",
      h("span", { class: "key guaranteed" }), "guaranteed, free"),
    h("p", { class: "hint" }, me.admin
      ? `${num(total)} GPUs guaranteed in all. Borrowed GPUs are held on another tenant's idle quota: they are the first to be preempted when that tenant needs them.`
      : "Your tenant's quota and what it holds now. Borrowed GPUs are held on another tenant's idle quota: the first to be preempted."));
}

// ---------------------------------------------------------------- tokens (admins)

async function loadTokens(draw = true) {
  try {
    tokens = await api("/v1/admin/tokens");
  } catch (err) {
    tokens = null;
    if (draw) fill(tokensEl, errorBox(err));
    return;
  }
  if (draw) drawTokens();
}

function tokenForm() {
  return h("form", { class: "filters", id: "token-form", onsubmit: (e) => (e.preventDefault(), createToken(e.target)) },
    h("div", {}, h("label", { for: "t-tenant" }, "Tenant"), h("input", { id: "t-tenant", name: "tenant", required: true, size: 12, pattern: "[a-z0-9][a-z0-9\\-]*", title: "lower-case letters, digits and dashes" })),
    h("div", {}, h("label", { for: "t-user" }, "User"), h("input", { id: "t-user", name: "user", size: 12 })),
    h("div", {}, h("label", { for: "t-expires" }, "Expires in"), h("input", { id: "t-expires", name: "expires_in", size: 14, placeholder: "never, or 30d" })),
    h("div", { class: "check" }, h("label", { for: "t-admin" }, h("input", { id: "t-admin", name: "admin", type: "checkbox" }), " admin")),
    h("button", { type: "submit", class: "primary", id: "token-create" }, "Create token"),
  );
}

function shownOnce() {
  if (!created) return null;
  const copy = h("button", { type: "button", id: "token-copy", onclick: () => copyToken(copy) }, "Copy");
  return h("div", { class: "token-once", id: "token-once", role: "alert" },
    h("p", {}, h("strong", {}, `New token for ${created.tenant}${created.user ? ` (${created.user})` : ""}${created.admin ? ", admin" : ""}: `),
      "copy it now. It is shown this once; the platform keeps only its hash."),
    h("div", { class: "row" }, h("code", { id: "token-value" }, created.token), copy,
      h("button", { type: "button", onclick: () => ((created = null), drawTokens()) }, "Done")),
  );
}

async function copyToken(button) {
  try {
    await navigator.clipboard.writeText(created.token);
    button.textContent = "Copied";
  } catch {
    const range = document.createRange(); // no clipboard (plain http): select it for Ctrl+C
    range.selectNodeContents(document.getElementById("token-value"));
    getSelection().removeAllRanges();
    getSelection().addRange(range);
    button.textContent = "Selected: press Ctrl+C";
  }
}

function expiry(t) {
  if (!t.expires) return h("span", { class: "muted" }, "never");
  const past = new Date(t.expires) <= new Date();
  return h("span", { class: past ? "error-text" : null }, past ? "expired " : "", ago(t.expires));
}

function drawTokens() {
  if (!tokensEl) return;
  const rows = (tokens ?? []).map((t) => h("tr", { "data-token": t.id, "data-tenant": t.tenant },
    h("td", { class: "mono" }, t.id),
    h("td", {}, t.tenant),
    h("td", {}, t.user || h("span", { class: "muted" }, "—")),
    h("td", {}, t.admin ? h("span", { class: "pill" }, "admin") : ""),
    h("td", {}, ago(t.created)),
    h("td", {}, expiry(t)),
    h("td", {}, t.inline
      ? h("span", { class: "muted", title: "set by GPUYARD_TOKENS: revoke it there" }, "in the settings")
      : h("button", { class: "danger revoke", onclick: () => revokeToken(t) }, "Revoke")),
  ));
  fill(tokensEl,
    tokenForm(),
    shownOnce(),
    h("div", { id: "token-message" }, tokenMessage),
    rows.length
      ? tableBox(h("table", { id: "tokens-table" },
        h("thead", {}, h("tr", {}, ["Id", "Tenant", "User", "", "Created", "Expires", ""].map((t) => h("th", { scope: "col" }, t)))),
        h("tbody", {}, rows)))
      : empty("No token yet.", "Create one above, or with `gpuyard admin tokens create --tenant NAME`."),
  );
}

async function createToken(form) {
  const f = form.elements;
  const body = { tenant: f.tenant.value.trim(), user: f.user.value.trim(), admin: f.admin.checked };
  const expires = f.expires_in.value.trim();
  if (expires && expires !== "never") body.expires_in = /^\d+$/.test(expires) ? Number(expires) : expires;
  try {
    created = await api("/v1/admin/tokens", { method: "POST", body });
    tokenMessage = null;
    form.reset();
  } catch (err) {
    created = null;
    tokenMessage = errorBox(err);
  }
  await loadTokens();
  loadTenants();
}

async function revokeToken(t) {
  const who = `${t.tenant}${t.user ? ` (${t.user})` : ""}`;
  if (!confirm(`Revoke token ${t.id} of ${who}? Every request with it, and every dashboard session logged in with it, is refused from now on.`)) return;
  try {
    await api(`/v1/admin/tokens/${encodeURIComponent(t.id)}`, { method: "DELETE" });
    tokenMessage = h("p", { class: "ok", role: "status" }, `Token ${t.id} of ${who} revoked.`);
    if (created?.id === t.id) created = null;
  } catch (err) {
    tokenMessage = errorBox(err);
  }
  await loadTokens();
}

keepFresh(loadTenants, { filter: (e) => /^job\./.test(kind(e)), everyMs: 15_000 });
if (me.admin) loadTokens();
