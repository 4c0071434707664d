"""The transformer at run time (numpy + onnxruntime): the encoder once, then decoder steps.

    model = seqexport.runtime.load("exported/transformer-tiny")
    state = model.start(src_ids)                   # runs the encoder
    logits, state = model.step(tokens, state)      # state.arrays: graph input name -> array
"""

import numpy as np

from seqexport.errors import InputError
from seqexport.families.transformer.specs import (
    ATTENTION_MASK,
    ENCODER_ATTENTION_MASK,
    INPUT_IDS,
    LOGITS,
)
from seqexport.runtime.base import RuntimeModel, State, tokens_2d, zero_state
from seqexport.runtime.session import check_token_ids


class TransformerSteps:
    """What generation does with any transformer that has start/step (ONNX or eager)."""

    family = "transformer"
    supports_beams = True
    prompt_frame = {"bos": False, "suffix": "", "eos": True}  # the source ends with eos

    def begin(self, rows: list[list[int]], start_id: int | None = None) -> tuple[np.ndarray, State]:
        """Encode the sources (rows of unequal length, padding masked) and feed the decoder's
        start token (default: the tokenizer's bos, else 1). Returns logits (b, v) and the state."""
        src = np.full((len(rows), max(map(len, rows))), self.pad_id, np.int64)  # (b, s)
        mask = np.zeros_like(src)
        for i, r in enumerate(rows):
            src[i, : len(r)] = r
            mask[i, : len(r)] = 1
        if start_id is None:
            start_id = self.tokenizer.bos_id if self.tokenizer else 1
        state = self.start(src, mask)
        return self.step(np.full(len(rows), start_id, np.int64), state)


class TransformerModel(TransformerSteps, RuntimeModel):
    @property
    def vocab_size(self) -> int:
        return self.config["tgt_vocab_size"]

    @property
    def pad_id(self) -> int:
        return self.config["pad_id"]

    @property
    def max_new_tokens_limit(self) -> int:
        return self.config["max_len"]  # the start token and every fed token hold a position

    def start(self, src_ids, src_mask=None) -> State:
        """Run the encoder once; the state holds the cross K/V and an empty self-attention cache.

        src_ids (b, s) int; src_mask (b, s) with 1 = token, 0 = padding (default: src_ids != pad_id).
        """
        src = check_token_ids("src_ids", src_ids, self.config["src_vocab_size"])
        if src.shape[1] > self.config["max_len"]:
            raise InputError(f"src_ids: length {src.shape[1]} exceeds the positional table ({self.config['max_len']})")
        mask = (src != self.pad_id) if src_mask is None else tokens_2d(src_mask)[0]
        if mask.shape != src.shape:
            raise InputError(f"src_mask: shape {mask.shape} differs from src_ids {src.shape}")
        if mask.dtype.kind not in "biu" or not np.isin(mask, (0, 1)).all():
            bad = mask.flat[np.flatnonzero(~np.isin(mask, (0, 1)))[0]].item() if mask.dtype.kind in "biuf" else mask.dtype
            raise InputError(f"src_mask: expected 0/1 (or bool) values, 1 = token, 0 = padding; got {bad!r}")
        mask = mask.astype(np.int64)
        hidden = np.flatnonzero(mask.sum(1) == 0)
        if hidden.size:
            raise InputError(f"src_mask: row {int(hidden[0])} hides every source token; expected at least one 1")
        cross = self._fed("encoder", self._run("encoder", {INPUT_IDS: src, ATTENTION_MASK: mask}))
        arrays = {ENCODER_ATTENTION_MASK: mask, **cross,
                  **zero_state(self.specs["decoder"], src.shape[0], {"past_len": 0}, skip=cross.keys())}
        return State(arrays, 0)

    def step(self, tokens, state: State) -> tuple[np.ndarray, State]:
        """Feed tokens (b,) or (b, t); return logits (b, vocab) or (b, t, vocab) and the new state."""
        ids, squeeze = tokens_2d(tokens)
        ids = check_token_ids("tokens", ids, self.vocab_size)
        if state.length + ids.shape[1] > self.config["max_len"]:
            raise InputError(
                f"tokens: context of {state.length + ids.shape[1]} exceeds the positional table "
                f"({self.config['max_len']} positions)"
            )
        out = self._run("decoder", {INPUT_IDS: ids, **state.arrays})
        logits = out[LOGITS]
        new = State(self._feed_back("decoder", out, state.arrays), state.length + ids.shape[1])
        return (logits[:, 0] if squeeze else logits), new


Model = TransformerModel
