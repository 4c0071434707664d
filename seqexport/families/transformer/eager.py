"""The eager transformer behind the runtime's step API: the one eager decoder that validate,
bench, the demo and training evaluation drive with `seqexport.runtime.generate`.

cache=True: the encoder once, then the model's own `decode_step_cached` with its KV cache
(the state holds numpy arrays under the decoder graph's input names, the cache as the same
appended buffer as at run time).
cache=False: the reference — the model's full `forward` over the whole target prefix at
every step, no cache at all.
"""

import numpy as np
import torch

from seqexport.families.transformer.runtime import TransformerSteps
from seqexport.families.transformer.specs import (
    ENCODER_ATTENTION_MASK,
    KV,
    PAST_LENGTHS,
    graph_specs,
    past_kv,
)
from seqexport.models.transformer import Transformer, generate_mask
from seqexport.runtime.base import State, tokens_2d
from seqexport.state import appended as kv_buffer
from seqexport.state.layout import StateLayout

# State keys of the no-cache reference (not graph inputs: it feeds the whole prefix each step).
SRC, SRC_MASK, TGT = "src_ids", "src_mask", "tgt_ids"


def _np(t: torch.Tensor) -> np.ndarray:
    return t.detach().float().cpu().numpy()


class EagerTransformer(TransformerSteps):
    def __init__(self, model: Transformer, tokenizer=None, cache: bool = True, device="cpu", appended: bool = True):
        """appended=False: the cache concatenated and returned whole each step (`decode_step`),
        as the decoder of artifacts exported before `past_lengths` does."""
        self.model, self.tokenizer, self.cache, self.device = model.eval(), tokenizer, cache, device
        self.appended = appended
        self.config = model.config
        self.vocab_size, self.pad_id = self.config.tgt_vocab_size, self.config.pad_id
        self.n = self.config.num_layers
        self.max_new_tokens_limit = self.config.max_len
        self.layout = StateLayout.of(graph_specs(self.config.to_dict())["decoder"], limit=self.max_new_tokens_limit)

    def _t(self, a) -> torch.Tensor:
        return torch.from_numpy(np.ascontiguousarray(a)).to(self.device)

    @torch.inference_mode()
    def start(self, src_ids, src_mask=None) -> State:
        src = np.asarray(src_ids, np.int64)
        mask = (src != self.pad_id) if src_mask is None else np.asarray(src_mask)
        mask = mask.astype(np.int64)
        if not self.cache:
            return State({SRC: src, SRC_MASK: mask, TGT: np.zeros((src.shape[0], 0), np.int64)}, 0)
        memory = self.model.encoder(self._t(src), self._t(mask)[:, None, None, :])  # (b, s, d)
        arrays = {ENCODER_ATTENTION_MASK: mask}
        if self.appended:
            capacity = kv_buffer.capacity_for(1, self.max_new_tokens_limit)
            cache = self.model.allocate_cache_buffer(src.shape[0], capacity, device=self.device)
            arrays[PAST_LENGTHS] = np.zeros(src.shape[0], np.int64)
        else:
            cache = self.model.allocate_inference_cache(src.shape[0], device=self.device)
        for which, kvs in (("encoder", self.model.cross_kv(memory)), ("decoder", cache)):
            for i, kv in enumerate(kvs):
                arrays |= {past_kv(i, which, x): _np(t) for x, t in zip(KV, kv)}
        return State(arrays, 0).owning()

    @torch.inference_mode()
    def step(self, tokens, state: State):
        """Feed tokens (b,) or (b, t); logits (b, v) or (b, t, v) and the new state."""
        ids, squeeze = tokens_2d(np.asarray(tokens, np.int64))
        if not self.cache:
            tgt = np.concatenate([state.arrays[TGT], ids], axis=1)  # (b, past + t)
            src, mask = self._t(state.arrays[SRC]), self._t(state.arrays[SRC_MASK])[:, None, None, :]
            logits = _np(self.model(src, self._t(tgt), src_mask=mask, memory_mask=mask,
                                    tgt_mask=generate_mask(tgt.shape[1]).to(self.device))[:, -ids.shape[1]:])
            new = State(state.arrays | {TGT: tgt}, tgt.shape[1])
        else:
            a, writer, counts = self.layout.writable(state, ids.shape[1]) if self.appended else (state.arrays, None, None)
            cross = [tuple(self._t(a[past_kv(i, "encoder", x)]) for x in KV) for i in range(self.n)]
            cache = [tuple(self._t(a[past_kv(i, "decoder", x)]) for x in KV) for i in range(self.n)]
            mask = self._t(a[ENCODER_ATTENTION_MASK])
            if self.appended:
                out, new_kv = self.model.decode_step_cached(self._t(ids), mask, cross, cache, self._t(a[PAST_LENGTHS]))
            else:
                out, new_kv = self.model.decode_step(self._t(ids), mask, cross, cache)
            logits = _np(out)
            written = {past_kv(i, "decoder", x): _np(t) for i, kv in enumerate(new_kv) for x, t in zip(KV, kv)}
            new = (self.layout.append(a, writer, written, counts, ids.shape[1]) if self.appended
                   else State(a | written, state.length + ids.shape[1]))
        return (logits[:, -1] if squeeze else logits), new


Eager = EagerTransformer
