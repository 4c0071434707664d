// seqexport's runtime contract in JavaScript: an exported folder (manifest.json, graphs,
// weights, tokenizer) decoded in the browser with onnxruntime-web.
//
//   import { loadModel } from "./seqexport.mjs";
//   const model = await loadModel("models/mamba-dates/");          // WASM, or WebGPU where the browser has it
//   for await (const t of model.generate(model.encodePrompt("5 March 2021"), { maxNewTokens: 16 }))
//     out.textContent += t.text;                                     // streamed, whole characters only
//
// Or step by step, the state as plain ort.Tensors named by the manifest:
//   let { logits, state } = await model.start(promptIds);            // prefill (or encoder + start token)
//   ({ logits, state } = await model.step(tokenId, state));          // one token, the state fed back
//
// Everything is read from the manifest's graph specs, never from the family's name: the graph
// with state outputs but no state inputs runs once on the prompt (an encoder; its outputs are
// `static` state), the graph whose tokens input has length 1 steps, a graph of any length
// prefills; `feeds` name the outputs that replace a state input, `appends` those whose new
// positions are written into a state buffer at `past_lengths` (an attention KV cache). Inputs
// are filled by their role: tokens, mask, state, lengths, keep.

import { beamSearch } from "./beams.mjs";
import { PCG64, Seen, newTokens, pickToken } from "./sampling.mjs";
import { ChatTemplate, TextStream, encodePrompt, loadTokenizer } from "./tokenizers.mjs";

const HERE = new URL(".", import.meta.url);
const LOGITS = "logits"; // the output every family's decoding graphs share (seqexport.specs.LOGITS)
const PAST_LEN = "past_len"; // the appended state's growing dim

/** An error the user can act on (a bad prompt, a file the site lacks); the page shows its message. */
export class ModelError extends Error {}

/** A value as an error message shows it: a string quoted (the id "5" is not the id 5), a bigint
 * with its n, an object by its kind. */
function shown(v) {
  if (typeof v === "string") return JSON.stringify(v.length > 40 ? `${v.slice(0, 40)}…` : v);
  if (typeof v === "bigint") return `${v}n`;
  if (v === null || typeof v !== "object") return String(v);
  if (Array.isArray(v)) return `an array of ${v.length}`;
  return v.constructor && v.constructor !== Object ? `a ${v.constructor.name}` : "an object";
}

/** `options` (an object, or nothing) with none but the `known` keys: a misspelt option would
 * otherwise be ignored, the call running with the default instead. Keys set to undefined are
 * left out (`{ startId: maybe }`: the default, as an absent key). */
function checkedKeys(options, known, what) {
  if (options == null) return {};
  if (typeof options !== "object" || Array.isArray(options))
    throw new ModelError(`${what}: expected an object of options, got ${shown(options)}`);
  const unknown = Object.keys(options).find((k) => !known.includes(k));
  if (unknown !== undefined) throw new ModelError(`unknown option ${unknown}; expected some of ${known.join(", ")}`);
  return Object.fromEntries(Object.entries(options).filter(([, v]) => v !== undefined));
}

const BACKENDS = ["auto", "wasm", "webgpu"];

function checkBackend(asked) {
  if (!BACKENDS.includes(asked))
    throw new ModelError(`backend ${shown(asked)}: expected one of ${BACKENDS.map((b) => `"${b}"`).join(", ")}`);
}

// --- onnxruntime-web, from this site's own copy ------------------------------------------------

const BUNDLES = { wasm: "ort.wasm.min.mjs", webgpu: "ort.webgpu.min.mjs" };
const ortModules = {};

async function importOrt(backend, ortUrl) {
  if (!ortModules[backend]) {
    ortModules[backend] = (async () => {
      const url = new URL(BUNDLES[backend], ortUrl);
      let ort;
      try {
        ort = await import(url.href);
      } catch (e) {
        throw new ModelError(`cannot load onnxruntime-web from ${url.pathname}: ${e.message}`);
      }
      ort.env.wasm.wasmPaths = ortUrl.href; // the .wasm next to the bundle: never a CDN
      ort.env.logLevel = "error";
      return ort;
    })();
  }
  return ortModules[backend];
}

/** "webgpu" when the browser offers a WebGPU adapter, else "wasm". */
export async function pickBackend(asked = "auto") {
  checkBackend(asked);
  if (asked === "wasm") return "wasm";
  const gpu = globalThis.navigator?.gpu;
  let adapter = null;
  try {
    adapter = gpu ? await gpu.requestAdapter() : null;
  } catch {
    adapter = null;
  }
  if (asked === "webgpu" && !adapter)
    throw new ModelError("WebGPU was asked for, but this browser offers no WebGPU adapter; use the WASM backend");
  return adapter ? "webgpu" : "wasm";
}

// --- fetching the export's files ---------------------------------------------------------------

/** The response for `url`; a ModelError naming `what` if it cannot be had (null for a 404 when
 * the file is `optional`). */
async function fetchFile(url, what, optional = false) {
  let response;
  try {
    response = await fetch(url);
  } catch (e) {
    throw new ModelError(`cannot load ${what} ${url.pathname}: ${e.message}`);
  }
  if (optional && response.status === 404) return null;
  if (!response.ok)
    throw new ModelError(`cannot load ${what} ${url.pathname}: HTTP ${response.status} ${response.statusText}`.trim());
  return response;
}

async function sha256Hex(bytes) {
  const digest = await crypto.subtle.digest("SHA-256", bytes);
  return Array.from(new Uint8Array(digest), (b) => b.toString(16).padStart(2, "0")).join("");
}

/** A file of the export as bytes, checked against the manifest's size and sha256 (as read_manifest does). */
async function fetchChecked(base, file, sha256, size, what, verify) {
  const bytes = new Uint8Array(await (await fetchFile(new URL(file, base), what)).arrayBuffer());
  if (size !== undefined && bytes.length !== size)
    throw new ModelError(`${what} ${file}: ${bytes.length} bytes, the manifest says ${size} (truncated or replaced)`);
  if (verify && sha256 && globalThis.crypto?.subtle) {
    const digest = await sha256Hex(bytes);
    if (digest !== sha256)
      throw new ModelError(`${what} ${file}: sha256 ${digest.slice(0, 12)}…, the manifest says ${sha256.slice(0, 12)}… (file altered)`);
  }
  return bytes;
}

