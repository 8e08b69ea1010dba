// anycore's built-in page: chat over the OpenAI routes, the engine's live state from /v1/engine,
// and `anycore bench compare` results. Plain modern JS, no build step, no outside requests.
"use strict";

const $ = (id) => document.getElementById(id);
const STORE = { convs: "anycore.conversations", current: "anycore.current", settings: "anycore.settings",
                key: "anycore.apiKey" };
const SETTINGS = ["mode", "system", "temperature", "top_p", "top_k", "max_tokens", "seed", "json_mode", "ignore_eos"];

let conversations = [];   // [{id, title, created, messages: [{role, content, stats?}]}]
let current = null;       // the open conversation
let inFlight = null;      // {controller} while an answer streams
let modelName = null;     // from /v1/engine (requests name it so a renamed server still answers)

// ---- small helpers ------------------------------------------------------------------------
function load(key, fallback) {
  try { const v = localStorage.getItem(key); return v === null ? fallback : JSON.parse(v); }
  catch { return fallback; }
}
function save(key, value) { localStorage.setItem(key, JSON.stringify(value)); }
function el(tag, props = {}, ...children) {
  const e = document.createElement(tag);
  for (const [k, v] of Object.entries(props)) {
    if (k === "dataset") Object.assign(e.dataset, v);
    else if (k in e) e[k] = v;
    else e.setAttribute(k, v);
  }
  for (const c of children) e.append(c);
  return e;
}
function fmt(x, digits = 1) { return x === null || x === undefined || Number.isNaN(x) ? "–" : Number(x).toFixed(digits); }
function pct(x) { return x === null || x === undefined ? "–" : `${(100 * x).toFixed(1)}%`; }

// ---- API access: Bearer key from localStorage, asked for on 401 ----------------------------
class ApiError extends Error {
  constructor(status, body) {
    const e = body && body.error;
    const msg = e && e.message ? e.message : `HTTP ${status}`;
    super(e && e.param ? `${msg} (param: ${e.param})` : msg);
    this.status = status;
    this.body = body;
  }
}

// one key dialog at a time: every call that got a 401 meanwhile waits on the same answer
let keyPrompt = null;
let keyDeclined = false;  // the person cancelled: background polls stop asking (sending still asks)
function askKey(reason) {
  if (keyPrompt) return keyPrompt;
  const dialog = $("key-dialog");
  $("key-reason").textContent = reason;
  $("api-key").value = load(STORE.key, "") || "";
  keyPrompt = new Promise((resolve) => {
    dialog.addEventListener("close", () => {
      keyPrompt = null;
      const saved = dialog.returnValue === "save";
      if (saved) save(STORE.key, $("api-key").value.trim());
      keyDeclined = !saved;
      resolve(saved);
    }, { once: true });
    dialog.returnValue = "";
    dialog.showModal();
    $("api-key").focus();
  });
  return keyPrompt;
}

// fetch with the key; on 401 asks for a key and retries; non-2xx answers throw ApiError with
// the server's OpenAI error message
async function api(path, options = {}, background = false) {
  for (;;) {
    const key = load(STORE.key, "");
    const headers = { ...(options.headers || {}) };
    if (key) headers.Authorization = `Bearer ${key}`;
    const r = await fetch(path, { ...options, headers });
    if (r.status === 401) {
      const body = await r.json().catch(() => null);
      const why = (body && body.error && body.error.message) || "The server needs an API key.";
      if (!(background && keyDeclined) && await askKey(why)) continue;
      throw new ApiError(401, body);
    }
    if (!r.ok) throw new ApiError(r.status, await r.json().catch(() => null));
    return r;
  }
}

// ---- conversations (localStorage) ----------------------------------------------------------
function persist() {
  save(STORE.convs, conversations);
  save(STORE.current, current ? current.id : null);
}
function newConversation() {
  const c = { id: `c${Date.now().toString(36)}${Math.random().toString(36).slice(2, 6)}`, title: "New conversation",
              created: Date.now(), messages: [] };
  conversations.unshift(c);
  current = c;
  persist();
  renderConversations();
  renderMessages();
}
function openConversation(id) {
  if (inFlight) return;
  current = conversations.find((c) => c.id === id) || null;
  persist();
  renderConversations();
  renderMessages();
}
function deleteConversation(id) {
  if (inFlight && current && current.id === id) return;
  conversations = conversations.filter((c) => c.id !== id);
  if (!current || current.id === id) current = conversations[0] || null;
  if (!current) newConversation(); else { persist(); renderConversations(); renderMessages(); }
}
function renderConversations() {
  const list = $("conv-list");
  list.replaceChildren(...conversations.map((c) => el("li", { "aria-current": String(c === current) },
    el("button", { type: "button", className: "open", textContent: c.title, title: c.title,
                   onclick: () => openConversation(c.id) }),
    el("button", { type: "button", className: "delete", textContent: "×", title: `Delete “${c.title}”`,
                   "aria-label": `Delete conversation ${c.title}`, onclick: () => deleteConversation(c.id) }))));
}

