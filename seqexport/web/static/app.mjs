// The page of `seqexport web`: pick a model of site.json, type a prompt, watch the tokens come.
// Every failure ends in a visible message (the #error box), never a dead page. The page's state
// is in <body data-state>: loading | ready | running | done | error | load-error.

import { nextTask } from "./beams.mjs";
import { ModelError, loadModel, notApplied } from "./seqexport.mjs";

const $ = (id) => document.getElementById(id);
const params = new URLSearchParams(location.search);
const page = (window.seqexportPage = { model: null, lastRun: null, site: null });
let site = null;
let current = null; // {entry, model} of the selected model once loaded
let loading = null; // the load in progress (a Promise)
let running = null; // {stop: boolean, controller: AbortController} of the generation in progress

function setState(state) {
  document.body.dataset.state = state;
  $("generate").disabled = !current?.model || state === "running" || state === "loading";
  $("stop").disabled = state !== "running";
  $("model").disabled = $("backend").disabled = state === "running";
}

function showError(message) {
  $("error").textContent = message;
  $("error").hidden = false;
}

function clearError() {
  $("error").hidden = true;
  $("error").textContent = "";
}

/** A message a person can act on: ours as they are, anything else named as unexpected. */
function explain(e) {
  if (e instanceof ModelError) return e.message;
  return `Unexpected error: ${e?.message ?? e}`;
}

window.addEventListener("error", (e) => {
  showError(`Unexpected error: ${e.message}`);
  setState("error");
});
window.addEventListener("unhandledrejection", (e) => {
  showError(explain(e.reason));
  setState("error");
});

function backendLabel(model) {
  if (model.backend === "wasm") return `WASM (${model.threads} thread${model.threads === 1 ? "" : "s"})`;
  return "WebGPU";
}

/** ?threads=N as loadModel takes it: a number where the address holds digits, else the text as
 * given (so that loadModel's message names it: `got "abc"`, not a default taken silently). */
function threadsAsked() {
  const t = params.get("threads");
  return t === null ? undefined : /^[0-9]+$/.test(t) ? Number(t) : t;
}

async function selectModel(name) {
  const entry = site.models.find((m) => m.name === name) ?? site.models[0];
  // a link with a model this site lacks (a typo, a model since removed) opens the first one, saying so
  const missing = entry.name === name ? null :
    `This site has no model named "${name}" (it has ${site.models.map((m) => m.name).join(", ")}); showing ${entry.name}.`;
  $("model").value = entry.name;
  current?.model.release().catch(() => {}); // the sessions of the model left
  current = null;
  page.model = null;
  clearError();
  setState("loading");
  $("status").className = "status";
  $("status").textContent = `loading ${entry.name}…`;
  $("examples").replaceChildren(...(entry.examples ?? []).map((text) => {
    const b = document.createElement("button");
    b.type = "button";
    b.textContent = text;
    b.addEventListener("click", () => { $("prompt").value = text; });
    return b;
  }));
  const limit = entry.max_new_tokens_limit;
  showDefaults({}, limit);
  const mine = (loading = loadModel(entry.path, {
    backend: params.get("backend") ?? "auto",
    threads: threadsAsked(),
    name: entry.name,
    promptFrame: entry.prompt_frame,
    maxPromptTokens: entry.max_prompt_tokens,
    maxNewTokensLimit: limit,
  }));
  try {
    const model = await mine;
    if (loading !== mine) return; // another model was chosen meanwhile
    current = { entry, model };
    page.model = model;
    $("chat-row").hidden = !model.chatTemplate; // a chat model: its prompts go through its template
    showDefaults(model.generationDefaults, limit);
    showRules(model.manifest.generation);
    $("status").className = "status ready";
    $("status").textContent = `${entry.name} ready · ${model.manifest.family} · ${backendLabel(model)}`;
    if (model.fallback) showError(model.fallback);
    const skipped = Object.entries(notApplied(model.manifest.generation));
    if (skipped.length) // as `seqexport generate` and `serve` warn of it
      showError(`This model's ${model.manifest.generation.file} sets ${skipped.map(([k, v]) => `${k} ${JSON.stringify(v)}`).join(", ")}, ` +
                "which seqexport does not apply: its tokens can differ from transformers' generate.");
    if (missing) showError(missing);
    setState("ready");
  } catch (e) {
    if (loading !== mine) return;
    $("status").textContent = `${entry.name} did not load`;
    showError(`The model ${entry.name} could not be loaded: ${explain(e)}`);
    setState("load-error");
  }
}