// --- tensors -----------------------------------------------------------------------------------

const ARRAYS = { int64: BigInt64Array, float32: Float32Array, float16: Uint16Array };
const product = (dims) => dims.reduce((a, b) => a * b, 1);

const notAnId = (v, vocab) => (Number.isInteger(v) ? `is outside [0, ${vocab})` : `is not an integer in [0, ${vocab})`);

/** Prompt ids as a list of numbers (an Array, a typed array, BigInts): text or a lone number is
 * refused by name (Array.from would make NaNs of a string's characters, nothing of a number). */
function promptIdList(promptIds) {
  if (typeof promptIds === "string")
    throw new ModelError("promptIds: expected an array of token ids, got a string (model.encodePrompt(text) gives its ids)");
  if (promptIds == null || typeof promptIds !== "object" || typeof promptIds[Symbol.iterator] !== "function")
    throw new ModelError(`promptIds: expected an array of token ids, got ${shown(promptIds)}`);
  return Array.from(promptIds, (i) => (typeof i === "bigint" ? Number(i) : i));
}

function int64(ort, values, dims) {
  return new ort.Tensor("int64", BigInt64Array.from(values, (v) => BigInt(v)), dims);
}

/** Raw elements of a tensor's data: float16 as its 16-bit patterns whatever array ORT chose. */
function rawData(tensor) {
  const d = tensor.data;
  if (tensor.type === "float16" && !(d instanceof Uint16Array)) return new Uint16Array(d.buffer, d.byteOffset, d.length);
  return d;
}

function halfToFloat(h) {
  const s = h & 0x8000 ? -1 : 1, e = (h >> 10) & 0x1f, f = h & 0x3ff;
  if (e === 0) return s * f * 2 ** -24;
  if (e === 31) return f ? NaN : s * Infinity;
  return s * (1 + f / 1024) * 2 ** (e - 15);
}

/** The last position's logits of a (1, t, vocab) output as a Float32Array. */
function lastLogits(tensor) {
  const v = tensor.dims[tensor.dims.length - 1];
  const n = tensor.data.length;
  if (tensor.type === "float32") return tensor.data.subarray(n - v, n);
  const raw = rawData(tensor);
  if (tensor.type === "float16") return Float32Array.from(raw.subarray(n - v, n), halfToFloat);
  throw new ModelError(`logits of dtype ${tensor.type}: expected float32 or float16`);
}

// --- the graphs' roles, read from the manifest -------------------------------------------------

/** Which graph begins, prefills and steps, from the specs alone. */
export function graphRoles(manifest) {
  const graphs = manifest.graphs;
  const names = Object.keys(graphs);
  const tokensOf = (g) => graphs[g].inputs.find((t) => t.role === "tokens");
  const hasState = (g) => graphs[g].inputs.some((t) => t.role === "state");
  const decoding = names.filter((g) => tokensOf(g) && graphs[g].outputs.some((t) => t.name === LOGITS) && hasState(g));
  // run once on the prompt: state outputs fed to another graph, no state of its own (an encoder)
  const begin = names.find((g) => !decoding.includes(g) && tokensOf(g) && (graphs[g].feeds ?? []).length) ?? null;
  const length = (g) => tokensOf(g).dims[1];
  const step = decoding.find((g) => length(g) === 1) ?? decoding.find((g) => typeof length(g) === "string");
  const prefill = decoding.find((g) => typeof length(g) === "string") ??
    decoding.find((g) => Number.isInteger(length(g)) && length(g) > 1) ?? step;
  if (!step) throw new ModelError("manifest.json: no graph takes one token with state in and logits out; not a decodable export");
  return { begin, prefill, step, fixedPrefill: Number.isInteger(length(prefill)) ? length(prefill) : null };
}

/** A sequence's state: ort.Tensors by input name, appended buffers, how many tokens it holds. */
class SeqState {
  constructor(model, tensors, buffers, length, pastLength, sourceMask) {
    this.model = model; // the Model whose start/step made it: another model's graphs cannot read it
    this.tensors = tensors; // state input name -> ort.Tensor (replaced and static state)
    this.buffers = buffers; // state input name -> {data, dims, axis, writer} (appended state)
    this.length = length; // tokens fed so far
    this.pastLength = pastLength; // valid slots of the appended buffers
    this.sourceMask = sourceMask; // the begin graph's mask, read by every decoding step
    this.disposed = false;
  }

  /** Free the GPU buffers of this state (WebGPU), but none that `keep` (a state going on, or a
   * list of them: beam search's) still reads; a state must not be used after (step refuses it). */
  dispose(keep = []) {
    if (this.disposed) return;
    const live = new Set([keep].flat().flatMap((s) => Object.values(s.tensors)));
    for (const t of Object.values(this.tensors)) if (t.location === "gpu-buffer" && !live.has(t)) t.dispose();
    this.disposed = true;
  }
}

// --- the model ---------------------------------------------------------------------------------

export class Model {
  constructor(init) {
    Object.assign(this, init);
    this._inFlight = Promise.resolve(); // the last graph run begun (see _run)
    this.roles = graphRoles(this.manifest);
    this.specs = this.manifest.graphs;
    const appended = new Set();
    for (const spec of Object.values(this.specs)) for (const [, inp] of spec.appends ?? []) appended.add(inp);
    this.appended = appended;
    // the checkpoint's decode defaults (generation_config.json), in generate()'s option names:
    // what an option left out takes, as Python's generate()
    this.generationDefaults = generationDefaults(this.manifest.generation);
  }

  get vocabSize() {
    return this.specs[this.roles.step].inputs.find((t) => t.role === "tokens").vocab_size;
  }

