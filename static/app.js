// app.js — the page. It moves messages between the controls and the Python worker,
// and draws what the worker reports. No math here: Python does the work.
//
// Page -> worker: hello, load-model, load-data, train, pause, resume, stop, forget-models,
//                 generate, stop-generate, export, resume-checkpoint, discard-checkpoint, estimate.
// Worker -> page: boot, ready, fatal, log, defaults, hello, progress, model-info,
//                 data-info, train-state, micro, step, gen-token, generated, export, checkpoint, model-cache,
//                 estimate, error, gpu-error (each handled below; unknown types are reported).
// The source radios show what is loaded; Train uses it, and the worker loads the
// demo model and dataset itself when nothing else was chosen.
// Tests only: with ?test-hooks in the URL, window.bitloraTest lets a test run Python
// in the worker (to read logits, destroy the GPU device, or hold training as a chosen
// micro-batch starts: webapp.Hold) and read every message.
import uPlot from "/vendor/uplot/uPlot.esm.js";
import { PyWorker } from "./client.js";

const $ = (id) => document.getElementById(id);
const SETTINGS_KEY = "bitlora.settings.v1";

// ---------------------------------------------------------------- status, log
function setStatus(text, kind = "") {
  const el = $("status");
  el.textContent = text;
  el.className = kind;
}

function log(text, level = "info") {
  const el = $("log");
  const line = `[${new Date().toLocaleTimeString()}] ${text}\n`;
  el.append(document.createTextNode(line));
  if (el.childNodes.length > 2000) el.removeChild(el.firstChild);
  el.scrollTop = el.scrollHeight;
  if (level === "error") console.error(text);
}

function banner(text, action = null) {
  $("banner-text").textContent = text;
  const btn = $("banner-action");
  btn.hidden = !action;
  if (action) {
    btn.textContent = action.label;
    btn.onclick = () => { $("banner").hidden = true; action.run(); };
  }
  $("banner").hidden = false;
}
$("banner-close").onclick = () => { $("banner").hidden = true; };
document.addEventListener("keydown", (e) => { if (e.key === "Escape" && !$("banner").hidden) $("banner").hidden = true; });

function showError(where, text) {
  setStatus(`${where}: ${text}`, "error");
  log(`${where}: ${text}`, "error");
}

// ---------------------------------------------------------------- settings
let defaults = null;

function readSettings() {
  const form = $("settings");
  const out = {};
  for (const el of form.elements) {
    if (!el.name || el.name === "target") continue;
    if (el.type === "checkbox") out[el.name] = el.checked;
    else if (el.type === "number") out[el.name] = el.value === "" ? null : Number(el.value);
    else out[el.name] = el.value;
  }
  out.target_modules = [...form.querySelectorAll("input[name=target]:checked")].map((el) => el.value);
  return out;
}

function writeSettings(values) {
  const form = $("settings");
  for (const el of form.elements) {
    if (!el.name) continue;
    if (el.name === "target") el.checked = (values.target_modules || []).includes(el.value);
    else if (!(el.name in values)) continue;
    else if (el.type === "checkbox") el.checked = Boolean(values[el.name]);
    else el.value = values[el.name] ?? "";
  }
}

function saveSettings() {
  try { localStorage.setItem(SETTINGS_KEY, JSON.stringify(readSettings())); } catch { /* private mode */ }
}

$("settings").addEventListener("input", saveSettings);      // typed, then reloaded: kept
$("settings").addEventListener("change", () => { saveSettings(); requestEstimate(); });
$("memory-budget").addEventListener("change", requestEstimate);
$("reset-settings").onclick = () => { if (defaults) { writeSettings(defaults); saveSettings(); requestEstimate(); } };

// The page's other fields (hub URL, memory budget, URLs, prompt, generation options)
// survive a reload too: every input, textarea and select with an id outside the form,
// except file pickers and the source radios (those show what is loaded).
const FIELDS_KEY = "bitlora.fields.v1";
const keptFields = () => [...document.querySelectorAll("main input[id], main textarea[id], main select[id]")]
  .filter((el) => !el.closest("#settings") && el.type !== "file" && el.type !== "radio");