// ---- messages -----------------------------------------------------------------------------
const ROLE_LABEL = { user: "you", assistant: "assistant", prompt: "prompt", completion: "completion", error: "error" };

function statsText(s) {
  if (!s) return "";
  const parts = [];
  if (s.ttft_ms !== undefined) parts.push(`TTFT ${fmt(s.ttft_ms, 0)} ms`);
  if (s.tokens_per_s) parts.push(`${fmt(s.tokens_per_s)} tok/s`);
  if (s.tokens !== undefined) parts.push(`${s.tokens} tokens`);
  if (s.finish) parts.push(s.finish);
  return parts.join(" · ");
}

function messageView(m, index) {
  const content = el("div", { className: "content", textContent: m.content });
  const meta = el("div", { className: "meta" });
  const node = el("article", { className: "msg", dataset: { role: m.role, index: String(index) } },
                  el("div", { className: "who", textContent: ROLE_LABEL[m.role] || m.role }), content, meta);
  fillMeta(node, m);
  return node;
}

function fillMeta(node, m) {
  const meta = node.querySelector(".meta");
  const items = [];
  if (m.stats) items.push(el("span", { className: "stats", textContent: statsText(m.stats) }));
  if (m.role !== "error") {
    items.push(el("button", { type: "button", className: "quiet copy", textContent: "Copy",
                              onclick: (ev) => copyText(m.content, ev.target) }));
  }
  const last = current && current.messages[current.messages.length - 1] === m;
  if (last && (m.role === "assistant" || m.role === "completion")) {
    items.push(el("button", { type: "button", className: "quiet regenerate", textContent: "Regenerate",
                              onclick: regenerate }));
  }
  meta.replaceChildren(...items);
}

function renderMessages() {
  const box = $("messages");
  box.replaceChildren(...(current ? current.messages.map(messageView) : []));
  box.scrollTop = box.scrollHeight;
}

async function copyText(text, button) {
  try { await navigator.clipboard.writeText(text); }
  catch {  // no clipboard permission: a hidden textarea and the old copy command
    const t = el("textarea", { value: text });
    document.body.append(t); t.select(); document.execCommand("copy"); t.remove();
  }
  button.textContent = "Copied";
  setTimeout(() => { button.textContent = "Copy"; }, 1200);
}

function showError(err) {
  const box = $("messages");
  box.append(el("div", { className: "msg", role: "alert", dataset: { role: "error" } },
                el("div", { className: "who", textContent: "error" }),
                el("div", { className: "content", textContent: err.message || String(err) })));
  box.scrollTop = box.scrollHeight;
}

// ---- sending ------------------------------------------------------------------------------
function settings() {
  const num = (id) => { const v = $(id).value.trim(); return v === "" ? null : Number(v); };
  return { mode: $("mode").value, system: $("system").value, temperature: num("temperature"), top_p: num("top_p"),
           top_k: num("top_k"), max_tokens: num("max_tokens"), seed: num("seed"),
           json_mode: $("json_mode").checked, ignore_eos: $("ignore_eos").checked };
}

function requestBody(s, conv) {
  const body = { stream: true, stream_options: { include_usage: true } };
  if (modelName) body.model = modelName;
  if (s.temperature !== null) body.temperature = s.temperature;
  if (s.top_p !== null) body.top_p = s.top_p;
  if (s.top_k) body.top_k = s.top_k;
  if (s.max_tokens !== null) body.max_tokens = s.max_tokens;
  if (s.seed !== null) body.seed = s.seed;
  if (s.ignore_eos) body.ignore_eos = true;
  if (s.json_mode) body.response_format = { type: "json_object" };
  if (s.mode === "completion") {
    const prompts = conv.messages.filter((m) => m.role === "prompt");
    body.prompt = prompts[prompts.length - 1].content;
  } else {
    body.messages = [];
    if (s.system.trim()) body.messages.push({ role: "system", content: s.system });
    for (const m of conv.messages) {
      if (m.role === "user" || m.role === "assistant") body.messages.push({ role: m.role, content: m.content });
    }
  }
  return body;
}