  /** Text -> prompt ids, framed as the model was trained. */
  encodePrompt(text) {
    if (!this.tokenizer) throw new ModelError("this export has no tokenizer; give the prompt as token ids");
    if (typeof text !== "string") throw new ModelError(`the prompt must be text (a string), got ${shown(text)}`);
    if (!text.trim()) throw new ModelError("The prompt is empty: type some text first.");
    return encodePrompt(this.tokenizer, this.promptFrame, text, this.manifest.tokenizer);
  }

  /** A conversation ([{role, content}, ...]) -> prompt ids through the checkpoint's chat template,
   * with the assistant's opening (the Python runtime's model.encode_chat). */
  encodeChat(messages) {
    if (!this.chatTemplate)
      throw new ModelError("this model has no chat template (its checkpoint had none); give the prompt as text");
    let text;
    try {
      text = this.chatTemplate.render(messages);
    } catch (e) {
      throw new ModelError(e.message);
    }
    return this.tokenizer.encode(text, { special: false });
  }

  _checkPrompt(ids, graph) {
    if (!ids.length) throw new ModelError("The prompt is empty: type some text first.");
    const vocab = this.specs[graph].inputs.find((t) => t.role === "tokens").vocab_size;
    const bad = ids.find((i) => !Number.isInteger(i) || i < 0 || (vocab && i >= vocab));
    if (bad !== undefined) throw new ModelError(`token id ${shown(bad)} ${notAnId(bad, vocab)}`);
    if (this.maxPromptTokens && ids.length > this.maxPromptTokens)
      throw new ModelError(`The prompt is ${ids.length} tokens long; ${this.name} takes at most ${this.maxPromptTokens}. Shorten it.`);
  }

  _zeros(t, sizes) {
    const dims = t.dims.map((d) => {
      if (typeof d === "number") return d;
      if (!(d in sizes)) throw new ModelError(`cannot size state input ${t.name}: its dim ${d} is unknown at the start`);
      return sizes[d];
    });
    const Array_ = ARRAYS[t.dtype];
    if (!Array_) throw new ModelError(`state input ${t.name} has dtype ${t.dtype}; this runtime reads ${Object.keys(ARRAYS)}`);
    return { data: new Array_(product(dims)), dims };
  }

  /** A fresh state: zeros for every state input of the decoding graphs not given in `given`. */
  _freshState(given, sizes, sourceMask) {
    const tensors = { ...given };
    const buffers = {};
    const capacity = this._initialCapacity();
    for (const g of new Set([this.roles.step, this.roles.prefill])) {
      for (const t of this.specs[g].inputs) {
        if (t.role !== "state" || t.name in tensors || t.name in buffers) continue;
        if (this.appended.has(t.name)) {
          const z = this._zeros(t, { ...sizes, [PAST_LEN]: capacity });
          buffers[t.name] = { ...z, type: t.dtype, axis: t.dims.indexOf(PAST_LEN), writer: null };
        } else {
          const z = this._zeros(t, sizes);
          tensors[t.name] = new this.ort.Tensor(t.dtype, z.data, z.dims);
        }
      }
    }
    const state = new SeqState(this, tensors, buffers, 0, 0, sourceMask);
    for (const b of Object.values(buffers)) b.writer = state;
    return state;
  }

  _initialCapacity() {
    return this.maxNewTokensLimit ? Math.min(this.maxNewTokensLimit, 64) : 64;
  }

  /**
   * Feed the prompt: returns the logits after it (Float32Array of the vocabulary) and the state.
   * An encoder-decoder runs its encoder on the prompt, then its decoder on the start token.
   */
  async start(promptIds, options = {}) {
    const { startId = null } = checkedKeys(options, ["startId"], "start");
    promptIds = promptIdList(promptIds);
    this._checkStartId(startId);
    const { begin } = this.roles;
    this._checkPrompt(promptIds, begin ?? this.roles.prefill);
    if (begin) {
      const spec = this.specs[begin];
      const feeds = this._feeds(begin, promptIds, null);
      let out;
      try {
        out = await this._run(begin, feeds);
      } catch (e) {
        throw new ModelError(`graph ${begin}: ONNX Runtime rejected the inputs: ${firstLine(e)}`);
      }
      const given = {};
      for (const [o, inp] of spec.feeds) given[inp] = out[o];
      const mask = feeds[spec.inputs.find((t) => t.role === "mask")?.name] ?? null;
      const srcDim = spec.inputs.find((t) => t.role === "tokens").dims[1];
      const state = this._freshState(given, { batch: 1, [srcDim]: promptIds.length }, mask);
      return this._advance(this.roles.step, [this._startToken(startId)], state, true);
    }
    let state = this._freshState({}, { batch: 1 }, null);
    const { prefill, step, fixedPrefill } = this.roles;
    let result;
    for (let pos = 0; pos < promptIds.length; ) {
      const left = promptIds.length - pos;
      const one = left === 1 || (fixedPrefill && left < fixedPrefill);
      const n = one ? 1 : fixedPrefill ?? left;
      const previous = state;
      result = await this._advance(one ? step : prefill, promptIds.slice(pos, pos + n), state, true);
      state = result.state;
      if (previous !== state) previous.dispose(state);
      pos += n;
    }
    return result;
  }

  /** A decoder start token only where a decoder takes one (ignored, it would look as if it had
   * been used), and one it can embed: as the Python runtime's check_start_id. */
  _checkStartId(startId) {
    if (startId === null) return;
    if (!this.roles.begin)
      throw new ModelError(`startId ${shown(startId)} does not apply to this ${this.name} model: it continues the prompt (put the token first in the prompt instead)`);
    if (!(Number.isInteger(startId) && startId >= 0 && startId < this.vocabSize))
      throw new ModelError(`startId ${shown(startId)} is not a token id of this model: expected an id in [0, ${this.vocabSize})`);
  }

