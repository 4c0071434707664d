// Beam search over a Model's batch-1 start/step, as the Python runtime's beam_search
// (seqexport/runtime/generate.py) decodes one prompt: the same candidates, ranks, endings and
// stopping rule (transformers'), so the page gives the tokens `seqexport generate --beams N` gives.
//
// Each beam is a state of its own: a beam that splits steps its parent's state twice (a branch:
// Model.step leaves the state it is given usable), where Python gathers batch rows.

import { ModelError } from "./seqexport.mjs";

// A beam search runs many graph runs back to back, each resolved as a microtask (WASM on the
// page's thread): without a task of its own now and then, the page's clicks (Stop), timers and
// painting wait for the whole search.
const channel = typeof MessageChannel === "function" ? new MessageChannel() : null;
const queued = [];
if (channel) channel.port1.onmessage = () => queued.shift()?.();
/** A plain task (a MessageChannel message): timers, input and painting get their turn (scheduler.yield()
 * would resume ahead of them; setTimeout(0) is clamped to 4 ms once nested). The page waits on it too. */
export const nextTask = () => new Promise((resolve) => {
  if (!channel) return setTimeout(resolve, 0);
  queued.push(resolve);
  channel.port2.postMessage(null);
});

/** log-softmax of one row of float32 logits, in float64 (as Python's _log_softmax). */
export function logSoftmax(logits) {
  const n = logits.length;
  let max = -Infinity;
  for (let i = 0; i < n; i++) if (logits[i] > max) max = logits[i];
  const x = new Float64Array(n);
  let sum = 0;
  for (let i = 0; i < n; i++) sum += Math.exp((x[i] = logits[i] - max));
  const log = Math.log(sum);
  for (let i = 0; i < n; i++) x[i] -= log;
  return x;
}

/** The `m` best (total, beam, token) of one beam's row `score + logp`, best first; among equal
 * totals the lower token first (numpy's stable argsort over the flat (beam, token) index). */
function bestOfRow(score, logp, beam, m, into) {
  const top = []; // sorted: best first
  for (let t = 0; t < logp.length; t++) {
    const total = score + logp[t];
    if (top.length === m && !(total > top[m - 1].total)) continue; // (a tie keeps the earlier token)
    let at = top.length;
    while (at > 0 && total > top[at - 1].total) at--;
    top.splice(at, 0, { total, beam, token: t });
    if (top.length > m) top.pop();
  }
  into.push(...top);
}

/** Whether the search is over after its t-th token (Python's _search_over: transformers' rule). */
function searchOver(finished, running, k, t, o, longest) {
  if (finished.length < k) return false;
  if (o.earlyStopping === true) return true;
  const worst = finished.map((f) => f.score).sort((a, b) => b - a)[k - 1];
  const lp = o.lengthPenalty;
  const length = o.earlyStopping === "never" && lp > 0 ? longest : t;
  return running / length ** lp <= worst;
}

/**
 * The tokens beam search keeps for one prompt (eos excluded): `o` as searchOptions() checks it
 * (numBeams, lengthPenalty, earlyStopping, maxNewTokens, maxLength, minNewTokens, eosIds, startId and the
 * penalties). Returns {tokens, ms (ONNX Runtime's time in all), steps (model steps run)}.
 * A finished hypothesis scores sum(log p) / length ** lengthPenalty, its length counting eos.
 */
export async function beamSearch(model, promptIds, o) {
  const k = o.numBeams;
  const eos = o.eosIds;
  const lp = o.lengthPenalty;
  const budget = model.rowBudget(o, promptIds); // the most new tokens (maxLength)
  const started = await model.start(promptIds, { startId: o.startId });
  let ms = started.ms, steps = 1;
  // (an encoder-decoder's: its decoder start, then the answer; the source is another sequence)
  const seen = model.rowSeen(o, promptIds);
  // the live beams, best first (Python's rows; its dead rows, scored -inf, come after them)
  let beams = [{ tokens: [], score: 0, logits: started.logits, state: started.state, seen }];
  const finished = []; // {score, tokens}
  // as many candidates as Python keeps: enough that k go on though each eos ends some
  const m = Math.max(2, 1 + eos.length) * k;
  let yielded = performance.now();
  try {
    for (let step = 0; step < budget; step++) {
      if (performance.now() - yielded > 16) { // the page's turn (a Stop click aborts o.signal)
        await nextTask();
        yielded = performance.now();
      }
      const candidates = [];
      for (const [b, beam] of beams.entries()) {
        if (!beam.logits.every(Number.isFinite))
          throw new ModelError(`the model produced NaN/Inf logits after ${step} new tokens; run \`seqexport validate\` on this export`);
        let logp = logSoftmax(beam.logits);
        if (beam.seen) logp = beam.seen.apply(logp); // on the log-probabilities, as Python's
        else if (step < o.minNewTokens) for (const id of eos) if (id >= 0 && id < logp.length) logp[id] = -Infinity;
        bestOfRow(beam.score, logp, b, m, candidates);
      }
      const v = beams[0].logits.length;
      candidates.sort((a, c) => c.total - a.total || a.beam * v + a.token - (c.beam * v + c.token));
      // stopped (o.signal aborted): this step ends the search, as Python's with maxNewTokens step + 1
      const last = step === budget - 1 || Boolean(o.signal?.aborted);
      const chosen = [];
      for (const [rank, c] of candidates.slice(0, m).entries()) {
        if (!Number.isFinite(c.total)) continue;
        const ends = eos.includes(c.token);
        if (ends || last) {
          if (rank < k) {
            const tokens = ends ? beams[c.beam].tokens : [...beams[c.beam].tokens, c.token];
            finished.push({ score: c.total / (tokens.length + (ends ? 1 : 0)) ** lp, tokens });
          }
          continue;
        }
        chosen.push(c);
        if (chosen.length === k) break;
      }
      const running = chosen.length ? Math.max(...chosen.map((c) => c.total)) : -Infinity;
      if (searchOver(finished, running, k, step + 1, o, budget) || last) break;
      const next = [];
      for (const c of chosen) {
        const parent = beams[c.beam];
        const stepped = await model.step(c.token, parent.state);
        ms += stepped.ms;
        steps += 1;
        const childSeen = parent.seen?.copy() ?? null;
        childSeen?.add(c.token);
        next.push({ tokens: [...parent.tokens, c.token], score: c.total, logits: stepped.logits, state: stepped.state,
          seen: childSeen });
      }
      releaseStates(beams, next);
      beams = next;
    }
  } finally {
    releaseStates(beams, []);
  }
  let best = null; // the first of the best (Python's max)
  for (const f of finished) if (!best || f.score > best.score) best = f;
  return { tokens: best ? best.tokens : beams[0].tokens, ms, steps };
}

/** Free the device buffers of the beams left behind, but none a beam going on still reads. */
function releaseStates(old, kept) {
  const live = kept.map((b) => b.state);
  for (const { state } of old) state.dispose(live);
}