// The decoding options start at the model's generation defaults (its checkpoint's
// generation_config.json), else the runtime's: what `seqexport generate` would use
function showDefaults(defaults, limit) {
  const o = { maxNewTokens: 32, doSample: false, temperature: 1.0, topK: 0, topP: 1.0, minP: 0, repetitionPenalty: 1.0,
    numBeams: 1, lengthPenalty: 1.0, ...defaults };
  // a model that sets max_length and no max_new_tokens: the field left empty, its max_length counts the ids
  const byLength = defaults.maxLength != null && defaults.maxNewTokens == null;
  $("max-new-tokens").value = byLength ? "" : Math.min(o.maxNewTokens, limit ?? o.maxNewTokens);
  $("max-new-tokens").placeholder = byLength ? `to ${defaults.maxLength} ids (max_length)` : "";
  if (limit) $("max-new-tokens").max = limit;
  else $("max-new-tokens").removeAttribute("max");
  $("decoding").value = o.doSample ? "sample" : o.numBeams > 1 ? "beam" : "greedy";
  $("beams").value = o.numBeams > 1 ? o.numBeams : 4;
  $("length-penalty").value = o.lengthPenalty;
  $("temperature").value = o.temperature;
  $("top-k").value = o.topK;
  $("top-p").value = o.topP;
  $("min-p").value = o.minP;
  $("repetition-penalty").value = o.repetitionPenalty;
}

// transformers' token rules: the page has no field for them; a checkpoint's apply to every decode
const RULE_KEYS = ["no_repeat_ngram_size", "bad_words_ids", "sequence_bias", "min_length", "forced_bos_token_id",
  "forced_eos_token_id", "suppress_tokens", "begin_suppress_tokens"];

/** Say which token rules the model's generation config sets (an older export kept them as not applied). */
function showRules(record) {
  const given = { ...(record?.not_applied ?? {}), ...(record?.defaults ?? {}) };
  const rules = RULE_KEYS.filter((k) => given[k] != null).map((k) => `${k} ${JSON.stringify(given[k])}`);
  $("rules").hidden = !rules.length;
  $("rules").textContent = rules.length
    ? `The model's ${record.file} also sets ${rules.join(", ")}: every decode applies them, as transformers' generate does.`
    : "";
}

function readOptions() {
  const number = (id, parse = Number) => {
    const raw = $(id).value.trim();
    const v = parse(raw);
    if (raw === "" || !Number.isFinite(v)) throw new ModelError(`${$(id).parentElement.textContent.trim()}: "${raw}" is not a number`);
    return v;
  };
  const options = { doSample: $("decoding").value === "sample", repetitionPenalty: number("repetition-penalty") };
  // left empty where the model sets max_length: that counts the ids instead
  if ($("max-new-tokens").value.trim() !== "" || current.model.generationDefaults.maxLength == null)
    options.maxNewTokens = number("max-new-tokens");
  if ($("decoding").value === "beam") { // the beams' tokens come at the end of the search
    options.numBeams = number("beams");
    options.lengthPenalty = number("length-penalty");
  }
  if (options.doSample) {
    options.temperature = number("temperature");
    options.topK = number("top-k");
    options.topP = number("top-p");
    options.minP = number("min-p");
    if ($("seed").value.trim() !== "") options.seed = number("seed");
  }
  if (!$("stop-at-eos").checked) options.eosId = -1; // an eos that never matches
  return options;
}