  /** One token in, the logits after it and the next state out; `state` stays usable (a branch). */
  async step(token, state) {
    if (!Number.isInteger(token) || token < 0 || token >= this.vocabSize)
      throw new ModelError(`token id ${shown(token)} ${notAnId(token, this.vocabSize)}`);
    if (!(state instanceof SeqState))
      throw new ModelError(`state: expected what this model's start() or step() returned, got ${shown(state)}`);
    if (state.model !== this) {
      const other = state.model.name === this.name ? `another loadModel() of ${this.name}` : `another model (${state.model.name})`;
      throw new ModelError(`state: it came from ${other}; ${this.name} steps only its own states`);
    }
    if (state.disposed) throw new ModelError("state: it was disposed; step a state that has not been");
    if (this.maxNewTokensLimit && state.length + 1 > this.maxNewTokensLimit)
      throw new ModelError(`the context of ${state.length + 1} tokens exceeds the model's ${this.maxNewTokensLimit} positions`);
    return this._advance(this.roles.step, [token], state, true);
  }

  _session(graph) {
    return this.sessions[graph];
  }

  /** A graph's run, after every run this model began before it: onnxruntime-web cannot take a
   * run while another is in flight (a beam search and a greedy decode begun together failed
   * with "output name cannot be empty"), so decodes begun together take turns, step by step. */
  _run(graph, feeds) {
    const run = this._inFlight.then(() => this._session(graph).run(feeds));
    this._inFlight = run.catch(() => {}); // a failed run (reported to its caller) lets the next go
    return run;
  }

  /** The graph's inputs, each filled by its role. */
  _feeds(graph, ids, state, keepLast = true) {
    const ort = this.ort;
    const spec = this.specs[graph];
    const tokens = spec.inputs.find((t) => t.role === "tokens");
    const feeds = {};
    for (const t of spec.inputs) {
      if (t.role === "tokens") feeds[t.name] = int64(ort, ids, [1, ids.length]);
      else if (t.role === "mask") {
        // a mask over the tokens fed now (its length dim is theirs), else the begin graph's
        feeds[t.name] = t.dims[1] === tokens.dims[1] ? int64(ort, ids.map(() => 1), [1, ids.length]) : state?.sourceMask;
        if (!feeds[t.name]) throw new ModelError(`graph ${graph}: mask input ${t.name} has no source to read`);
      } else if (t.role === "state") {
        const b = state.buffers[t.name];
        feeds[t.name] = b ? new ort.Tensor(b.type, b.data, b.dims) : state.tensors[t.name];
      } else if (t.role === "lengths") feeds[t.name] = int64(ort, [state.pastLength], [1]);
      else if (t.role === "keep") feeds[t.name] = int64(ort, [keepLast ? 1 : 0], t.dims.map(() => 1));
      else throw new ModelError(`graph ${graph}: input ${t.name} has role ${JSON.stringify(t.role)}, which this runtime cannot fill`);
    }
    return feeds;
  }

  /** Appended buffers this step may write into: the state's own when it is their newest state,
   * else copies (stepping an older state again must not change its successors); grown when the
   * new positions do not fit. */
  _writable(state, t) {
    const need = state.pastLength + t;
    const buffers = {};
    for (const [name, b] of Object.entries(state.buffers)) {
      const capacity = b.dims[b.axis];
      if (need <= capacity && b.writer === state) {
        buffers[name] = b;
        continue;
      }
      const grown = need > capacity ? Math.max(need, Math.min(2 * capacity, this.maxNewTokensLimit || Infinity)) : capacity;
      buffers[name] = { ...resized(b, grown), writer: null };
    }
    return buffers;
  }

  async _advance(graph, ids, state, keepLast) {
    const spec = this.specs[graph];
    const buffers = this._writable(state, ids.length);
    const current = new SeqState(this, state.tensors, buffers, state.length, state.pastLength, state.sourceMask);
    let out;
    const t0 = performance.now();
    try {
      out = await this._run(graph, this._feeds(graph, ids, current, keepLast));
    } catch (e) {
      throw new ModelError(`graph ${graph}: ONNX Runtime rejected the inputs: ${firstLine(e)}`);
    }
    const tensors = { ...state.tensors };
    for (const [o, inp] of spec.feeds ?? []) tensors[inp] = out[o];
    const next = new SeqState(this, tensors, buffers, state.length + ids.length, state.pastLength, state.sourceMask);
    for (const [o, inp] of spec.appends ?? []) writeNew(buffers[inp], out[o], state.pastLength);
    if ((spec.appends ?? []).length) next.pastLength = state.pastLength + ids.length;
    for (const b of Object.values(buffers)) b.writer = next;
    const logits = lastLogits(out[LOGITS]);
    return { logits, state: next, ms: performance.now() - t0 };
  }

