"""The eager hybrid behind the runtime's step API: the one eager decoder that validate, bench,
the demo and training evaluation drive with `seqexport.runtime.generate`.

cache=True: `model.forward` (the per-token sequential SSD in the Mamba-2 layers) for several
tokens, `model.step` for one, over the same state as at run time: numpy arrays under the graphs'
input names, the KV cache appended in place through the same `StateLayout`.
cache=False: the reference — the full forward over the whole sequence so far at every step, from
an empty state.
"""

import numpy as np
import torch

from seqexport.families.hybrid.runtime import HybridSteps
from seqexport.families.hybrid.specs import PAST_LENGTHS, graph_specs, is_kv, layer_inputs
from seqexport.models.hybrid import HybridLM
from seqexport.models.mamba2 import ssd_sequential
from seqexport.runtime.base import State, tokens_2d
from seqexport.state.layout import StateLayout

IDS = "ids"  # state key of the no-cache reference: every token so far


def _np(t: torch.Tensor) -> np.ndarray:
    return t.detach().float().cpu().numpy()


class EagerHybrid(HybridSteps):
    def __init__(self, model: HybridLM, tokenizer=None, cache: bool = True, device="cpu", scan=ssd_sequential):
        self.model, self.tokenizer, self.cache, self.device, self.scan = model.eval(), tokenizer, cache, device, scan
        self.config = model.config
        self.vocab_size = self.config.vocab_size
        self.spec = graph_specs(self.config.to_dict())["step"]
        self.layout = StateLayout.of(self.spec)

    def _t(self, a) -> torch.Tensor:
        return torch.from_numpy(np.ascontiguousarray(a)).to(self.device)

    def start(self, batch_size: int) -> State:
        if not self.cache:
            return State({IDS: np.zeros((batch_size, 0), np.int64)}, 0)
        return State(self.layout.zeros(self.spec, batch_size), 0).owning()

    @torch.inference_mode()
    def step(self, tokens, state: State, last_only: bool = False):
        """Feed tokens (b,) or (b, t); logits (b, v) or (b, t, v) (`last_only`: (b, 1, v)) and the
        new state."""
        ids, squeeze = tokens_2d(np.asarray(tokens, np.int64))
        if not self.cache:
            seq = np.concatenate([state.arrays[IDS], ids], axis=1)  # (b, past + t)
            logits, _ = self.model(self._t(seq), scan=self.scan)
            out, new = _np(logits[:, -ids.shape[1]:]), State({IDS: seq}, seq.shape[1])
        else:
            out, new = self._cached(ids, state)
        if last_only and not squeeze:
            out = out[:, -1:]
        return (out[:, -1] if squeeze else out), new

    def join(self, states: list[State]) -> State:
        """As the runtime's, by kind; the reference's token lists concatenate (rows of one length)."""
        return super().join(states) if self.cache else State.concat(states)

    def _cached(self, ids: np.ndarray, state: State):
        arrays, writer, counts = self.layout.writable(state, ids.shape[1])
        fed = self.layout.fed(arrays, counts, ids.shape[1])
        windowed = self.config.sliding_window_layers
        layers = [tuple(self._t(fed[n]) for n in layer_inputs(k, i, i in windowed))
                  for i, k in enumerate(self.config.layer_types)]
        lengths = self._t(arrays[PAST_LENGTHS])
        if ids.shape[1] == 1:
            logits, new_layers = self.model.step(self._t(ids), layers, lengths)
            logits = logits[:, None]  # (b, 1, v)
        else:
            logits, new_layers = self.model(self._t(ids), layers, lengths, scan=self.scan)
        replaced, appended = {}, {}
        for i, (kind, layer) in enumerate(zip(self.config.layer_types, new_layers, strict=True)):
            for name, t in zip(layer_inputs(kind, i, i in windowed), layer, strict=True):
                (appended if is_kv(name) else replaced)[name] = _np(t)
        return _np(logits), self.layout.append(arrays | replaced, writer, appended, counts, ids.shape[1])


Eager = EagerHybrid
