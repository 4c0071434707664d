// The tokenizers of exported models, as seqexport/runtime/tokenizer.py reads them from the
// manifest's "tokenizer" record:
//   "byte": UTF-8 bytes shifted past three special ids (the bundled models)
//   "rwkv": the RWKV World tokenizer (greedy longest match over its vocabulary file)
//   "hf":   a Hugging Face tokenizer.json, through @huggingface/tokenizers (tokenizers.js)
// Every tokenizer has vocabSize, bosId, eosId, padId (null where none), eosIds (every id that
// ends a text, eosId first: a checkpoint may list several), startId, framesPrompts,
// encode(text, {addBos, addEos}), decode(ids, {stopAtEos}); byte-level ones also tokenBytes(id).

const utf8 = new TextEncoder();

/** ids -> text the way Python's bytes.decode("utf-8", errors="replace") does. */
function bytesToText(bytes) {
  return new TextDecoder("utf-8").decode(bytes);
}

export class ByteTokenizer {
  constructor(record = {}) {
    this.padId = record.pad_id ?? 0;
    this.bosId = record.bos_id ?? 1;
    this.eosId = record.eos_id ?? 2;
    this.eosIds = [this.eosId];
    this.offset = record.offset ?? 3;
    this.vocabSize = this.offset + 256;
    if (record.vocab_size !== undefined && record.vocab_size !== this.vocabSize)
      throw new Error(`tokenizer vocab_size ${record.vocab_size} does not match offset ${this.offset} + 256`);
    this.framesPrompts = true;
    this.startId = this.bosId;
  }

  encode(text, { addBos = false, addEos = false } = {}) {
    const ids = Array.from(utf8.encode(text), (b) => b + this.offset);
    if (addBos) ids.unshift(this.bosId);
    if (addEos) ids.push(this.eosId);
    return ids;
  }

  /** The bytes a token stands for (none for pad, bos, eos). */
  tokenBytes(id) {
    return id >= this.offset && id < this.vocabSize ? Uint8Array.of(id - this.offset) : new Uint8Array(0);
  }

  decode(ids, { stopAtEos = true } = {}) {
    const out = [];
    for (const id of ids) {
      if (id === this.eosId && stopAtEos) break;
      if (id >= this.offset && id < this.vocabSize) out.push(id - this.offset);
    }
    return bytesToText(Uint8Array.from(out));
  }
}

// --- RWKV World ------------------------------------------------------------------------------

const SIMPLE_ESCAPES = { n: 10, r: 13, t: 9, "\\": 92, "'": 39, '"': 34, a: 7, b: 8, f: 12, v: 11 };

/**
 * A Python str or bytes literal as written by repr() ('…', "…", b'…', b"…") -> its UTF-8 bytes.
 * The vocabulary file is data, never code: only literals are read.
 */
export function pythonLiteralBytes(literal) {
  const isBytes = literal[0] === "b";
  const body = literal.slice(isBytes ? 2 : 1, -1);
  const quote = literal[isBytes ? 1 : 0];
  if ((quote !== "'" && quote !== '"') || literal[literal.length - 1] !== quote)
    throw new Error(`not a Python string literal: ${literal}`);
  const units = []; // bytes (bytes literal) or code points (str literal)
  for (let i = 0; i < body.length; ) {
    const c = body[i];
    if (c !== "\\") {
      const cp = body.codePointAt(i);
      units.push(cp);
      i += cp > 0xffff ? 2 : 1;
      continue;
    }
    const e = body[i + 1];
    if (e in SIMPLE_ESCAPES) {
      units.push(SIMPLE_ESCAPES[e]);
      i += 2;
    } else if (e === "x" || (!isBytes && (e === "u" || e === "U"))) {
      const n = { x: 2, u: 4, U: 8 }[e];
      const hex = body.slice(i + 2, i + 2 + n);
      if (!/^[0-9a-fA-F]+$/.test(hex) || hex.length !== n) throw new Error(`bad escape in ${literal}`);
      units.push(parseInt(hex, 16));
      i += 2 + n;
    } else if (e >= "0" && e <= "7") {
      const oct = /^[0-7]{1,3}/.exec(body.slice(i + 1))[0];
      units.push(parseInt(oct, 8));
      i += 1 + oct.length;
    } else {
      units.push(92); // an unknown escape stays as written
      i += 1;
    }
  }
  if (isBytes) return Uint8Array.from(units);
  return utf8.encode(String.fromCodePoint(...units));
}