function setBusy(busy) {
  $("send").disabled = busy;
  $("stop").disabled = !busy;
}

// reads an SSE body: calls onEvent with each parsed `data:` JSON until [DONE]
async function readEvents(response, onEvent) {
  const reader = response.body.getReader();
  const decoder = new TextDecoder();
  let buffer = "";
  for (;;) {
    const { value, done } = await reader.read();
    if (done) return;
    buffer += decoder.decode(value, { stream: true });
    let cut;
    while ((cut = buffer.indexOf("\n\n")) >= 0) {
      const event = buffer.slice(0, cut);
      buffer = buffer.slice(cut + 2);
      for (const line of event.split("\n")) {
        if (!line.startsWith("data:")) continue;
        const data = line.slice(5).trim();
        if (data === "[DONE]") return;
        onEvent(JSON.parse(data));
      }
    }
  }
}

async function generate() {
  const s = settings();
  const conv = current;
  const role = s.mode === "completion" ? "completion" : "assistant";
  const path = s.mode === "completion" ? "/v1/completions" : "/v1/chat/completions";
  const body = requestBody(s, conv);
  const answer = { role, content: "", stats: {} };
  const controller = new AbortController();
  inFlight = { controller };
  setBusy(true);
  const t0 = performance.now();
  let tFirst = null, tLast = null, chunks = 0, usage = null, finish = null;
  let node = null;
  try {
    const r = await api(path, { method: "POST", headers: { "Content-Type": "application/json" },
                                body: JSON.stringify(body), signal: controller.signal });
    conv.messages.push(answer);
    renderMessages();
    node = $("messages").lastElementChild;
    const contentNode = node.querySelector(".content");
    await readEvents(r, (ev) => {
      if (ev.error) throw new ApiError(0, ev);
      if (ev.usage) usage = ev.usage;
      for (const choice of ev.choices || []) {
        const piece = role === "completion" ? choice.text : (choice.delta && choice.delta.content);
        if (piece) {
          const now = performance.now();
          if (tFirst === null) tFirst = now;
          tLast = now;
          chunks += 1;
          answer.content += piece;
          contentNode.textContent = answer.content;
        }
        if (choice.finish_reason) finish = choice.finish_reason;
      }
      answer.stats = liveStats(t0, tFirst, tLast, usage ? usage.completion_tokens : chunks, finish);
      $("messages").scrollTop = $("messages").scrollHeight;
    });
  } catch (err) {
    if (err.name === "AbortError") finish = "stopped";
    else showError(err);
  } finally {
    inFlight = null;
    setBusy(false);
    if (conv.messages.includes(answer)) {
      answer.stats = liveStats(t0, tFirst, tLast, usage ? usage.completion_tokens : chunks, finish);
      if (node) fillMeta(node, answer);
    }
    persist();
    pollEngine();  // the readout shows the request gone at once, not at the next poll
  }
}

// TTFT from sending to the first text; speed over the tokens after the first (the decode rate)
function liveStats(t0, tFirst, tLast, tokens, finish) {
  const stats = { tokens };
  if (tFirst !== null) stats.ttft_ms = tFirst - t0;
  if (tokens > 1 && tLast > tFirst) stats.tokens_per_s = (tokens - 1) / ((tLast - tFirst) / 1000);
  if (finish) stats.finish = finish;
  $("stat-ttft").textContent = stats.ttft_ms !== undefined ? `${fmt(stats.ttft_ms, 0)} ms` : "–";
  $("stat-tps").textContent = stats.tokens_per_s ? `${fmt(stats.tokens_per_s)} tok/s` : "–";
  $("stat-tokens").textContent = String(tokens);
  return stats;
}

function send() {
  const text = $("prompt").value;
  if (inFlight || !text.trim()) return;
  if (!current) newConversation();
  const mode = $("mode").value;
  current.messages.push({ role: mode === "completion" ? "prompt" : "user", content: text });
  if (current.title === "New conversation") current.title = text.trim().slice(0, 48);
  $("prompt").value = "";
  persist();
  renderConversations();
  renderMessages();
  generate();
}