  /**
   * Generate from prompt ids, one event per new token: {token, text, ms}; stops at eos (not
   * yielded) or after maxNewTokens. Options as seqexport.runtime.SearchOptions: maxNewTokens,
   * maxLength (the row's ids in all, transformers' max_length; where maxNewTokens is set too, the tighter holds),
   * minNewTokens, doSample, temperature, topK, topP, minP, typicalP, epsilonCutoff, etaCutoff, seed, repetitionPenalty, presencePenalty, frequencyPenalty,
   * logitBias ({id: bias}), eosId (an id or a list of ids; -1: never), startId, numBeams (beam
   * search: its tokens come at the end of the search), lengthPenalty, earlyStopping, the token
   * rules (sequenceBias, badWordsIds, noRepeatNgramSize, minLength, forcedBosTokenId,
   * forcedEosTokenId, suppressTokens, beginSuppressTokens), signal (an AbortSignal: aborted, the
   * decode ends before its next step; a beam search ends as if that step were its last, with the
   * best hypothesis so far); one left out: the model's generation default.
   */
  async *generate(promptIds, options = {}) {
    const o = searchOptions(options, this.tokenizer, this.generationDefaults);
    // an eos the model cannot pick would never end a row (as eos_for() refuses it)
    const unpickable = o.eosIds.find((id) => id >= this.vocabSize);
    if (unpickable !== undefined)
      throw new ModelError(`eosId ${unpickable} is not a token id of this model: expected -1 (never) or an id in [0, ${this.vocabSize})`);
    const unknown = unpickableToken(o, this.vocabSize);
    if (unknown !== null)
      throw new ModelError(`${unknown} is not a token id of this model: expected an id in [0, ${this.vocabSize})`);
    const budget = this.rowBudget(o, promptIds);
    const stream = this.tokenizer ? new TextStream(this.tokenizer) : null;
    if (o.numBeams > 1) {
      const { tokens, ms, steps } = await beamSearch(this, promptIds, o);
      for (const [n, token] of tokens.entries()) // the search's time on its first token
        yield { token, text: stream ? stream.push(token) : `${token} `, ms: n ? 0 : ms, first: n === 0, steps };
      return;
    }
    const rng = o.doSample ? new PCG64(o.seed ?? randomSeed()) : null;
    const seen = this.rowSeen(o, promptIds);
    let { logits, state, ms } = await this.start(promptIds, { startId: o.startId });
    try {
      for (let n = 0; n < budget; n++) {
        if (o.signal?.aborted) return;
        if (!logits.every(Number.isFinite))
          throw new ModelError(`the model produced NaN/Inf logits after ${n} new tokens; run \`seqexport validate\` on this export`);
        let scores = seen ? seen.apply(logits) : logits; // (Seen holds eos back itself)
        if (!seen && n < o.minNewTokens && o.eosIds.length) { // no eos yet: as Python's without()
          scores = Float32Array.from(scores);
          for (const id of o.eosIds) if (id >= 0 && id < scores.length) scores[id] = -Infinity;
        }
        const token = pickToken(scores, o, rng);
        seen?.add(token);
        if (o.eosIds.includes(token)) return;
        yield { token, text: stream ? stream.push(token) : `${token} `, ms, first: n === 0 };
        if (n + 1 < budget) {
          const previous = state;
          ({ logits, state, ms } = await this.step(token, state));
          previous.dispose(state);
        }
      }
    } finally {
      state.dispose();
    }
  }

  /** The most new tokens a row of `promptIds` may make (Python's row_budget): maxNewTokens, or
   * fewer where maxLength counts its ids (a language model's prompt; an encoder-decoder's decoder
   * start); a ModelError where none is left or the model cannot hold them. */
  rowBudget(o, promptIds) {
    const begin = this.roles.begin ? 1 : promptIds.length;
    const budget = newTokens(o, begin);
    if (budget < 1) {
      const ids = this.roles.begin ? "its decoder start" : `the prompt's ${begin} tokens`;
      throw new ModelError(`max length ${o.maxLength} leaves no new token after ${ids}: expected a max length above them, or max new tokens`);
    }
    if (this.maxNewTokensLimit && budget > this.maxNewTokensLimit) {
      const asked = budget === o.maxNewTokens ? `max new tokens ${budget}` : `max length ${o.maxLength} (${budget} new tokens)`;
      throw new ModelError(`${asked} exceeds what ${this.name} can hold: its decoder has ${this.maxNewTokensLimit} positions`);
    }
    return budget;
  }

  /** One row's Seen where the options ask for a bias, penalty or token rule, else null (Python's
   * row_seen): its ids are transformers' input_ids, a language model's prompt or an
   * encoder-decoder's decoder start (the source is another sequence), which the repetition
   * penalty counts too, as transformers' does. */
  rowSeen(o, promptIds) {
    if (!Seen.wanted(o)) return null;
    if (this.roles.begin) return new Seen(o, [this._startToken(o.startId)], { eos: o.eosIds });
    return new Seen(o, promptIds, { eos: o.eosIds });
  }

  /** The token an encoder-decoder's decoder starts from: `startId`, else the tokenizer's, else 1. */
  _startToken(startId) {
    return startId ?? this.tokenizer?.startId ?? 1;
  }

  /** The tokens greedy (or seeded) generation gives, eos excluded: Python's `generate` for one prompt. */
  async generateIds(promptIds, options = {}) {
    const ids = [];
    for await (const t of this.generate(promptIds, options)) ids.push(t.token);
    return ids;
  }

  async release() {
    for (const s of Object.values(this.sessions)) await s.release();
  }
}

function resized(b, capacity) {
  const dims = [...b.dims];
  const old = dims[b.axis];
  dims[b.axis] = capacity;
  const data = new b.data.constructor(product(dims));
  const outer = product(b.dims.slice(0, b.axis));
  const inner = product(b.dims.slice(b.axis + 1));
  const keep = Math.min(old, capacity) * inner;
  for (let i = 0; i < outer; i++) data.set(b.data.subarray(i * old * inner, i * old * inner + keep), i * capacity * inner);
  return { ...b, data, dims };
}

/** The new positions (…, t, …) of an appended output written into the buffer at `at` slots. */
function writeNew(b, tensor, at) {
  const src = rawData(tensor);
  const t = tensor.dims[b.axis];
  const capacity = b.dims[b.axis];
  const outer = product(b.dims.slice(0, b.axis));
  const inner = product(b.dims.slice(b.axis + 1));
  for (let i = 0; i < outer; i++)
    b.data.set(src.subarray(i * t * inner, (i + 1) * t * inner), (i * capacity + at) * inner);
}

const firstLine = (e) => String(e?.message ?? e).split("\n")[0];

function randomSeed() {
  const words = crypto.getRandomValues(new Uint32Array(2));
  return words[0] * 2 ** 21 + (words[1] >>> 11); // < 2**53
}

const GENERATION_KEYS = { do_sample: "doSample", temperature: "temperature", top_k: "topK", top_p: "topP",
  min_p: "minP", typical_p: "typicalP", epsilon_cutoff: "epsilonCutoff", eta_cutoff: "etaCutoff",
  max_new_tokens: "maxNewTokens", max_length: "maxLength", min_new_tokens: "minNewTokens", repetition_penalty: "repetitionPenalty",
  num_beams: "numBeams", length_penalty: "lengthPenalty", early_stopping: "earlyStopping",
  sequence_bias: "sequenceBias", bad_words_ids: "badWordsIds", no_repeat_ngram_size: "noRepeatNgramSize",
  min_length: "minLength", forced_bos_token_id: "forcedBosTokenId", forced_eos_token_id: "forcedEosTokenId",
  suppress_tokens: "suppressTokens", begin_suppress_tokens: "beginSuppressTokens" };