/** `<id> <literal> <byte length>` lines -> Map id -> bytes; an Error naming a bad line. */
export function readRwkvVocab(text) {
  const tokens = new Map();
  const lines = text.split("\n");
  for (let n = 0; n < lines.length; n++) {
    const line = lines[n];
    if (!line) continue;
    const first = line.indexOf(" ");
    const last = line.lastIndexOf(" ");
    let bytes;
    try {
      bytes = pythonLiteralBytes(line.slice(first + 1, last));
    } catch (e) {
      throw new Error(`RWKV vocabulary line ${n + 1}: ${e.message}`);
    }
    if (first < 0 || last <= first || bytes.length !== Number(line.slice(last + 1)))
      throw new Error(`RWKV vocabulary line ${n + 1}: not '<id> <literal> <length>'`);
    tokens.set(Number(line.slice(0, first)), bytes);
  }
  return tokens;
}

const latin1 = (bytes) => {
  let s = "";
  for (let i = 0; i < bytes.length; i += 4096) s += String.fromCharCode(...bytes.subarray(i, i + 4096));
  return s;
};

export class RwkvWorldTokenizer {
  constructor(vocabText, record = {}) {
    this.vocabSize = record.vocab_size ?? 65536;
    this.eosId = record.eos_id === undefined ? 0 : record.eos_id;
    this.eosIds = this.eosId === null ? [] : [this.eosId];
    this.bosId = null;
    this.padId = null;
    this.startId = null;
    this.framesPrompts = false;
    this.idToBytes = readRwkvVocab(vocabText);
    this.bytesToId = new Map();
    const lengths = new Map(); // first byte -> lengths of the tokens starting with it, longest first
    for (const [id, bytes] of this.idToBytes) {
      this.bytesToId.set(latin1(bytes), id);
      if (!lengths.has(bytes[0])) lengths.set(bytes[0], new Set());
      lengths.get(bytes[0]).add(bytes.length);
    }
    this.lengths = new Map([...lengths].map(([b, s]) => [b, [...s].sort((x, y) => y - x)]));
  }

  encode(text, { addEos = false } = {}) {
    const src = latin1(utf8.encode(text));
    const ids = [];
    for (let i = 0; i < src.length; ) {
      for (const n of this.lengths.get(src.charCodeAt(i))) {
        const id = this.bytesToId.get(src.slice(i, i + n));
        if (id !== undefined) {
          ids.push(id);
          i += n;
          break;
        }
      }
    }
    if (addEos && this.eosId !== null) ids.push(this.eosId);
    return ids;
  }

  tokenBytes(id) {
    return id === this.eosId ? new Uint8Array(0) : this.idToBytes.get(id) ?? new Uint8Array(0);
  }

  decode(ids, { stopAtEos = true } = {}) {
    const parts = [];
    for (const id of ids) {
      if (id === this.eosId) {
        if (stopAtEos) break;
        continue;
      }
      parts.push(this.tokenBytes(id));
    }
    const out = new Uint8Array(parts.reduce((n, p) => n + p.length, 0));
    let at = 0;
    for (const p of parts) out.set(p, (at += p.length) - p.length);
    return bytesToText(out);
  }
}

// --- Hugging Face tokenizer.json -------------------------------------------------------------