function saveFields() {
  const out = {};
  for (const el of keptFields()) out[el.id] = el.type === "checkbox" ? el.checked : el.value;
  try { localStorage.setItem(FIELDS_KEY, JSON.stringify(out)); } catch { /* private mode */ }
}

function restoreFields() {
  let saved = null;
  try { saved = JSON.parse(localStorage.getItem(FIELDS_KEY) || "null"); } catch { saved = null; }
  for (const el of keptFields()) {
    if (!saved || !(el.id in saved)) continue;
    if (el.type === "checkbox") el.checked = Boolean(saved[el.id]);
    else el.value = String(saved[el.id]);
  }
}
restoreFields();
for (const el of keptFields()) for (const ev of ["input", "change"]) el.addEventListener(ev, saveFields);

// ---------------------------------------------------------------- charts
const charts = {};
function makeChart(id, label, color, opts = {}) {
  const el = $(id);
  const width = Math.max(240, el.clientWidth || 320);
  const plot = new uPlot({
    width, height: 150,
    scales: { x: { time: false }, ...(opts.scales || {}) },
    axes: [{ label: opts.xLabel || "step" }, { size: 60 }],
    series: [{ label: opts.xLabel || "step" }, { label, stroke: color, width: 2, ...(opts.series || {}) }],
    legend: { show: false },
  }, [[], []], el);
  charts[id] = { plot, x: [], y: [] };
  return plot;
}

function pushPoint(id, x, y) {
  const c = charts[id];
  c.x.push(x); c.y.push(y);
}

let redrawQueued = false;
function redrawCharts() {
  if (redrawQueued) return;
  redrawQueued = true;
  requestAnimationFrame(() => {
    redrawQueued = false;
    for (const id of ["chart-loss", "chart-grad", "chart-lr", "chart-tps"]) {
      const c = charts[id];
      c.plot.setData([c.x, c.y]);
      // what the chart shows, readable without pixels (assistive tech, tests)
      const el = $(id);
      el.dataset.points = String(c.y.length);
      el.dataset.first = c.y.length ? String(c.y[0]) : "";
      el.dataset.last = c.y.length ? String(c.y[c.y.length - 1]) : "";
      el.setAttribute("aria-label", c.y.length ? `${c.y.length} points, first ${Number(c.y[0]).toPrecision(4)}, `
        + `last ${Number(c.y[c.y.length - 1]).toPrecision(4)}` : "no data yet");
    }
  });
}

function resetCharts(points = []) {
  for (const id of ["chart-loss", "chart-grad", "chart-lr", "chart-tps"]) { charts[id].x = []; charts[id].y = []; }
  for (const p of points) addStepPoint(p);
  redrawCharts();
}

function addStepPoint(m) {
  pushPoint("chart-loss", m.step, m.loss);
  pushPoint("chart-grad", m.step, m.grad_norm);
  pushPoint("chart-lr", m.step, m.lr);
  pushPoint("chart-tps", m.step, m.tokens_per_s);
}

let histPlot = null;
function drawHistogram(hist) {
  const el = $("length-hist");
  if (histPlot) histPlot.destroy();
  histPlot = new uPlot({
    width: Math.max(240, el.clientWidth || 320), height: 160,
    scales: { x: { time: false } },
    axes: [{ label: "tokens per record" }, { label: "records", size: 50 }],
    series: [{}, { label: "records", fill: "rgba(59,110,245,0.5)", stroke: "#3b6ef5",
                   paths: uPlot.paths.bars({ size: [0.9, 100] }) }],
    legend: { show: false },
  }, [hist.edges, hist.counts], el);
}

// ---------------------------------------------------------------- model & data
function renderKV(dl, pairs) {
  dl.replaceChildren();
  for (const [k, v] of pairs) {
    const dt = document.createElement("dt"); dt.textContent = k;
    const dd = document.createElement("dd"); dd.textContent = String(v);
    dl.append(dt, dd);
  }
}

