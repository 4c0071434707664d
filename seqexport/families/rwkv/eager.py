"""The eager RWKV-7 behind the runtime's step API: the one eager decoder that validate, bench,
the demo and training evaluation drive with `seqexport.runtime.generate`.

cache=True: `model.forward` (sequential reference recurrence) for several tokens, `model.step`
for one, the state under the graphs' input names as at run time. cache=False: the reference —
the full forward over the whole sequence so far at every step, from a zero state.
"""

import numpy as np
import torch

from seqexport.families.rwkv.runtime import RwkvSteps
from seqexport.families.rwkv.specs import KINDS, past
from seqexport.models.rwkv import RwkvLM, wkv7_ref
from seqexport.runtime.base import State, tokens_2d

IDS = "ids"  # state key of the no-cache reference: every token so far


def _np(t: torch.Tensor) -> np.ndarray:
    return t.detach().float().cpu().numpy()


class EagerRwkv(RwkvSteps):
    def __init__(self, model: RwkvLM, tokenizer=None, cache: bool = True, device="cpu", scan=wkv7_ref):
        self.model, self.tokenizer, self.cache, self.device, self.scan = model.eval(), tokenizer, cache, device, scan
        self.config = model.config
        self.vocab_size = self.config.vocab_size

    def _t(self, a) -> torch.Tensor:
        return torch.from_numpy(np.ascontiguousarray(a)).to(self.device)

    def start(self, batch_size: int) -> State:
        if not self.cache:
            return State({IDS: np.zeros((batch_size, 0), np.int64)}, 0)
        return State(self._arrays(self.model.allocate_inference_cache(batch_size, device=self.device)), 0)

    @staticmethod
    def _arrays(layers) -> dict[str, np.ndarray]:
        return {past(kind, i): _np(t) for i, layer in enumerate(layers) for kind, t in zip(KINDS, layer, strict=True)}

    def _layers(self, arrays: dict[str, np.ndarray]) -> list:
        return [tuple(self._t(arrays[past(kind, i)]) for kind in KINDS) for i in range(self.config.n_layer)]

    @torch.inference_mode()
    def step(self, tokens, state: State, last_only: bool = False):
        """Feed tokens (b,) or (b, t); logits (b, v) or (b, t, v) (`last_only`: (b, 1, v)) and the
        new state."""
        logits, state = self._step(tokens, state)
        return (logits[:, -1:] if last_only and logits.ndim == 3 else logits), state

    def _step(self, tokens, state: State):
        ids, squeeze = tokens_2d(np.asarray(tokens, np.int64))
        if not self.cache:
            seq = np.concatenate([state.arrays[IDS], ids], axis=1)  # (b, past + t)
            logits, _ = self.model(self._t(seq), scan=self.scan)
            out = _np(logits[:, -ids.shape[1]:])
            return (out[:, -1] if squeeze else out), State({IDS: seq}, seq.shape[1])
        layers = self._layers(state.arrays)
        if ids.shape[1] == 1:
            logits, layers = self.model.step(self._t(ids), layers)
            logits = logits[:, None]  # (b, 1, v)
        else:
            logits, layers = self.model(self._t(ids), layers, scan=self.scan)
        out = _np(logits)
        return (out[:, -1] if squeeze else out), State(self._arrays(layers), state.length + ids.shape[1])


Eager = EagerRwkv