export class HFTokenizer {
  /** `Tokenizer`: the class of @huggingface/tokenizers; `json`: the parsed tokenizer.json. */
  constructor(Tokenizer, json, record = {}) {
    // clean_up_tokenization_spaces off: decode as the `tokenizers` library does (the Python
    // runtime's), not as transformers' wrapper does
    this.tok = new Tokenizer(json, { clean_up_tokenization_spaces: false });
    this.vocabSize = record.vocab_size ?? this.tok.get_vocab(true).size;
    this.bosId = record.bos_id ?? null;
    this.eosId = record.eos_id ?? null;
    this.eosIds = record.eos_ids ?? (this.eosId === null ? [] : [this.eosId]);
    this.padId = record.pad_id ?? null;
    this.startId = record.decoder_start_id ?? this.bosId;
    this.framesPrompts = false;
  }

  /** `special`: the tokenizer's post-processor frames the text (its bos); a chat template's
   * text carries its own (special: false), as the Python runtime's HFTokenizer.encode. */
  encode(text, { addBos = false, addEos = false, special = true } = {}) {
    const ids = [...this.tok.encode(text, { add_special_tokens: special }).ids];
    if (addBos && this.bosId !== null) ids.unshift(this.bosId);
    if (addEos && this.eosId !== null) ids.push(this.eosId);
    return ids;
  }

  decode(ids, { stopAtEos = true } = {}) {
    ids = [...ids];
    const end = stopAtEos ? ids.findIndex((id) => this.eosIds.includes(id)) : -1;
    if (end >= 0) ids = ids.slice(0, end);
    if (!ids.length) return ""; // tokenizers.js throws on an empty list (a text that starts at eos)
    return this.tok.decode(ids, { skip_special_tokens: true });
  }
}

/**
 * The tokenizer a manifest's record describes (null for none). `readFile(name)` returns a
 * Promise of the file's text (the export's tokenizer file); `hfModule()` a Promise of the
 * @huggingface/tokenizers module (imported only for an "hf" record).
 */
export async function loadTokenizer(record, readFile, hfModule) {
  if (!record) return null;
  if (record.type === "byte") return new ByteTokenizer(record);
  if (record.type === "rwkv") return new RwkvWorldTokenizer(await readFile(record.file), record);
  if (record.type === "hf") {
    const { Tokenizer } = await hfModule();
    return new HFTokenizer(Tokenizer, JSON.parse(await readFile(record.file)), record);
  }
  throw new Error(`unknown tokenizer type ${JSON.stringify(record.type)}; expected byte, rwkv or hf`);
}

/**
 * Text -> prompt ids as the model was trained (seqexport.runtime.tokenizer.encode_prompt): a
 * byte tokenizer frames the text by the record's "prompt" ({bos, suffix, eos}) over the
 * family's default frame; a Hugging Face or RWKV tokenizer takes the text as it is.
 */
export function encodePrompt(tok, defaultFrame, text, record) {
  if (typeof text !== "string" || !text) throw new Error("the prompt is empty");
  if (!tok.framesPrompts) return tok.encode(text);
  const frame = { ...defaultFrame, ...(record?.prompt ?? {}) };
  return tok.encode(text + (frame.suffix ?? ""), { addBos: !!frame.bos, addEos: !!frame.eos });
}

const UTF8_MAX = 4; // bytes of the longest UTF-8 character: a token carries at least one

/**
 * Text of a growing token sequence, piece by piece, never splitting a character: push(id)
 * returns what that token completes ("" while a multi-byte character or a byte-level BPE piece
 * is still incomplete). Byte-level tokenizers stream their bytes; any other (Hugging Face)
 * decodes only the tokens since the last piece and the few before it, as
 * seqexport.runtime.tokenizer.TextStream does (the same pieces): a long generation costs
 * decodes linear in its length. Before, every token decoded the whole sequence again.
 */
export class TextStream {
  constructor(tok) {
    this.tok = tok;
    this.ids = [];
    this.printed = "";
    this.decoder = tok.tokenBytes ? new TextDecoder("utf-8") : null; // byte-level: stream the bytes
    this.prefix = 0; // ids[prefix, read): printed already, decoded again as context
    this.read = 0; // ids[read, ...): not printed yet
  }

