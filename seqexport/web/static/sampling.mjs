// Picking the next token from logits: greedy, or a seeded sample after temperature / top-k /
// top-p, drawn exactly as seqexport's Python runtime draws it (numpy's default_rng: PCG64
// seeded through SeedSequence, then Generator.choice over the probabilities). The same seed
// gives the same tokens in the page as `seqexport generate --sample --seed S`.

const MASK32 = 0xffffffffn;
const MASK64 = (1n << 64n) - 1n;
const MASK128 = (1n << 128n) - 1n;
const PCG_MULT = 0x2360ed051fc65da44385df649fccf645n; // PCG_DEFAULT_MULTIPLIER_128

// numpy.random.SeedSequence constants (bit_generator.pyx)
const INIT_A = 0x43b0d7e5, MULT_A = 0x931e8875, INIT_B = 0x8b51f9dd, MULT_B = 0x58f38ded;
const MIX_MULT_L = 0xca01f9dd, MIX_MULT_R = 0x4973f715, POOL_SIZE = 4;

const mul32 = (a, b) => Math.imul(a, b) >>> 0;

/** The 32-bit words of a non-negative integer seed, least significant first ([0] for 0). */
function seedWords(seed) {
  let v = BigInt(seed);
  if (v < 0n) throw new RangeError(`seed must be >= 0, got ${seed}`);
  const words = [];
  do {
    words.push(Number(v & MASK32));
    v >>= 32n;
  } while (v > 0n);
  return words;
}

/** SeedSequence(seed).generate_state(4, uint64) as four BigInts. */
export function seedState(seed) {
  const entropy = seedWords(seed);
  let hashConst = INIT_A;
  const hashmix = (value) => {
    value = (value ^ hashConst) >>> 0;
    hashConst = mul32(hashConst, MULT_A);
    value = mul32(value, hashConst);
    return (value ^ (value >>> 16)) >>> 0;
  };
  const mix = (x, y) => {
    const r = (mul32(MIX_MULT_L, x) - mul32(MIX_MULT_R, y)) >>> 0;
    return (r ^ (r >>> 16)) >>> 0;
  };
  const pool = new Array(POOL_SIZE);
  for (let i = 0; i < POOL_SIZE; i++) pool[i] = hashmix(i < entropy.length ? entropy[i] : 0);
  for (let src = 0; src < POOL_SIZE; src++)
    for (let dst = 0; dst < POOL_SIZE; dst++)
      if (src !== dst) pool[dst] = mix(pool[dst], hashmix(pool[src]));
  for (let src = POOL_SIZE; src < entropy.length; src++)
    for (let dst = 0; dst < POOL_SIZE; dst++) pool[dst] = mix(pool[dst], hashmix(entropy[src]));
  // generate_state: 8 uint32 words, read back as 4 little-endian uint64
  let hashB = INIT_B;
  const words = [];
  for (let i = 0; i < 8; i++) {
    let v = (pool[i % POOL_SIZE] ^ hashB) >>> 0;
    hashB = mul32(hashB, MULT_B);
    v = mul32(v, hashB);
    words.push((v ^ (v >>> 16)) >>> 0);
  }
  const out = [];
  for (let i = 0; i < 8; i += 2) out.push((BigInt(words[i + 1]) << 32n) | BigInt(words[i]));
  return out;
}

/** numpy's PCG64 bit generator (XSL-RR 128/64), seeded as `np.random.default_rng(seed)`. */
export class PCG64 {
  constructor(seed) {
    const [s0, s1, i0, i1] = seedState(seed);
    const initState = (s0 << 64n) | s1;
    const initSeq = (i0 << 64n) | i1;
    this.inc = ((initSeq << 1n) | 1n) & MASK128;
    this.state = 0n;
    this._advance();
    this.state = (this.state + initState) & MASK128;
    this._advance();
  }

  _advance() {
    this.state = (this.state * PCG_MULT + this.inc) & MASK128;
  }

  /** The next 64 random bits (BigInt). */
  nextUint64() {
    this._advance();
    const s = this.state;
    const x = ((s >> 64n) ^ s) & MASK64;
    const rot = s >> 122n;
    return ((x >> rot) | (x << ((64n - rot) & 63n))) & MASK64;
  }