// the token rules an older export kept as not applied, which the runtime applies now (Python's
// current_record); not num_beams, which beside do_sample is beam sampling and stays not applied
const NOW_APPLIED = ["no_repeat_ngram_size", "min_length", "bad_words_ids", "sequence_bias", "suppress_tokens",
  "begin_suppress_tokens", "forced_bos_token_id", "forced_eos_token_id", "typical_p", "epsilon_cutoff", "eta_cutoff"];

/** The keys of a manifest's generation record the runtime does not apply. */
export function notApplied(record) {
  return Object.fromEntries(Object.entries(record?.not_applied ?? {}).filter(([k]) => !NOW_APPLIED.includes(k)));
}

/** A manifest's generation record ({defaults: {do_sample, temperature, …}, not_applied}) as
 * generate()'s options: its defaults, and the token rules an older export kept as not applied. */
export function generationDefaults(record) {
  const rules = Object.entries(record?.not_applied ?? {}).filter(([k]) => NOW_APPLIED.includes(k));
  const defaults = { ...Object.fromEntries(rules), ...(record?.defaults ?? {}) };
  const o = {};
  for (const [key, name] of Object.entries(GENERATION_KEYS)) if (defaults[key] != null) o[name] = defaults[key];
  if (!o.doSample && o.temperature === 0) delete o.temperature; // greedy's 0 says greedy, it is no divisor
  return o;
}

/** Options checked as SearchOptions checks them; an error names the bad value. `model`: the
 * model's generation defaults, taken where `options` leaves a field out (Python's model_options). */
export function searchOptions(options, tokenizer, model = {}) {
  const defaults = {
    maxNewTokens: null, maxLength: null, minNewTokens: 0, doSample: false, temperature: 1.0, topK: 0, topP: 1.0, minP: 0.0, typicalP: 1.0, epsilonCutoff: 0.0, etaCutoff: 0.0, seed: null,
    repetitionPenalty: 1.0, presencePenalty: 0.0, frequencyPenalty: 0.0, logitBias: {},
    eosId: tokenizer?.eosIds ?? null, startId: null, numBeams: 1, lengthPenalty: 1.0, earlyStopping: false,
    sequenceBias: [], badWordsIds: [], noRepeatNgramSize: 0, minLength: 0, forcedBosTokenId: null,
    forcedEosTokenId: null, suppressTokens: [], beginSuppressTokens: [], signal: null,
  };
  // a misspelt option (maxNewToken) would decode with the default instead, silently
  const given = checkedKeys(options, Object.keys(defaults), "generate");
  // sampling asked for keeps the model's beam width out, and a beam width its sampling (Python's
  // model_options): the two cannot be combined, and what was asked wins
  model = { ...model };
  if (given.maxNewTokens != null || model.maxNewTokens != null) delete model.maxLength; // max_new_tokens wins (as transformers)
  if (given.doSample != null || (given.numBeams ?? 1) > 1) {
    delete model.numBeams;
    delete model.doSample;
  }
  const o = { ...defaults, ...model, ...given };
  // the ids that end a row, as eos_for() gives them: one id, a list, or none
  o.eosIds = o.eosId == null ? [] : Array.isArray(o.eosId) ? [...o.eosId] : [o.eosId];
  for (const id of o.eosIds)
    if (!Number.isInteger(id) || id < -1) throw new ModelError(`eosId must be a token id (or -1: never), got ${shown(id)}`);
  // below 2**53: past it a JavaScript number is not the integer typed (a seed would not be
  // the one Python draws from)
  const integer = (name, least) => {
    if (!Number.isSafeInteger(o[name]) || o[name] < least)
      throw new ModelError(`${name} must be an integer >= ${least} (and < 2**53), got ${shown(o[name])}`);
  };
  if (o.maxLength !== null) integer("maxLength", 1);
  o.maxNewTokens ??= o.maxLength ?? 32; // (a row's ids include one token at least: maxLength never the tighter)
  integer("maxNewTokens", 1);
  integer("minNewTokens", 0);
  integer("topK", 0);
  if (typeof o.doSample !== "boolean") throw new ModelError(`doSample must be true or false, got ${shown(o.doSample)}`);
  const number = (v) => typeof v === "number" && Number.isFinite(v);
  if (!(number(o.temperature) && o.temperature > 0)) throw new ModelError(`temperature must be a number > 0, got ${shown(o.temperature)}`);
  if (!(number(o.topP) && o.topP > 0 && o.topP <= 1)) throw new ModelError(`top-p must be a number in (0, 1], got ${shown(o.topP)}`);
  if (!(number(o.minP) && o.minP >= 0 && o.minP <= 1)) throw new ModelError(`minP must be a number in [0, 1], got ${shown(o.minP)}`);
  if (!(number(o.typicalP) && o.typicalP > 0 && o.typicalP <= 1)) throw new ModelError(`typicalP must be a number in (0, 1], got ${shown(o.typicalP)}`);
  for (const name of ["epsilonCutoff", "etaCutoff"])
    if (!(number(o[name]) && o[name] >= 0 && o[name] < 1)) throw new ModelError(`${name} must be a number in [0, 1), got ${shown(o[name])}`);
  if (!(number(o.repetitionPenalty) && o.repetitionPenalty > 0))
    throw new ModelError(`repetitionPenalty must be a number > 0, got ${shown(o.repetitionPenalty)}`);
  for (const name of ["presencePenalty", "frequencyPenalty"])
    if (!(number(o[name]) && o[name] >= -2 && o[name] <= 2)) throw new ModelError(`${name} must be a number in [-2, 2], got ${shown(o[name])}`);
  integer("numBeams", 1);
  if (o.numBeams > 1 && o.doSample)
    throw new ModelError("beam search and sampling cannot be combined: give numBeams 1, or doSample false");
  if (!number(o.lengthPenalty)) throw new ModelError(`lengthPenalty must be a finite number, got ${shown(o.lengthPenalty)}`);
  if (![true, false, "never"].includes(o.earlyStopping))
    throw new ModelError(`earlyStopping must be true, false or "never", got ${shown(o.earlyStopping)}`);
  if (o.seed !== null) integer("seed", 0);
  if (o.startId !== null) integer("startId", 0);
  // OpenAI's logit_bias: {token id: a number added to its score}; -Infinity bans it
  if (o.logitBias === null || typeof o.logitBias !== "object" || Array.isArray(o.logitBias))
    throw new ModelError(`logitBias must be an object of token id -> number, got ${shown(o.logitBias)}`);
  for (const [id, bias] of Object.entries(o.logitBias)) {
    if (!/^\d{1,15}$/.test(id)) throw new ModelError(`logitBias: key ${shown(id)} is not a token id (an integer >= 0)`);
    if (!(number(bias) || bias === -Infinity)) throw new ModelError(`logitBias[${id}] must be a number (or -Infinity), got ${shown(bias)}`);
  }
  checkTokenRules(o, integer, number);
  if (o.signal !== null && typeof o.signal?.aborted !== "boolean")
    throw new ModelError(`signal must be an AbortSignal (or null), got ${shown(o.signal)}`);
  return o;
}