function regenerate() {
  if (inFlight || !current) return;
  const last = current.messages[current.messages.length - 1];
  if (last && (last.role === "assistant" || last.role === "completion")) current.messages.pop();
  const before = current.messages[current.messages.length - 1];
  if (!before || (before.role !== "user" && before.role !== "prompt")) return;
  $("mode").value = before.role === "prompt" ? "completion" : "chat";
  storeSettings();
  persist();
  renderMessages();
  generate();
}

function stop() { if (inFlight) inFlight.controller.abort(); }

// ---- live engine readout (/v1/engine) -----------------------------------------------------
let lastInfo = null;
let polling = false;  // one poll at a time: a slow answer never piles up requests
async function pollEngine() {
  if (document.hidden || polling) return;
  polling = true;
  try {
    const info = await (await api("/v1/engine", {}, true)).json();
    lastInfo = info;
    modelName = info.model;
    renderEngine(info);
  } catch (err) {
    $("engine-model").textContent = `engine: ${err.message}`;
  } finally {
    polling = false;
  }
}

function renderEngine(info) {
  const q = info.quantization ? `, ${info.quantization}` : "";
  $("engine-model").textContent = info.state === "ready" ? `${info.model} (${info.dtype}${q})` : `${info.model}: ${info.state}`;
  $("engine-running").textContent = String(info.requests.running);
  $("engine-waiting").textContent = String(info.requests.waiting);
  $("engine-kv").textContent = `${pct(info.kv.usage)} of ${info.kv.slots_total}`;
  $("engine-hit").textContent = pct(info.prefix_cache.hit_rate);
  const facts = [
    ["state", info.state + (info.load_error ? `: ${info.load_error}` : "")],
    ["model", `${info.model} (${info.model_file || "?"}, ${info.architecture || "?"})`],
    ["parameters", info.num_params ? `${(info.num_params / 1e6).toFixed(1)} M` : "–"],
    ["dtype", info.dtype], ["quantization", info.quantization || "none"],
    ["max model length", info.max_model_len ?? "–"], ["threads", info.threads],
    ["decoder stack", info.decoder_stack || "–"],
    ["running / waiting / queued", `${info.requests.running} / ${info.requests.waiting} / ${info.requests.queued}`],
    ["KV pool", `${info.kv.slots_held} held + ${info.kv.slots_cached} cached of ${info.kv.slots_total} slots`
                + (info.kv_cache_gb ? ` (${info.kv_cache_gb} GiB)` : "")],
    ["prefix cache", info.prefix_cache.enabled
      ? `${pct(info.prefix_cache.hit_rate)} hit (${info.prefix_cache.hit_tokens} of ${info.prefix_cache.queried_tokens} tokens)`
      : "off"],
    ["preemptions", info.num_preemptions],
    ["requests finished", info.totals.requests_finished], ["tokens generated", info.totals.generation_tokens],
  ];
  $("engine-facts").replaceChildren(...facts.flatMap(([k, v]) => [el("dt", { textContent: k }),
                                                                    el("dd", { textContent: String(v) })]));
  const rows = Object.entries(info.kernels).map(([op, k]) => el("tr", {},
    el("td", { textContent: op }), el("td", { textContent: k.impl }), el("td", { textContent: k.reason })));
  $("kernel-table").tBodies[0].replaceChildren(...rows);
}

// ---- benchmarks ---------------------------------------------------------------------------
function num3(x) {
  if (x === null || x === undefined) return "–";
  const a = Math.abs(x);
  return a >= 100 ? x.toFixed(0) : a >= 10 ? x.toFixed(1) : x.toFixed(2);
}