function renderPreview(records) {
  const table = $("data-preview");
  table.replaceChildren();
  const cols = ["#", "instruction", "input", "output"];
  const head = table.createTHead().insertRow();
  for (const c of cols) { const th = document.createElement("th"); th.textContent = c; th.scope = "col"; head.append(th); }
  const body = table.createTBody();
  records.forEach((r, i) => {
    const row = body.insertRow();
    for (const c of cols) row.insertCell().textContent = c === "#" ? String(r.index ?? i) : String(r[c] ?? "");
  });
}

function renderInvalid(invalid) {
  const box = $("invalid-records");
  const list = $("invalid-list");
  list.replaceChildren();
  box.hidden = invalid.length === 0;
  for (const item of invalid.slice(0, 500)) {
    const li = document.createElement("li");
    li.textContent = `record ${item.index}: ${item.reason}`;
    list.append(li);
  }
  box.querySelector("summary").textContent = `Invalid records (${invalid.length}, skipped)`;
}

let modelReady = false;
let dataReady = true;          // the demo dataset, loaded by Train if nothing else is
let gpuOk = false;
let loading = "";              // "model" / "data" while one loads
let trainState = "idle";
let hasAdapter = false;
let generating = false;        // a Generate is streaming its answers
// what Train uses: the loaded model and dataset, else the demo ones (the radios show it)
const loaded = { model: { source: "demo", name: "" }, data: { source: "demo", name: "" } };

function updateButtons() {
  const busy = ["running", "paused", "starting", "stopping"].includes(trainState);
  $("train").disabled = !gpuOk || !dataReady || busy || loading !== "" || generating;
  $("pause").disabled = trainState !== "running";
  $("resume").disabled = trainState !== "paused";
  $("stop").disabled = !busy || trainState === "stopping";
  $("generate").disabled = !modelReady || busy || generating;
  $("gen-stop").hidden = !generating;
  $("export").disabled = !hasAdapter;
  $("export-why").hidden = hasAdapter;
  for (const id of ["load-demo-model", "model-file", "model-folder", "model-url-load",
                    "load-demo-data", "data-file", "data-url-load"]) $(id).disabled = busy;
  for (const el of document.querySelectorAll("input[name=model-source], input[name=data-source]")) el.disabled = busy;
}

// The radios always show what is loaded (or, before anything is, the demo that Train loads).
function syncRadios() {
  for (const what of ["model", "data"]) {
    for (const el of document.querySelectorAll(`input[name=${what}-source]`)) el.checked = el.value === loaded[what].source;
  }
}

// What the page is doing is said by whoever starts it; this says what the user can do next.
function readyStatus(prefix = "") {
  if (!gpuOk) return;
  const m = loaded.model.name || "the demo model", d = loaded.data.name || "the demo dataset";
  setStatus(`${prefix}Ready: press Train to finetune ${m} on ${d}, or choose another model or dataset first.`);
}

function loadModel(msg) {
  modelReady = false; loading = "model"; updateButtons();
  $("model-progress").hidden = false;
  $("model-progress").value = 0;
  $("model-progress-text").textContent = "";
  $("model-progress-text").className = "muted";
  setStatus(`Loading the model ${msg.name || msg.url || "(demo)"}…`);
  py.send({ type: "load-model", ...msg });
}

function loadData(msg) {
  loading = "data"; updateButtons();
  setStatus(`Loading the dataset ${msg.name || msg.url || "(demo)"}…`);
  py.send({ type: "load-data", ...msg });
}

