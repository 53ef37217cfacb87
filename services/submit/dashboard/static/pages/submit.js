// Submit: a form for the common fields and a YAML editor for the whole spec. The YAML is what is submitted; the
// form writes into it. Each change is checked by the API itself (POST /v1/jobs/validate), so the page never
// holds a second copy of the rules, and the API's reason is shown in place.
import { api, describe, errorBox, fill, h, kind, onEvent, params, prose, section, throttle } from "../app.js";
import { SUBJECT, WILDCARD } from "../contracts.js";

const priorities = (params.priorities ?? "normal").split(",");
const START = {
  name: "hello",
  command: "echo hello from GPUYARD; sleep 5",
  resources: { gpus: 1, cpus: 1, memory: "2GB" },
  replicas: 1,
  priority: "normal",
};

// ---------------------------------------------------------------- YAML out (a spec is scalars, lists, maps)

function scalar(v) {
  if (typeof v === "number" || typeof v === "boolean") return String(v);
  return JSON.stringify(String(v)); // a JSON string is a YAML double-quoted scalar
}

function yaml(obj, indent = "") {
  const lines = [];
  for (const [k, v] of Object.entries(obj)) {
    if (v == null || v === "" || (typeof v === "object" && !Object.keys(v).length)) continue;
    if (Array.isArray(v)) lines.push(`${indent}${k}: [${v.map(scalar).join(", ")}]`);
    else if (typeof v === "object") lines.push(`${indent}${k}:`, yaml(v, `${indent}  `));
    else lines.push(`${indent}${k}: ${scalar(v)}`);
  }
  return lines.filter(Boolean).join("\n");
}

// ---------------------------------------------------------------- the page

const formEl = section("submit-form", "Common fields");
const editorEl = section("submit-yaml", "The whole spec (YAML)");
const f = {
  name: h("input", { id: "name", name: "name", placeholder: "my-training" }),
  command: h("input", { id: "command", name: "command", placeholder: "python train.py" }),
  gpus: h("input", { id: "gpus", name: "gpus", type: "number", min: 0, step: "any" }),
  replicas: h("input", { id: "replicas", name: "replicas", type: "number", min: 1, step: 1 }),
  cpus: h("input", { id: "cpus", name: "cpus", type: "number", min: 0, step: "any" }),
  memory: h("input", { id: "memory", name: "memory", placeholder: "16GB" }),
  priority: h("select", { id: "priority", name: "priority" }, priorities.map((p) => h("option", { value: p }, p))),
  timeout: h("input", { id: "timeout", name: "timeout", placeholder: "2h" }),
};
const field = (label, el, hint, span = null) =>
  h("div", { class: span }, h("label", { for: el.id }, label), el, hint ? h("div", { class: "hint" }, hint) : null);
fill(formEl, h("div", { class: "fields" },
  field("Name", f.name, null, "span-2"), field("Command", f.command, "Runs through /bin/sh -c.", "span-4"),
  field("GPUs per replica", f.gpus, "0.25 for a quarter of one"), field("Replicas", f.replicas), field("CPUs", f.cpus),
  field("Memory", f.memory), field("Priority", f.priority), field("Timeout", f.timeout),
));
const editor = h("textarea", { id: "spec", rows: 16, spellcheck: false, class: "mono", "aria-describedby": "verdict" });
const verdict = h("div", { id: "verdict", role: "status", "aria-live": "polite" });
const submitButton = h("button", { class: "primary", id: "submit", type: "button", onclick: submit }, "Submit");
const result = h("div", { id: "submit-result" });
fill(editorEl, editor, verdict, h("div", { class: "pager" }, submitButton, h("span", { class: "hint" },
  prose("The same spec as `gpuyard submit job.yaml`; the API checks it as you type."))), result);

function fromForm() {
  const spec = {
    name: f.name.value.trim(),
    command: f.command.value,
    resources: { gpus: num(f.gpus.value), cpus: num(f.cpus.value), memory: f.memory.value.trim() },
    replicas: num(f.replicas.value),
    priority: f.priority.value,
    timeout: f.timeout.value.trim(),
  };
  const extra = lastValid ? { ...lastValid } : {}; // fields the form does not show (env, working_dir…) stay
  for (const k of ["name", "command", "resources", "replicas", "priority", "timeout"]) delete extra[k];
  delete extra.tenant;
  editor.value = yaml({ ...spec, ...pick(extra, ["working_dir", "env", "max_retries"]) }) + "\n";
  check();
}

function num(text) {
  const n = Number(text);
  return text === "" || Number.isNaN(n) ? text : n;
}

function pick(obj, keys) {
  return Object.fromEntries(keys.filter((k) => obj[k] != null).map((k) => [k, obj[k]]));
}

function toForm(spec) {
  const active = document.activeElement;
  const set = (el, v) => el !== active && (el.value = v ?? "");
  set(f.name, spec.name);
  set(f.command, Array.isArray(spec.command) ? spec.command.join(" ") : spec.command);
  set(f.gpus, spec.resources?.gpus);
  set(f.replicas, spec.replicas);
  set(f.cpus, spec.resources?.cpus);
  set(f.memory, spec.resources?.memory);
  set(f.priority, spec.priority);
  set(f.timeout, spec.timeout);
}

let lastValid = null;
let checking = null;

async function check() {
  checking?.abort();
  checking = new AbortController();
  try {
    const answer = await api("/v1/jobs/validate", {
      method: "POST", body: editor.value, contentType: "application/yaml", signal: checking.signal,
    });
    lastValid = answer.spec;
    if (document.activeElement === editor) toForm(answer.spec);
    fill(verdict, h("p", { class: answer.placeable === false ? "error" : "ok" },
      answer.placeable === false ? answer.message : `✓ ${answer.message || "valid"}`));
  } catch (err) {
    if (err.name === "AbortError") return;
    lastValid = null;
    fill(verdict, errorBox(err.detail ? describe(err.detail) : err));
  }
}

async function submit() {
  submitButton.disabled = true;
  fill(result);
  try {
    const accepted = await api("/v1/jobs", { method: "POST", body: editor.value, contentType: "application/yaml" });
    location.assign(`/jobs/${encodeURIComponent(accepted.job_id)}`);
  } catch (err) {
    fill(result, errorBox(err));
    submitButton.disabled = false;
  }
}

const checkSoon = throttle(check, 350);
editor.addEventListener("input", checkSoon);
for (const el of Object.values(f)) el.addEventListener("input", throttle(fromForm, 350));
editor.value = yaml(START) + "\n";
toForm(START);
check();

// Live: whether a node could hold the spec changes when a node comes (its first heartbeat seen here), is lost,
// or changes health or cordon; the API's verdict is asked again then, and once the stream (re)opens.
const nodesSeen = new Set();
const recheck = throttle(check, 2000);
onEvent((e) => {
  const node = e.data?.node;
  if (kind(e) === SUBJECT.NODE_HEARTBEAT && nodesSeen.has(node)) return;
  nodesSeen.add(node);
  recheck();
}, WILDCARD.NODE, () => recheck());