/** transformers' token rules checked as Python's SearchOptions checks them. */
function checkTokenRules(o, integer, number) {
  const ids = (name, value, least = 0) => {
    if (!Array.isArray(value) || value.length < least || !value.every((t) => Number.isSafeInteger(t) && t >= 0))
      throw new ModelError(`${name} must be a list of token ids${least ? " (at least one)" : ""}, got ${shown(value)}`);
  };
  if (!Array.isArray(o.sequenceBias)) throw new ModelError(`sequenceBias must be a list of [token ids, bias] pairs, got ${shown(o.sequenceBias)}`);
  const sequences = new Set();
  o.sequenceBias.forEach((pair, i) => {
    if (!Array.isArray(pair) || pair.length !== 2) throw new ModelError(`sequenceBias[${i}]: expected a [token ids, bias] pair, got ${shown(pair)}`);
    ids(`sequenceBias[${i}] token ids`, pair[0], 1);
    if (!(number(pair[1]) || pair[1] === -Infinity)) throw new ModelError(`sequenceBias[${i}] bias must be a number (or -Infinity), got ${shown(pair[1])}`);
    if (sequences.has(String(pair[0]))) throw new ModelError(`sequenceBias: the sequence ${shown(pair[0])} is given twice`);
    sequences.add(String(pair[0]));
  });
  if (!Array.isArray(o.badWordsIds)) throw new ModelError(`badWordsIds must be a list of token-id lists, got ${shown(o.badWordsIds)}`);
  o.badWordsIds.forEach((w, i) => ids(`badWordsIds[${i}]`, w, 1));
  integer("noRepeatNgramSize", 0);
  integer("minLength", 0);
  if (o.forcedBosTokenId !== null) integer("forcedBosTokenId", 0);
  if (Array.isArray(o.forcedEosTokenId)) ids("forcedEosTokenId", o.forcedEosTokenId, 1);
  else if (o.forcedEosTokenId !== null) integer("forcedEosTokenId", 0);
  ids("suppressTokens", o.suppressTokens);
  ids("beginSuppressTokens", o.beginSuppressTokens);
}

/** The first token id of a decode's options that the model cannot pick, named ("logitBias token
 * 500"), or null: Python's check_token_ids. */
function unpickableToken(o, vocabSize) {
  const forcedEos = o.forcedEosTokenId === null ? [] : [o.forcedEosTokenId].flat();
  const named = [["logitBias token", Object.keys(o.logitBias).map(Number)],
    ["sequenceBias token", o.sequenceBias.flatMap(([seq]) => seq)], ["badWordsIds token", o.badWordsIds.flat()],
    ["forcedBosTokenId", o.forcedBosTokenId === null ? [] : [o.forcedBosTokenId]], ["forcedEosTokenId", forcedEos],
    ["suppressTokens token", o.suppressTokens], ["beginSuppressTokens token", o.beginSuppressTokens]];
  for (const [name, ids] of named) for (const t of ids) if (t >= vocabSize) return `${name} ${t}`;
  return null;
}

/**
 * Open an exported folder at `url`: its manifest, graphs (checked against their sha256),
 * weights and tokenizer. Options: backend ("auto": WebGPU where the browser has it, else WASM;
 * "wasm"; "webgpu"), ortUrl (the folder of onnxruntime-web's files, default ./ort/ beside this
 * module), threads (WASM threads, used when the page is cross-origin isolated), verify (sha256
 * of every file, default true), and what the site builder read from the Python runtime: name,
 * promptFrame, maxPromptTokens, maxNewTokensLimit.
 */
