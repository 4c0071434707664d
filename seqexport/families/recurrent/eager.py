"""The eager model of a recurrent-state LM behind the runtime's step API: the one eager decoder
that validate, bench, the demo and training evaluation drive with `seqexport.runtime.generate`.

cache=True: `model.forward` (the sequential reference recurrence) for several tokens,
`model.step` for one, the state under the graphs' input names as at run time. cache=False: the
reference — the full forward over the whole sequence so far at every step, from a zero state.

A family subclasses `RecurrentEager` beside its runtime's steps class (`begin`, the family
name) and names its layers' state (`layer_state`) and its reference recurrence (`reference_scan`).
"""

from collections.abc import Callable

import numpy as np
import torch

from seqexport.runtime.base import State, tokens_2d

IDS = "ids"  # state key of the no-cache reference: every token so far


def _np(t: torch.Tensor) -> np.ndarray:
    return t.detach().float().cpu().numpy()


class RecurrentEager:
    # layer i -> its state's graph input names, in the order of the model's per-layer tuple
    layer_state: Callable[[int], tuple[str, ...]]
    reference_scan: Callable  # the model's sequential reference, the default `scan`

    def __init__(self, model, tokenizer=None, cache: bool = True, device="cpu", scan=None):
        self.model, self.tokenizer, self.cache, self.device = model.eval(), tokenizer, cache, device
        self.scan = scan or self.reference_scan
        self.config = model.config
        self.vocab_size = self.config.vocab_size

    def _t(self, a) -> torch.Tensor:
        return torch.from_numpy(np.ascontiguousarray(a)).to(self.device)

    def start(self, batch_size: int) -> State:
        if not self.cache:
            return State({IDS: np.zeros((batch_size, 0), np.int64)}, 0)
        return State(self._arrays(self.model.allocate_inference_cache(batch_size, device=self.device)), 0)

    def _arrays(self, layers) -> dict[str, np.ndarray]:
        return {name: _np(t) for i, layer in enumerate(layers)
                for name, t in zip(self.layer_state(i), layer, strict=True)}

    def _layers(self, arrays: dict[str, np.ndarray]) -> list[tuple[torch.Tensor, ...]]:
        return [tuple(self._t(arrays[name]) for name in self.layer_state(i)) for i in range(self.config.n_layer)]

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