  /** A double in [0, 1): `Generator.random()`. */
  random() {
    return Number(this.nextUint64() >> 11n) / 9007199254740992;
  }
}

/** Index of the largest value (the first of equal ones, as numpy's argmax). */
export function argmax(values) {
  let best = 0;
  for (let i = 1; i < values.length; i++) if (values[i] > values[best]) best = i;
  return best;
}

/** The most new tokens a row whose ids number `begin` before its first new one may make: maxNewTokens,
 * or fewer where maxLength counts the row's ids (< 1: they reach it already). Python's SearchOptions.new_tokens. */
export function newTokens(o, begin) {
  return o.maxLength == null ? o.maxNewTokens : Math.min(o.maxNewTokens, o.maxLength - begin);
}

/**
 * The tokens one row has seen, for its penalties and token rules, as Python's
 * seqexport.runtime.penalties.Seen: first a bias (OpenAI's logitBias {id: bias}, transformers'
 * sequenceBias [[ids], bias] pairs, whose several-token ones bias their last where the row's ids
 * end with the rest, and badWordsIds biased by -Infinity), then a repetition penalty on every id of
 * `context` (a language model's prompt, an encoder-decoder's decoder start) and of the answer (divided where positive, multiplied
 * where negative, once), OpenAI's presence and frequency penalties on the answer's ids, then
 * transformers' bans and forcings in its order (noRepeatNgramSize, minLength and minNewTokens,
 * forcedBosTokenId, forcedEosTokenId, suppressTokens, beginSuppressTokens). The sequence rules
 * read `context`, then the answer: transformers' input_ids. In float32, each operation rounded
 * as numpy's float32 rounds it.
 */
export class Seen {
  static wanted(o) {
    return o.repetitionPenalty !== 1 || o.presencePenalty !== 0 || o.frequencyPenalty !== 0 ||
      Object.keys(o.logitBias ?? {}).length > 0 || (o.sequenceBias ?? []).length > 0 ||
      (o.badWordsIds ?? []).length > 0 || (o.noRepeatNgramSize ?? 0) > 0 || (o.minLength ?? 0) > 0 ||
      (o.forcedBosTokenId ?? null) !== null || (o.forcedEosTokenId ?? null) !== null ||
      (o.suppressTokens ?? []).length > 0 || (o.beginSuppressTokens ?? []).length > 0;
  }

  constructor(options, context = [], { eos = [] } = {}) {
    // as given (float64: beam search's log-probabilities), and each float32 logits take
    this.repetition = options.repetitionPenalty;
    this.presence = options.presencePenalty;
    this.frequency = options.frequencyPenalty;
    // the bias every step adds (summed in float64 per id, as Python) and the several-token sequences
    this.always = new Map();
    this.sequences = [];
    const items = [...Object.entries(options.logitBias ?? {}).map(([t, b]) => [[Number(t)], b]),
      ...(options.sequenceBias ?? []),
      ...(options.badWordsIds ?? []).filter((w) => !(w.length === 1 && eos.includes(w[0]))).map((w) => [w, -Infinity])];
    for (const [ids, bias] of items) {
      if (ids.length === 1) this.always.set(ids[0], (this.always.get(ids[0]) ?? 0) + bias);
      else this.sequences.push([ids.slice(0, -1), ids[ids.length - 1], bias]);
    }
    this.ids = [...new Set(context)];
    this.known = new Set(this.ids);
    this.counts = new Map(); // generated token -> times
    this.history = [...context]; // transformers' input_ids for this row
    this.ngram = options.noRepeatNgramSize ?? 0;
    this.follows = new Map(); // (n-1) ids joined by "," -> the ids that followed them
    if (this.ngram) for (let end = this.ngram; end <= this.history.length; end++) this._follow(end);
    this.eos = eos.filter((id) => id >= 0);
    this.begin = this.history.length; // ids before the first new token
    // minNewTokens, where set, replaces minLength (transformers' _prepare_generated_length)
    this.minLength = options.minNewTokens ? this.begin + options.minNewTokens : (options.minLength ?? 0);
    this.forcedBos = options.forcedBosTokenId ?? null;
    const forcedEos = options.forcedEosTokenId ?? null;
    this.forcedEos = forcedEos === null ? null : Array.isArray(forcedEos) ? forcedEos : [forcedEos];
    this.last = this.begin + newTokens(options, this.begin) - 1; // ids before the last new token
    this.suppress = options.suppressTokens ?? [];
    this.beginSuppress = options.beginSuppressTokens ?? [];
    // transformers' begin index: one later where a one-token start gets its forced bos first
    this.beginAt = this.begin + (this.begin === 1 && this.forcedBos !== null ? 1 : 0);
  }