$("load-demo-model").onclick = () => loadModel({ source: "demo" });
$("model-file").onchange = (e) => { const f = e.target.files[0]; if (f) loadModel({ source: "file", file: f, name: f.name }); };
$("model-folder").onchange = (e) => {
  const files = [...e.target.files];
  const paths = files.map((f) => f.webkitRelativePath || f.name);
  if (files.length) loadModel({ source: "folder", files, names: paths, folder: paths[0].includes("/") ? paths[0].split("/")[0] : "" });
};
$("model-url-load").onclick = () => {
  const url = $("model-url").value.trim();
  if (url) loadModel({ source: "url", url, hub: $("hub-url").value.trim() });
};
$("forget-models").onclick = () => py.send({ type: "forget-models" });
$("load-demo-data").onclick = () => loadData({ source: "demo" });
$("data-file").onchange = (e) => { const f = e.target.files[0]; if (f) loadData({ source: "file", file: f, name: f.name }); };
$("data-url-load").onclick = () => { const url = $("data-url").value.trim(); if (url) loadData({ source: "url", url }); };

// Choosing a radio switches the source and nothing more: the demo loads (it needs nothing
// else); a file, folder or URL waits for its own control, and the status says which. Arrow
// keys check each radio they pass, so a radio that opened a file chooser or moved the focus
// would do that to a keyboard user only passing through (it did). What is loaded shows
// beside the model and dataset; after a load (or a failed one) the radios show it again.
const SOURCE_HINTS = {
  "model/file": "Model source: a file. Choose the .gguf with Model file",
  "model/folder": "Model source: a folder. Choose a Hugging Face model folder with Model folder",
  "model/url": "Model source: a URL. Type a repo id or URL into Model URL and press Enter or Load URL",
  "data/file": "Dataset source: a file. Choose the JSON or JSONL file with Dataset file",
  "data/url": "Dataset source: a URL. Type it into Dataset URL and press Enter or Load URL",
};
for (const what of ["model", "data"]) {
  for (const el of document.querySelectorAll(`input[name=${what}-source]`)) {
    el.addEventListener("change", () => {
      const v = el.value;
      if (v === "demo") {
        if (loaded[what].source !== "demo") (what === "model" ? loadModel : loadData)({ source: "demo" });
        return;
      }
      const now = loaded[what].name || (what === "model" ? "the demo model" : "the demo dataset");
      setStatus(`${SOURCE_HINTS[`${what}/${v}`]}; until it loads, Train uses ${now}.`);
    });
  }
}
$("model-url").addEventListener("keydown", (e) => { if (e.key === "Enter") $("model-url-load").click(); });
$("data-url").addEventListener("keydown", (e) => { if (e.key === "Enter") $("data-url-load").click(); });

const budgetMB = () => Number($("memory-budget").value) || null;

function requestEstimate() {
  if (modelReady) py.send({ type: "estimate", config: readSettings(), budget_mb: budgetMB() });
}

let proposal = null;
$("fit").onclick = () => {
  if (!proposal) return;
  writeSettings({ ...readSettings(), ...proposal });
  saveSettings(); requestEstimate();
  log(`settings fitted to the device: ${JSON.stringify(proposal)}`);
};

// ---------------------------------------------------------------- training
// Progress within a step: the worker reports each micro-batch; a clock ticks between them.
let trainStart = 0, stepStart = 0, micro = null;
function showDetail() {
  const el = $("train-detail");
  const busy = ["running", "starting", "stopping"].includes(trainState);
  if (!busy) return;
  const since = (t) => `${Math.floor((performance.now() - t) / 1000)} s`;
  if (!micro) { el.textContent = `Preparing: ${since(trainStart)} since Train was pressed.`; return; }
  el.textContent = `Step ${micro.step} of ${micro.total_steps}: micro-batch ${Math.min(micro.micro + 1, micro.micros)} `
    + `of ${micro.micros}${micro.micro >= micro.micros ? " done, updating" : ""} · ${micro.tokens} of ${micro.step_tokens} `
    + `tokens done · ${since(stepStart)} since the step began.`;
}
setInterval(showDetail, 500);