async function generate() {
  if (!current?.model) {
    showError("No model is loaded: pick one that loads first.");
    return;
  }
  clearError();
  const { model } = current;
  const text = $("prompt").value;
  const run = { stop: false, controller: new AbortController() };
  running = run;
  const out = $("output");
  out.textContent = "";
  $("ids").textContent = "";
  $("stats").textContent = "";
  // ms: each token's interval (the pick, the step before it, the page's update); runMs: the
  // ONNX Runtime run inside it alone
  const record = { model: current.entry.name, prompt: text, tokens: [], text: "", ms: [], runMs: [], backend: model.backend,
    beams: null };
  page.lastRun = record;
  setState("running");
  try {
    if (!text.trim()) throw new ModelError("The prompt is empty: type some text first.");
    const options = { ...readOptions(), signal: run.controller.signal }; // (a beam search stops through it)
    if (options.numBeams > 1) {
      record.beams = options.numBeams;
      $("stats").textContent = `beam search, ${options.numBeams} beams…`;
    }
    const chat = model.chatTemplate && $("chat").checked;
    const ids = chat ? model.encodeChat([{ role: "user", content: text }]) : model.encodePrompt(text);
    const t0 = performance.now();
    let last = t0, painted = t0;
    for await (const t of model.generate(ids, options)) {
      const now = performance.now();
      record.ms.push(now - last); // this token's pick and the step before it (the prefill for the first)
      record.runMs.push(t.ms);
      record.tokens.push(t.token);
      record.text += t.text;
      out.textContent += t.text;
      $("ids").textContent = record.tokens.join(" ");
      record.stopped = run.stop; // (a beam search's tokens come after it: stopped, its best so far)
      showStats(record, now - t0, model);
      if (now - painted > 16) { // let the page paint what came so far
        await nextTask();
        painted = performance.now();
      }
      if (run.stop && !record.beams) break; // (a stopped beam search's tokens come after it: all of them)
      last = performance.now();
    }
    record.text = model.tokenizer ? model.tokenizer.decode(record.tokens, { stopAtEos: false }) : record.text;
    out.textContent = record.text;
    record.done = true;
    setState("done");
  } catch (e) {
    record.error = explain(e);
    showError(record.error);
    setState("error");
  } finally {
    running = null;
  }
}

function showStats(record, elapsed, model) {
  const n = record.tokens.length;
  if (record.beams) { // the tokens came at once, at the end of the search
    const parts = [`${n} token${n === 1 ? "" : "s"}`, `beam search, ${record.beams} beams`,
      ...(record.stopped ? ["stopped: the best so far"] : []), `${(elapsed / 1000).toFixed(2)} s in all`,
      backendLabel(model)];
    $("stats").textContent = parts.join(" · ");
    return;
  }
  const ttft = record.ms[0];
  const rest = record.ms.slice(1);
  const perToken = rest.length ? rest.reduce((a, b) => a + b, 0) / rest.length : null;
  const parts = [`${n} token${n === 1 ? "" : "s"}`,
    perToken ? `${(1000 / perToken).toFixed(0)} tokens/s (${perToken.toFixed(2)} ms/token)` : null,
    `first token ${ttft.toFixed(1)} ms`, `${(elapsed / 1000).toFixed(2)} s in all`, backendLabel(model)];
  $("stats").textContent = parts.filter(Boolean).join(" · ");
}

async function main() {
  if (location.protocol === "file:") {
    showError("Open this page through a web server, e.g. `python -m http.server -d SITE`, then http://127.0.0.1:8000/ (browsers do not load modules from files).");
    setState("load-error");
    return;
  }
  $("backend").value = params.get("backend") ?? "auto";
  $("backend").addEventListener("change", () => {
    params.set("backend", $("backend").value);
    location.search = params.toString(); // one onnxruntime-web build per page
  });
  try {
    const response = await fetch("site.json");
    if (!response.ok) throw new ModelError(`site.json: HTTP ${response.status}`);
    site = page.site = await response.json();
  } catch (e) {
    showError(`This site has no readable site.json (${explain(e)}); build it with \`seqexport web DIR --out SITE\`.`);
    setState("load-error");
    return;
  }
  $("model").replaceChildren(...site.models.map((m) => new Option(`${m.name} (${m.family})`, m.name)));
  $("model").addEventListener("change", () => {
    params.set("model", $("model").value);
    history.replaceState(null, "", `?${params}`);
    selectModel($("model").value);
  });
  $("generate").addEventListener("click", generate);
  $("stop").addEventListener("click", () => {
    if (!running) return;
    running.stop = true;
    running.controller.abort();
  });
  $("prompt").addEventListener("keydown", (e) => {
    if (e.key === "Enter" && (e.ctrlKey || e.metaKey) && !$("generate").disabled) generate();
  });
  $("about").textContent = `onnxruntime-web ${site.onnxruntime_web} · built by seqexport ${site.seqexport} on ${site.built} · ` +
    "every file comes from this site (no CDN)";
  await selectModel(params.get("model") ?? site.models[0].name);
}

main();