function renderBench(result, label) {
  const ms = Array.isArray(result.measurements) ? result.measurements : null;
  if (!ms) throw new Error(`${label} is not an \`anycore bench compare --json\` file (no "measurements" list)`);
  const meta = result.meta || {};
  $("bench-meta").textContent = `${label}: ${ms.length} measurements; started ${meta.started || "?"}; `
    + `cpu ${meta.cpu_model || "?"}, ${meta.threads || "?"} threads${result.partial ? " (partial run)" : ""}`;
  const rows = ms.map((m) => el("tr", {},
    el("td", { textContent: m.workload }), el("td", { textContent: m.engine }),
    el("td", { className: "num", textContent: num3(m.median) }),
    el("td", { textContent: `${m.unit} ${m.higher_is_better ? "↑" : "↓"}` }),
    el("td", { className: "num", textContent: m.cv === undefined ? "–" : `${(100 * m.cv).toFixed(0)}%` }),
    el("td", { className: "num", textContent: String((m.values || []).length) }),
    el("td", { className: "num", textContent: m.fraction_of_limit ? pct(m.fraction_of_limit) : "–" }),
    el("td", { className: "num", textContent: m.ratio !== null && m.ratio !== undefined ? m.ratio.toFixed(2)
                                              : (m.ratio_ref === m.engine ? "ref" : "–") }),
    el("td", { textContent: m.noisy ? `NOISY: ${(m.noise_reasons || []).join("; ")}` : "" })));
  $("bench-table").tBodies[0].replaceChildren(...rows);
}

async function loadServerBench() {
  $("bench-charts").replaceChildren();
  try {
    const data = await (await api("/v1/bench")).json();
    renderBench(data.result, data.file);
    for (const name of data.charts) {
      const blob = await (await api(`/v1/bench/charts/${encodeURIComponent(name)}`)).blob();
      $("bench-charts").append(el("img", { src: URL.createObjectURL(blob), alt: `benchmark chart ${name}` }));
    }
  } catch (err) {
    $("bench-meta").textContent = err.status === 404 ? "The server has no results (no --bench-results); load a file below."
                                                     : `Could not load the server's results: ${err.message}`;
  }
}

async function loadBenchFile(file) {
  $("bench-charts").replaceChildren();
  try { renderBench(JSON.parse(await file.text()), file.name); }
  catch (err) { $("bench-meta").textContent = `Could not read ${file.name}: ${err.message}`; }
}

// ---- tabs, keys, start --------------------------------------------------------------------
function showTab(name) {
  for (const t of ["chat", "engine", "bench"]) {
    $(`tab-${t}`).setAttribute("aria-selected", String(t === name));
    $(`panel-${t}`).hidden = t !== name;
  }
  if (name === "bench" && !$("bench-table").tBodies[0].rows.length) {
    if (!lastInfo || lastInfo.bench_results) loadServerBench();
    else $("bench-meta").textContent = "The server has no results (started without --bench-results); load a file below.";
  }
}

function restoreSettings() {
  const s = load(STORE.settings, {});
  for (const id of SETTINGS) {
    if (!(id in s)) continue;
    if ($(id).type === "checkbox") $(id).checked = Boolean(s[id]); else $(id).value = s[id];
  }
}
function storeSettings() {
  const s = {};
  for (const id of SETTINGS) s[id] = $(id).type === "checkbox" ? $(id).checked : $(id).value;
  save(STORE.settings, s);
}

function start() {
  conversations = load(STORE.convs, []);
  current = conversations.find((c) => c.id === load(STORE.current, null)) || conversations[0] || null;
  if (!current) newConversation();
  restoreSettings();
  renderConversations();
  renderMessages();
  // narrow screens: the side panels start folded so the chat is what one sees
  if (window.matchMedia("(max-width: 820px)").matches) {
    $("side-convs").open = false;
    $("side-settings").open = false;
  }

  $("composer").addEventListener("submit", (ev) => { ev.preventDefault(); send(); });
  $("prompt").addEventListener("keydown", (ev) => {
    if (ev.key === "Enter" && !ev.shiftKey && !ev.isComposing) { ev.preventDefault(); send(); }
  });
  document.addEventListener("keydown", (ev) => { if (ev.key === "Escape" && inFlight) { ev.preventDefault(); stop(); } });
  $("stop").addEventListener("click", stop);
  $("new-conv").addEventListener("click", () => { if (!inFlight) { newConversation(); $("prompt").focus(); } });
  for (const id of SETTINGS) $(id).addEventListener("change", storeSettings);
  for (const t of ["chat", "engine", "bench"]) $(`tab-${t}`).addEventListener("click", () => showTab(t));
  $("bench-file").addEventListener("change", (ev) => { if (ev.target.files[0]) loadBenchFile(ev.target.files[0]); });
  $("change-key").addEventListener("click", () => askKey("Set the API key this page sends (empty: none)."));

  pollEngine();
  setInterval(pollEngine, 1000);
  $("prompt").focus();
}

document.addEventListener("DOMContentLoaded", start);