$("train").onclick = () => {
  saveSettings();
  trainState = "starting"; hasAdapter = false; updateButtons();
  resetCharts();
  skippedSeen = 0; showSkipped(0);
  trainStart = performance.now(); micro = null;
  setStatus("Starting training…");
  showDetail();
  py.send({ type: "train", config: readSettings(), budget_mb: budgetMB() });
};
$("pause").onclick = () => py.send({ type: "pause" });
$("resume").onclick = () => py.send({ type: "resume" });
$("stop").onclick = () => py.send({ type: "stop" });
$("export").onclick = () => py.send({ type: "export" });
$("generate").onclick = () => {
  $("gen-base").textContent = "…"; $("gen-adapted").textContent = hasAdapter ? "…" : "";
  $("gen-base-speed").textContent = ""; $("gen-adapted-speed").textContent = "";
  generating = true; updateButtons();
  setStatus("Generating…");
  py.send({ type: "generate", instruction: $("prompt").value, input: $("prompt-input").value,
            max_new_tokens: Number($("max-new-tokens").value), temperature: Number($("temperature").value) });
};
$("gen-stop").onclick = () => py.send({ type: "stop-generate" });

function genSpeed(tokens, tps) {
  return tps ? `· ${tokens} tokens, ${tps.toFixed(1)} tokens/s` : `· ${tokens} tokens`;
}

function download(name, bytes) {
  const url = URL.createObjectURL(new Blob([bytes]));
  const a = document.createElement("a");
  a.href = url; a.download = name;
  document.body.append(a); a.click(); a.remove();
  setTimeout(() => URL.revokeObjectURL(url), 10000);
}

// NaN/Inf arrive as null (a skipped step): shown as such, drawn as a gap
const fmtNum = (x, digits) => (x === null || x === undefined ? "NaN/Inf" : x.toFixed(digits));

let skippedSeen = 0;
function showSkipped(n) {
  const el = $("skipped-steps");
  el.textContent = `Skipped steps (NaN/Inf gradients): ${n}`;
  el.className = n ? "warning" : "muted";
}

// When a checkpoint was saved, in the user's time zone and as an age ("3 min ago").
function savedWhen(m) {
  if (typeof m.saved_unix !== "number") return m.saved_at || "at an unknown time";   // an older session.json
  const age = Math.max(0, Date.now() / 1000 - m.saved_unix);
  const ago = age < 60 ? "just now" : age < 3600 ? `${Math.floor(age / 60)} min ago`
    : age < 86400 ? `${Math.floor(age / 3600)} h ago` : `${Math.floor(age / 86400)} days ago`;
  return `${new Date(m.saved_unix * 1000).toLocaleString()} (${ago})`;
}

function fmtTime(s) {
  if (!isFinite(s) || s < 0) return "—";
  const m = Math.floor(s / 60), sec = Math.round(s % 60);
  return m ? `${m} min ${sec} s` : `${sec} s`;
}