  push(id) {
    if (this.decoder) {
      const text = this.decoder.decode(this.tok.tokenBytes(id), { stream: true });
      this.printed += text;
      return text;
    }
    this.ids.push(id);
    const window = this.ids.slice(this.prefix);
    // generation decides where a row ends: decode past eos
    const context = this.tok.decode(window.slice(0, this.read - this.prefix), { stopAtEos: false });
    const text = this.tok.decode(window, { stopAtEos: false });
    if (text.endsWith("\ufffd") && this.ids.length - this.read > UTF8_MAX) return this.settle(context, text);
    if (text.endsWith("\ufffd") || text.length <= context.length || !text.startsWith(context)) return "";
    return this.print(context, text, this.ids.length);
  }

  print(context, text, upto) {
    const added = text.slice(context.length);
    [this.prefix, this.read] = [this.read, upto];
    this.printed += added;
    return added;
  }

  /** Bytes that will never make a character: printed as U+FFFD, a few tokens behind (Python's _settle). */
  settle(context, text) {
    const cut = this.ids.length - UTF8_MAX;
    const head = this.tok.decode(this.ids.slice(this.prefix, cut), { stopAtEos: false });
    if (head.length <= context.length || !head.startsWith(context) || !text.startsWith(head)) return "";
    return this.print(context, head, cut);
  }
}

/**
 * A checkpoint's chat template (the manifest's tokenizer record's "chat_template"), rendered
 * with @huggingface/jinja as seqexport.runtime.chat renders it (and transformers): the special
 * tokens' strings, messages, add_generation_prompt; `Template` is that module's class. Messages
 * are checked as the Python runtime checks them (text parts joined with newlines).
 */
export class ChatTemplate {
  constructor(Template, source, specialTokens = {}) {
    this.template = new Template(source);
    this.specialTokens = { ...specialTokens };
  }

  render(messages, { addGenerationPrompt = true } = {}) {
    const checked = checkMessages(messages);
    try {
      return this.template.render({ ...this.specialTokens, messages: checked, tools: null, documents: null,
        add_generation_prompt: addGenerationPrompt });
    } catch (e) {
      throw new Error(`messages: the model's chat template refused them: ${e?.message ?? e}`);
    }
  }
}

function shortJson(v) {
  const text = JSON.stringify(v ?? null) ?? String(v); // (undefined: null, as Python's None)
  return text.length <= 80 ? text : `${text.slice(0, 77)}...`;
}

/** OpenAI's chat messages checked (seqexport.runtime.chat.check_messages). */
export function checkMessages(messages) {
  if (!Array.isArray(messages) || !messages.length)
    throw new Error(`messages: expected a non-empty list of {role, content} objects, got ${shortJson(messages)}`);
  return messages.map((m, i) => {
    if (m === null || typeof m !== "object" || Array.isArray(m))
      throw new Error(`messages[${i}]: expected an object with role and content, got ${shortJson(m)}`);
    if (typeof m.role !== "string" || !m.role)
      throw new Error(`messages[${i}].role: expected a non-empty string (system, user, assistant, ...), got ${shortJson(m.role)}`);
    return { ...m, content: messageText(m.content, i) };
  });
}

function messageText(content, i) {
  if (typeof content === "string") return content;
  if (Array.isArray(content)) {
    return content.map((part, k) => {
      if (part === null || typeof part !== "object" || part.type !== "text" || typeof part.text !== "string")
        throw new Error(`messages[${i}].content[${k}]: expected a text part {"type": "text", "text": ...}, got ` +
          `${shortJson(part?.type ?? part)} (this model reads text only)`);
      return part.text;
    }).join("\n");
  }
  throw new Error(`messages[${i}].content: expected a string or a list of text parts, got ${shortJson(content)}`);
}