export async function loadModel(url, options = {}) {
  options = checkedLoadOptions(url, options);
  const base = new URL(url, globalThis.location?.href ?? HERE);
  const manifestUrl = new URL("manifest.json", base);
  let manifest;
  try {
    manifest = await (await fetchFile(manifestUrl, "the manifest")).json();
  } catch (e) {
    throw e instanceof ModelError ? e : new ModelError(`${manifestUrl.pathname} is not JSON: ${e.message}`);
  }
  if (manifest?.format !== "seqexport" || typeof manifest.graphs !== "object")
    throw new ModelError(`${manifestUrl.pathname} is not a seqexport manifest`);
  const roles = graphRoles(manifest);
  const described = await runtimeRecord(new URL(RUNTIME_JSON, base));
  const files = fileCache(base, manifest, options.verify ?? true);
  const asked = options.backend ?? "auto";
  const backend = await pickBackend(asked);
  let sessions, ort, fallback = null;
  try {
    ({ sessions, ort } = await createSessions(backend, manifest, roles, files, options));
  } catch (e) {
    if (backend !== "webgpu" || asked !== "auto" || !(e instanceof SessionError)) throw e;
    fallback = `WebGPU could not run this model (${e.message}); running on WASM`;
    ({ sessions, ort } = await createSessions("wasm", manifest, roles, files, options));
  }
  const tokenizer = await loadTokenizer(
    manifest.tokenizer,
    async (file) => new TextDecoder().decode(await files.get(file, "the tokenizer", manifest.tokenizer)),
    () => import(new URL(options.hfTokenizersUrl ?? "./vendor/tokenizers.min.mjs", HERE).href),
  );
  const chat = manifest.tokenizer?.chat_template;
  let chatTemplate = null;
  if (chat) {
    const source = new TextDecoder().decode(await files.get(chat.file, "the chat template", chat));
    const { Template } = await import(new URL(options.jinjaUrl ?? "./vendor/jinja.mjs", HERE).href);
    try {
      chatTemplate = new ChatTemplate(Template, source, chat.special_tokens ?? {});
    } catch (e) {
      throw new ModelError(`the chat template ${chat.file} cannot be read: ${e?.message ?? e}`);
    }
  }
  const ran = fallback ? "wasm" : backend;
  return new Model({
    name: options.name ?? described.name ?? manifest.family,
    manifest, ort, sessions, tokenizer, chatTemplate, backend: ran, fallback,
    threads: ran === "wasm" ? (globalThis.crossOriginIsolated ? ort.env.wasm.numThreads : 1) : null,
    // structural defaults (as the Python families frame prompts) when no site.json says more:
    // an encoder's source ends with eos, a language model's prompt starts with bos
    promptFrame: options.promptFrame ?? described.prompt_frame ??
      (roles.begin ? { bos: false, suffix: "", eos: true } : { bos: true, suffix: "", eos: false }),
    maxPromptTokens: options.maxPromptTokens ?? described.max_prompt_tokens ?? null,
    maxNewTokensLimit: options.maxNewTokensLimit ?? described.max_new_tokens_limit ?? null,
  });
}

const LOAD_OPTIONS = ["backend", "ortUrl", "hfTokenizersUrl", "jinjaUrl", "threads", "verify", "name", "promptFrame",
  "maxPromptTokens", "maxNewTokensLimit"];

/** loadModel's arguments checked, each error naming the value (a misspelt option, a backend
 * ORT does not have, a thread count ORT would replace with its default without a word). */
function checkedLoadOptions(url, options) {
  if (!(typeof url === "string" && url) && !(url instanceof URL))
    throw new ModelError(`loadModel: expected the URL of an exported folder, got ${shown(url)}`);
  const o = checkedKeys(options, LOAD_OPTIONS, "loadModel");
  if (o.backend !== undefined) checkBackend(o.backend);
  for (const name of ["threads", "maxPromptTokens", "maxNewTokensLimit"])
    if (o[name] != null && !(Number.isSafeInteger(o[name]) && o[name] >= 1))
      throw new ModelError(`${name} must be an integer >= 1, got ${shown(o[name])}`);
  if (o.verify !== undefined && typeof o.verify !== "boolean")
    throw new ModelError(`verify must be true or false, got ${shown(o.verify)}`);
  return o;
}

// What the Python runtime says of the model and the manifest cannot (the prompt frame, the
// positional limit): `seqexport web` writes it beside each model's manifest, so a model loaded
// from its folder alone knows its limits. A folder without one (an export served as it is)
// gets the structural defaults.
const RUNTIME_JSON = "runtime.json";

async function runtimeRecord(url) {
  const response = await fetchFile(url, "the runtime record", true);
  if (response === null) return {};
  let record;
  try {
    record = await response.json();
  } catch (e) {
    throw new ModelError(`${url.pathname} is not JSON: ${e.message}`);
  }
  const limit = (v) => v == null || (Number.isSafeInteger(v) && v >= 1);
  if (record === null || typeof record !== "object" || !limit(record.max_prompt_tokens) || !limit(record.max_new_tokens_limit))
    throw new ModelError(`${url.pathname}: expected {name, prompt_frame, max_prompt_tokens, max_new_tokens_limit} as seqexport web writes it`);
  return record;
}

class SessionError extends ModelError {}

/** Each file of the export fetched once and checked against the manifest (graphs, weights, tokenizer). */
function fileCache(base, manifest, verify) {
  const pending = new Map();
  return {
    get(file, what, record = {}) {
      if (!pending.has(file)) pending.set(file, fetchChecked(base, file, record.sha256, record.bytes, what, verify));
      return pending.get(file);
    },
  };
}

async function createSessions(backend, manifest, roles, files, options) {
  const ort = await importOrt(backend, new URL(options.ortUrl ?? "./ort/", HERE));
  // WASM threads need a cross-origin isolated page (COOP/COEP headers); ORT's default there is
  // half the cores, at most 4
  if (options.threads) ort.env.wasm.numThreads = options.threads;
  const weights = manifest.weights;
  const used = [...new Set([roles.begin, roles.prefill, roles.step].filter(Boolean))];
  const sessions = {};
  const bytes = Object.fromEntries(used.map((name) => [name, files.get(manifest.graphs[name].file, `graph ${name}`, manifest.graphs[name])]));
  for (const name of used) { // one at a time: the WebGPU EP creates one session at a time
    const g = manifest.graphs[name];
    const external = [];
    if (g.data_file)
      external.push({ path: g.data_file, data: await files.get(g.data_file, `graph ${name}'s data`, { sha256: g.data_sha256, bytes: g.data_bytes }) });
    if (weights) external.push({ path: weights.file, data: await files.get(weights.file, "the weights", weights) });
    const sessionOptions = { executionProviders: [backend], graphOptimizationLevel: "all", externalData: external, logSeverityLevel: 3 };
    if (backend === "webgpu") {
      // state stays on the device between steps: every replaced or static output (not the
      // logits, not an appended cache's new positions, which are written into a host buffer)
      const fed = Object.fromEntries((g.feeds ?? []).map(([o]) => [o, "gpu-buffer"]));
      if (Object.keys(fed).length) sessionOptions.preferredOutputLocation = fed;
    }
    const graphBytes = await bytes[name];
    try {
      sessions[name] = await ort.InferenceSession.create(graphBytes, sessionOptions);
    } catch (e) {
      throw new SessionError(`graph ${name} (${g.file}): ONNX Runtime (${backend}) cannot load it: ${firstLine(e)}`);
    }
  }
  return { sessions, ort };
}