  _follow(end) {
    const key = this.history.slice(end - this.ngram, end - 1).join(",");
    const after = this.follows.get(key);
    const token = this.history[end - 1];
    if (!after?.has(token)) this.follows.set(key, new Set([...(after ?? []), token])); // (a new set: copies share them)
  }

  /** Another row's history that starts as this one (a beam that splits). */
  copy() {
    const twin = Object.assign(Object.create(Seen.prototype), this);
    twin.ids = [...this.ids];
    twin.known = new Set(this.known);
    twin.counts = new Map(this.counts);
    twin.history = [...this.history];
    twin.follows = new Map(this.follows);
    return twin;
  }

  add(token) {
    if (!this.known.has(token)) {
      this.known.add(token);
      this.ids.push(token);
    }
    this.counts.set(token, (this.counts.get(token) ?? 0) + 1);
    this.history.push(token);
    if (this.ngram && this.history.length >= this.ngram) this._follow(this.history.length);
  }

  /** {id: bias} this step adds: the fixed ones and those of the sequences the row's ids end with
   * the rest of, summed per id in the scores' precision `f`. */
  _biasNow(f) {
    const total = new Map([...this.always].map(([t, b]) => [t, f(b)]));
    const h = this.history;
    for (const [prefix, last, bias] of this.sequences)
      if (prefix.length <= h.length && prefix.every((t, i) => h[h.length - prefix.length + i] === t))
        total.set(last, f(f(total.get(last) ?? 0) + f(bias)));
    return total;
  }

  /** A penalised copy of one row of scores in their own precision, as numpy computes in the
   * row's dtype: float32 logits (a Float32Array: every operation rounded to float32), or beam
   * search's float64 log-probabilities (a Float64Array). */
  apply(scores) {
    const wide = scores instanceof Float64Array;
    const f = wide ? (x) => x : Math.fround;
    const out = wide ? Float64Array.from(scores) : Float32Array.from(scores);
    const v = out.length;
    const [repetition, presence, frequency] = [this.repetition, this.presence, this.frequency].map(f);
    for (const [t, b] of this._biasNow(f)) if (t < v) out[t] = f(out[t] + b);
    if (repetition !== 1)
      for (const t of this.ids) if (t < v) out[t] = out[t] < 0 ? f(out[t] * repetition) : f(out[t] / repetition);
    if (presence !== 0 || frequency !== 0)
      for (const [t, c] of this.counts) if (t < v) out[t] = f(out[t] - f(f(frequency * c) + presence));
    this._rules(out, v);
    return out;
  }

  /** transformers' bans and forcings on `out`, in place, in its processors' order. */
  _rules(out, v) {
    const length = this.history.length;
    const ban = (ids) => { for (const t of ids) if (t < v) out[t] = -Infinity; };
    if (this.ngram && length >= this.ngram) ban(this.follows.get(this.history.slice(length - this.ngram + 1).join(",")) ?? []);
    if (length < this.minLength) ban(this.eos);
    for (const [forced, at] of [[this.forcedBos === null ? null : [this.forcedBos], 1], [this.forcedEos, this.last]])
      if (forced !== null && length === at) {
        out.fill(-Infinity);
        for (const t of forced) out[t] = 0;
      }
    ban(this.suppress);
    if (length === this.beginAt) ban(this.beginSuppress);
  }
}

/** p (n,) normalised in place, then through transformers' TypicalLogitsWarper, EpsilonLogitsWarper
 * and EtaLogitsWarper in its order (the most likely token always kept), renormalised after each:
 * Python's _cut. */
