// A terminal in a running job's replica (the job page's Terminal part): xterm.js (vendored: ../vendor/xterm/)
// over `WebSocket /v1/jobs/{id}/exec?tty=1`, the dashboard's session authenticating the upgrade. The protocol
// (docs/access.md): a first text frame {argv, size, stdin, term}; binary frames of data, their first byte the
// stream (0 what is typed, 1 the terminal's output); text frames of control: {"resize": [cols, rows]} from here,
// {"exit": code} or {"error": "..."} from the platform, which then closes.
import { FitAddon } from "../vendor/xterm/addon-fit.mjs";
import { Terminal } from "../vendor/xterm/xterm.mjs";

const STDIN = 0;
const encoder = new TextEncoder();

// xterm.js writes the CSS it computes (the cell size, the theme) into <style> elements, which this page's
// Content-Security-Policy refuses (styles come from the dashboard's own files only), even empty. It gets an
// inert <template> in place of each, whose text goes to a constructed stylesheet of the document instead,
// which the policy allows.
let adopting = false;
function adoptStyleElements() {
  if (adopting) return;
  adopting = true;
  const create = document.createElement.bind(document);
  document.createElement = (tag, options) => {
    if (String(tag).toLowerCase() !== "style") return create(tag, options);
    const el = create("template");
    const sheet = new CSSStyleSheet();
    document.adoptedStyleSheets = [...document.adoptedStyleSheets, sheet];
    Object.defineProperty(el, "textContent", { get: () => "", set: (text) => sheet.replaceSync(String(text ?? "")) });
    el.remove = () => {
      document.adoptedStyleSheets = document.adoptedStyleSheets.filter((s) => s !== sheet);
      Element.prototype.remove.call(el);
    };
    return el;
  };
}

function loadCss() {
  if (document.getElementById("xterm-css")) return;
  const link = document.createElement("link");
  link.id = "xterm-css";
  link.rel = "stylesheet";
  link.href = new URL("../vendor/xterm/xterm.css", import.meta.url).href;
  document.head.append(link);
}

// Open a terminal in `container` on replica `replica` of job `jobId`; `onEnd(text)` is called once it ends
// (the shell's exit, or why it could not start). Returns a function that closes it.
export function openTerminal(container, jobId, replica, onEnd) {
  adoptStyleElements();
  loadCss();
  const term = new Terminal({ cursorBlink: true, fontSize: 13, scrollback: 5000, convertEol: false });
  const fit = new FitAddon();
  term.loadAddon(fit);
  term.open(container);
  fit.fit();
  const scheme = location.protocol === "https:" ? "wss:" : "ws:";
  const query = new URLSearchParams({ replica: String(replica), tty: "1" });
  const ws = new WebSocket(`${scheme}//${location.host}/v1/jobs/${encodeURIComponent(jobId)}/exec?${query}`);
  ws.binaryType = "arraybuffer";
  let ended = false;
  const end = (text) => {
    if (ended) return;
    ended = true;
    onEnd(text);
  };
  const send = (bytes) => {
    if (ws.readyState !== WebSocket.OPEN) return;
    const frame = new Uint8Array(bytes.length + 1);
    frame[0] = STDIN;
    frame.set(bytes, 1);
    ws.send(frame);
  };
  ws.onopen = () => {
    ws.send(JSON.stringify({ argv: [], size: [term.cols, term.rows], stdin: true, term: "xterm-256color" }));
    term.focus();
  };
  ws.onmessage = (message) => {
    if (typeof message.data !== "string") {
      term.write(new Uint8Array(message.data).subarray(1));
      return;
    }
    const control = JSON.parse(message.data);
    if ("exit" in control) end(`The shell exited with code ${control.exit}.`);
    else if ("error" in control) end(control.error);
  };
  ws.onclose = (event) => end(event.code === 1000 || event.code === 1005 ? "The terminal closed." : `The terminal was closed (${event.code}): is the job still running?`);
  ws.onerror = () => end("The terminal could not connect: is the job still running?");
  term.onData((text) => send(encoder.encode(text)));
  term.onBinary((text) => send(Uint8Array.from(text, (c) => c.charCodeAt(0) & 0xff)));
  term.onResize(({ cols, rows }) => {
    if (ws.readyState === WebSocket.OPEN) ws.send(JSON.stringify({ resize: [cols, rows] }));
  });
  const observer = new ResizeObserver(() => fit.fit());
  observer.observe(container);
  return () => {
    observer.disconnect();
    ws.close();
    term.dispose();
  };
}