// ---------------------------------------------------------------- worker messages
const handlers = {
  boot: (m) => setStatus(m.text),
  ready: (m) => {
    setStatus(`Python ready (bitlora ${m.version}). Checking the GPU…`);
    py.send({ type: "hello", n: 8 });
  },
  fatal: (m) => showError("Start-up failed", m.text),
  log: (m) => log(m.text, m.level),
  result: () => {},
  defaults: (m) => {
    defaults = m.config;
    let saved = null;
    try { saved = JSON.parse(localStorage.getItem(SETTINGS_KEY) || "null"); } catch { saved = null; }
    writeSettings({ ...defaults, ...(saved || {}) });
  },
  hello: (m) => {
    renderKV($("gpu-info"), [["GPU adapter", m.adapter],
      ["Max storage binding", `${(m.limits.maxStorageBufferBindingSize / 2 ** 20).toFixed(0)} MiB`],
      ["Max buffer", `${(m.limits.maxBufferSize / 2 ** 20).toFixed(0)} MiB`],
      ["Storage buffers per stage", m.limits.maxStorageBuffersPerShaderStage]]);
    $("kernel-result").textContent = `x = [${m.x.join(", ")}]  y = [${m.y.join(", ")}]`;
    gpuOk = true;
    updateButtons();
    readyStatus("WebGPU works: the kernel ran in the worker. ");
  },
  "gpu-error": (m) => {
    showError("WebGPU", m.text);
    banner(m.text);
  },
  progress: (m) => {
    const bar = $(m.what === "model" ? "model-progress" : "train-progress");
    if (m.what === "model") {
      bar.hidden = false;
      bar.max = m.total || 1; bar.value = m.done;
      const mb = (x) => (x / 2 ** 20).toFixed(1);
      $("model-progress-text").textContent = m.total
        ? `${mb(m.done)} / ${mb(m.total)} MB (${((100 * m.done) / m.total).toFixed(0)} %) ${m.text || ""}` : (m.text || "");
    }
  },
  "model-info": (m) => {
    modelReady = true; loading = "";
    loaded.model = { source: m.source, name: m.name };
    syncRadios();
    renderKV($("model-info"), m.rows);
    $("model-progress-text").textContent = "Loaded.";
    if (trainState === "idle" || trainState === "done" || trainState === "stopped" || trainState === "failed") {
      setStatus(`Model loaded: ${m.name}. Press Train to finetune it on ${loaded.data.name || "the demo dataset"}.`);
    }
    log(`model loaded: ${m.name}`);
    updateButtons();
    requestEstimate();
  },
  "data-info": (m) => {
    const asked = loading === "data";      // not the re-count after a model load
    loading = "";
    loaded.data = { source: m.source, name: m.name };
    syncRadios();
    dataReady = m.valid > 0;
    $("data-summary").textContent = `${m.name}: ${m.total} records, ${m.valid} usable, ${m.invalid.length} invalid.`;
    renderPreview(m.preview);
    renderInvalid(m.invalid);
    if (m.histogram) drawHistogram(m.histogram);
    if (asked) {
      setStatus(m.valid > 0 ? `Dataset loaded: ${m.valid} usable records. Press Train to finetune `
                              + `${loaded.model.name || "the demo model"} on it.`
                            : "The dataset has no usable records: choose another file or the demo dataset.",
                m.valid > 0 ? "" : "error");
    }
    updateButtons();
  },
  estimate: (m) => {
    const el = $("memory-estimate");
    el.textContent = m.text;
    el.className = m.fits ? "muted" : "warning";
    proposal = m.proposal;
    $("fit").hidden = !proposal;
  },
  "train-state": (m) => {
    trainState = m.state;
    if (m.has_adapter !== undefined) hasAdapter = m.has_adapter;
    updateButtons();
    const words = { running: "Training: Pause or Stop at any time; Export adapter as soon as step 1 is done.",
                    paused: "Paused: Resume, or Stop.", stopped: "Stopped: press Train to start again.",
                    done: "Training finished.", failed: "Training failed: see the log, then press Train to try again.",
                    starting: "Preparing training…", stopping: "Stopping after the current micro-batch…" };
    if (m.state === "idle" && !m.text) readyStatus();
    else setStatus(m.text || words[m.state] || m.state, m.state === "failed" ? "error" : "");
    if (!["running", "starting", "stopping"].includes(m.state)) $("train-detail").textContent = "";
    if (m.history) {
      resetCharts(m.history);
      skippedSeen = m.history.length ? m.history[m.history.length - 1].skipped || 0 : 0;
      showSkipped(skippedSeen);
    }
  },
  micro: (m) => {
    if (m.micro === 0) stepStart = performance.now();
    micro = m;
    showDetail();
    const bar = $("train-progress");
    bar.max = m.total_steps; bar.value = m.step - 1 + m.micro / m.micros;
  },
  step: (m) => {
    if (!hasAdapter) { hasAdapter = true; updateButtons(); }
    addStepPoint(m);
    redrawCharts();
    const bar = $("train-progress");
    bar.max = m.total_steps; bar.value = m.step;
    $("train-progress-text").textContent =
      `step ${m.step} / ${m.total_steps} · loss ${fmtNum(m.loss, 4)} · ETA ${fmtTime(m.eta_s)}`;
    showSkipped(m.skipped);
    if (m.skipped > skippedSeen) log(`step ${m.step}: non-finite (NaN/Inf) gradients, step skipped (${m.skipped} so far)`, "error");
    skippedSeen = m.skipped;
    if (m.step % 10 === 0 || m.step === 1) {
      log(`step ${m.step}: loss ${fmtNum(m.loss, 4)}, grad norm ${fmtNum(m.grad_norm, 3)}, lr ${m.lr.toExponential(2)}, ${m.tokens_per_s.toFixed(0)} tok/s`);
    }
  },
  "model-cache": (m) => { $("model-cache").textContent = m.text; setStatus(m.text); },
  "gen-token": (m) => {
    $(`gen-${m.which}`).textContent = m.text;
    $(`gen-${m.which}-speed`).textContent = genSpeed(m.tokens, m.tokens_per_s);
  },
  generated: (m) => {
    generating = false; updateButtons();
    $("gen-base").textContent = m.base;
    $("gen-base-speed").textContent = genSpeed(m.base_tokens, m.base_tokens_per_s);
    $("gen-adapted").textContent = m.adapted ?? (m.stopped ? "" : "(no adapter yet: train first)");
    $("gen-adapted-speed").textContent = m.adapted == null ? "" : genSpeed(m.adapted_tokens, m.adapted_tokens_per_s);
    if (m.warning) log(`generate: ${m.warning}`, "error");
    setStatus(m.stopped ? "Generation stopped." : m.warning ? `Generated, but ${m.warning}.`
      : "Generated: change the instruction and Generate again, or train further.", m.warning ? "warning" : "");
  },
  export: (m) => {
    for (const f of m.files) download(f.name, f.bytes);
    log(`exported the adapter of step ${m.step}: ${m.files.map((f) => f.name).join(", ")}`);
    if (!["running", "starting", "stopping"].includes(trainState)) setStatus(`Exported the adapter of step ${m.step}.`);
  },
  checkpoint: (m) => {
    if (m.available) {
      banner(`${m.reason ? m.reason + " " : ""}A training checkpoint is in this browser's storage: `
             + `${m.model || "a model"} on ${m.data || "a dataset"}, step ${m.step} of ${m.total_steps}, `
             + `saved ${savedWhen(m)}.`,
             { label: "Resume training", run: () => { trainState = "starting"; updateButtons(); py.send({ type: "resume-checkpoint" }); } });
    } else if (m.saved) {
      log(`checkpoint saved at step ${m.step}${m.seconds != null ? ` (${m.seconds.toFixed(2)} s)` : ""}`);
    } else if (m.saved === false) {
      log(m.text, "error");
      banner(m.text);
    }
  },
  error: (m) => {
    showError(m.where || "Error", m.text);
    if (m.where === "model") {         // said beside the model too; the model loaded before stays
      $("model-progress").hidden = true;
      $("model-progress-text").textContent = `Not loaded: ${m.text}`;
      $("model-progress-text").className = "warning";
      modelReady = loaded.model.name !== "";
    }
    if (m.where === "model" || m.where === "dataset" || m.where === "data") { loading = ""; syncRadios(); }
    if (m.where === "generate") {
      generating = false;
      for (const id of ["gen-base", "gen-adapted"]) if ($(id).textContent === "…") $(id).textContent = "";
    }
    updateButtons();
  },
};

const testHooks = new URLSearchParams(location.search).has("test-hooks");
const seen = [];
const py = new PyWorker((msg) => {
  if (testHooks) seen.push(msg);
  const handler = handlers[msg.type];
  if (handler) handler(msg);
  else log(`unknown message from the worker: ${String(msg.type)}`, "error");
});
py.ready.catch((err) => showError("Start-up failed", err.message));
if (testHooks) window.bitloraTest = { run: (code, ms) => py.run(code, ms), messages: seen };

makeChart("chart-loss", "loss", "#d9480f");
makeChart("chart-grad", "grad norm", "#5f3dc4");
makeChart("chart-lr", "lr", "#2b8a3e");
makeChart("chart-tps", "tokens/s", "#1864ab");
updateButtons();