function cut(p, o) {
  const n = p.length;
  const normalise = () => {
    let sum = 0;
    for (let i = 0; i < n; i++) sum += p[i];
    for (let i = 0; i < n; i++) p[i] /= sum;
  };
  const entropy = () => {
    let h = 0;
    for (let i = 0; i < n; i++) if (p[i] > 0) h -= p[i] * Math.log(p[i]);
    return h;
  };
  const below = (cutoff) => {
    let top = 0;
    for (let i = 0; i < n; i++) if (p[i] > top) top = p[i];
    for (let i = 0; i < n; i++) if (p[i] < cutoff && p[i] < top) p[i] = 0;
    normalise();
  };
  normalise();
  if ((o.typicalP ?? 1) < 1) {
    const info = Float64Array.from(p, (x) => -Math.log(x)); // Infinity where p is 0
    let h = 0;
    for (let i = 0; i < n; i++) if (p[i] > 0) h += p[i] * info[i];
    const shifted = Float64Array.from(info, (x) => Math.abs(x - h));
    // nearest the entropy first; a stable sort, as numpy's argsort(kind="stable") orders ties
    const order = Array.from(p.keys()).sort((a, b) => shifted[a] - shifted[b] || a - b);
    let cum = 0, last = 0;
    for (const i of order) if ((cum += p[i]) < o.typicalP) last++;
    const threshold = shifted[order[Math.min(last, n - 1)]];
    for (let i = 0; i < n; i++) if (!(shifted[i] <= threshold) && i !== order[0]) p[i] = 0;
    normalise();
  }
  if ((o.epsilonCutoff ?? 0) > 0) below(o.epsilonCutoff);
  if ((o.etaCutoff ?? 0) > 0) below(Math.min(o.etaCutoff, Math.sqrt(o.etaCutoff) * Math.exp(-entropy())));
}

/**
 * The next token from one row of logits: argmax, or (doSample) a draw from `rng` after
 * temperature, top-k (0: off), top-p (1: off), min-p (0: off) and typical, epsilon and eta
 * sampling (`cut`), in float64 as the Python runtime computes it.
 */
export function pickToken(logits, options, rng) {
  if (!options.doSample) return argmax(logits);
  const n = logits.length;
  const z = new Float64Array(n);
  for (let i = 0; i < n; i++) z[i] = logits[i] / options.temperature;
  if (options.topK) {
    const kth = Float64Array.from(z).sort()[n - Math.min(options.topK, n)];
    for (let i = 0; i < n; i++) if (z[i] < kth) z[i] = -Infinity;
  }
  let max = -Infinity;
  for (let i = 0; i < n; i++) if (z[i] > max) max = z[i];
  const p = new Float64Array(n);
  let sum = 0;
  for (let i = 0; i < n; i++) sum += (p[i] = Math.exp(z[i] - max));
  for (let i = 0; i < n; i++) p[i] /= sum;
  if (options.topP < 1) {
    // keep the most likely tokens while the probability before each is below top_p (the top
    // one always); a stable sort by descending probability, as numpy's argsort(-p) orders ties
    const order = Array.from(p.keys()).sort((a, b) => p[b] - p[a] || a - b);
    let before = 0, kept = 0;
    const keep = new Uint8Array(n);
    for (const i of order) {
      if (before < options.topP) keep[i] = 1;
      before += p[i];
    }
    for (let i = 0; i < n; i++) kept += keep[i] ? p[i] : 0;
    for (let i = 0; i < n; i++) p[i] = keep[i] ? p[i] / kept : 0;
  }
  if (options.minP > 0) { // after top-k and top-p, as Python (transformers' and vLLM's order)
    let top = 0;
    for (let i = 0; i < n; i++) if (p[i] > top) top = p[i];
    for (let i = 0; i < n; i++) if (p[i] < options.minP * top) p[i] = 0;
  }
  if ((options.typicalP ?? 1) < 1 || (options.epsilonCutoff ?? 0) > 0 || (options.etaCutoff ?? 0) > 0)
    cut(p, options);
  // Generator.choice(n, p=p): cdf normalised by its last value, then searchsorted(u, 'right')
  const cdf = new Float64Array(n);
  let acc = 0;
  for (let i = 0; i < n; i++) cdf[i] = acc += p[i];
  const u = rng.random(); // [0, 1)
  const last = cdf[n - 1];
  let lo = 0, hi = n;
  while (lo < hi) {
    const mid = (lo + hi) >>> 1;
    if (cdf[mid] / last <= u) lo = mid + 1;
    else hi = mid;
  }
  return lo;
}
