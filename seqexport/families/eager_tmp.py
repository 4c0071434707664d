"""The runtime's step API over the eager PyTorch model, so the same generation code
(`seqexport.runtime.generate`) drives eager and ONNX Runtime side by side.

Transformer: the export wrappers called eagerly (the encoder once, then cached
decoder steps). Mamba: `model.forward` for several tokens, `model.step` for one.
States hold numpy arrays under the graph input names, exactly as at run time.
"""

import numpy as np
import torch

from seqexport import specs as S
from seqexport.runtime.models import State, tokens_2d


def _np(t: torch.Tensor) -> np.ndarray:
    return t.detach().cpu().numpy()


class EagerTransformer:
    family = "transformer"

    def __init__(self, model, config, tokenizer=None):
        from seqexport.families.transformer.export import DecoderGraph, EncoderGraph, specs_for

        self.model, self.config, self.tokenizer = model.eval(), config, tokenizer
        self.encoder, self.decoder = EncoderGraph(model), DecoderGraph(model)
        self.spec = specs_for(config)["decoder"]
        self.vocab_size, self.pad_id = config.tgt_vocab_size, config.pad_id

    @torch.inference_mode()
    def start(self, src_ids, src_mask=None) -> State:
        src = torch.as_tensor(np.asarray(src_ids, np.int64))
        mask = (src != self.pad_id).long() if src_mask is None else torch.as_tensor(np.asarray(src_mask, np.int64))
        _, *cross = self.encoder(src, mask)
        arrays = {S.ENCODER_ATTENTION_MASK: mask.numpy()}
        names = [n for n in self.spec.input_names if ".encoder." in n]
        arrays.update({n: _np(t) for n, t in zip(names, cross)})
        c = self.config
        for n in self.spec.input_names:
            if n.startswith("past_key_values.") and ".decoder." in n:
                arrays[n] = np.zeros((src.shape[0], c.n_heads, 0, c.head_dim), np.float32)
        return State(arrays, 0)

    @torch.inference_mode()
    def step(self, tokens, state: State):
        ids, squeeze = tokens_2d(np.asarray(tokens, np.int64))
        args = [torch.from_numpy(state.arrays[n]) for n in self.spec.input_names[1:]]
        logits, *present = self.decoder(torch.from_numpy(ids), *args)
        new = dict(state.arrays)
        for (_, inp), t in zip(S.state_pairs(self.spec), present):
            new[inp] = _np(t)
        logits = _np(logits)
        return (logits[:, -1] if squeeze else logits), State(new, state.length + ids.shape[1])


class EagerMamba:
    family = "mamba"

    def __init__(self, model, config, tokenizer=None):
        self.model, self.config, self.tokenizer = model.eval(), config, tokenizer
        self.vocab_size = config.vocab_size

    def start(self, batch_size: int) -> State:
        arrays = {}
        for i, (conv, ssm) in enumerate(self.model.allocate_inference_cache(batch_size)):
            arrays[S.past_conv(i)], arrays[S.past_ssm(i)] = _np(conv), _np(ssm)
        return State(arrays, 0)

    @torch.inference_mode()
    def step(self, tokens, state: State):
        ids, squeeze = tokens_2d(np.asarray(tokens, np.int64))
        n = self.config.n_layer
        st = [(torch.from_numpy(state.arrays[S.past_conv(i)]), torch.from_numpy(state.arrays[S.past_ssm(i)]))
              for i in range(n)]
        if ids.shape[1] == 1:
            logits, new = self.model.step(torch.from_numpy(ids), st)
            logits = logits[:, None]
        else:
            logits, new = self.model(torch.from_numpy(ids), st)
        arrays = {}
        for i, (conv, ssm) in enumerate(new):
            arrays[S.past_conv(i)], arrays[S.past_ssm(i)] = _np(conv), _np(ssm)
        logits = _np(logits)
        return (logits[:, -1] if squeeze else logits), State(arrays, state.length + ids.shape[1])


def eager_runtime(ckpt, tokenizer=None):
    cls = EagerTransformer if ckpt.family == "transformer" else EagerMamba
    return cls(ckpt.model, ckpt.config, tokenizer)
