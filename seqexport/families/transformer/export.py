"""Transformer -> encoder.onnx + decoder.onnx with an explicit KV cache.

The encoder graph also emits every decoder layer's cross-attention K/V, computed
once per source. The decoder graph serves the first step (past_len 0) and every
later one; its positions start at past_len. The wrappers reuse the eager
modules' own projections, head split/merge, attention and norms.
"""

import torch
from torch import nn

from seqexport.export import DEFAULT_OPSET
from seqexport.export.common import (
    dynamic_shapes_for,
    export_graph,
    model_in_dtype,
    step,
    torch_dtype,
    write_artifact,
)
from seqexport.models.transformer import MultiHeadAttention, Transformer
from seqexport.specs import GraphSpec, transformer_specs


def specs_for(config, dtype: str = "float32") -> dict[str, GraphSpec]:
    return transformer_specs(config.num_layers, config.n_heads, config.head_dim, config.d_model,
                             config.tgt_vocab_size, dtype)


def _attend(mha: MultiHeadAttention, x, K, V, mask):
    """MultiHeadAttention.forward with K and V already projected and split: (b, t, d)."""
    Q = mha.split_heads(mha.W_q(x))  # (b, h, t, k)
    out, _ = mha.attention(Q, K, V, mask)
    return mha.norm(mha.fc(mha.merge_heads(out)) + x)


class EncoderGraph(nn.Module):
    """(input_ids, attention_mask) -> encoder_hidden_states, cross K/V of every decoder layer."""

    def __init__(self, model: Transformer):
        super().__init__()
        self.model = model

    def forward(self, input_ids, attention_mask):
        mask = attention_mask[:, None, None, :]  # (b, 1, 1, s)
        memory = self.model.encoder(input_ids, mask)  # (b, s, d)
        outs = [memory]
        for layer in self.model.decoder.layers:
            ca = layer.cross_attn
            outs += [ca.split_heads(ca.W_k(memory)), ca.split_heads(ca.W_v(memory))]  # (b, h, s, k)
        return tuple(outs)


class DecoderGraph(nn.Module):
    """(input_ids, encoder_attention_mask, *past K/V) -> logits, present self-attention K/V.

    `past` is flat, in spec order: cross K/V of layers 0..n-1, then self K/V of 0..n-1.
    """

    def __init__(self, model: Transformer):
        super().__init__()
        self.model = model

    def forward(self, input_ids, encoder_attention_mask, *past):
        dec = self.model.decoder
        n = len(dec.layers)
        cross, self_past = past[: 2 * n], past[2 * n :]
        t = input_ids.shape[1]
        past_len = self_past[0].shape[2]
        x = dec.pe(dec.embedding(input_ids), start=past_len)  # (b, t, d)
        # query i sits at absolute position past_len + i and sees keys 0..past_len + i
        q_pos = torch.arange(t, device=x.device) + past_len
        k_pos = torch.arange(past_len + t, device=x.device)
        causal = k_pos[None, :] <= q_pos[:, None]  # (t, past_len + t)
        cross_mask = encoder_attention_mask[:, None, None, :]  # (b, 1, 1, s)
        presents = []
        for i, layer in enumerate(dec.layers):
            sa = layer.self_attn
            K = torch.cat([self_past[2 * i], sa.split_heads(sa.W_k(x))], dim=2)  # (b, h, past+t, k)
            V = torch.cat([self_past[2 * i + 1], sa.split_heads(sa.W_v(x))], dim=2)
            presents += [K, V]
            x = _attend(sa, x, K, V, causal)
            x = _attend(layer.cross_attn, x, cross[2 * i], cross[2 * i + 1], cross_mask)
            x = layer.ffn(x)
        return (dec.fc_out(x), *presents)


def example_inputs(config, specs: dict[str, GraphSpec], dtype: torch.dtype, batch=2, src_len=5,
                   tgt_len=3, past_len=4):
    """Inputs for tracing; sizes >= 2 and all different so no dim is specialised."""
    h, k = config.n_heads, config.head_dim
    enc = (torch.randint(1, config.src_vocab_size, (batch, src_len)),
           torch.ones(batch, src_len, dtype=torch.int64))
    past = []
    for name in specs["decoder"].input_names[2:]:
        length = src_len if ".encoder." in name else past_len
        past.append(torch.randn(batch, h, length, k, dtype=dtype))
    dec = (torch.randint(1, config.tgt_vocab_size, (batch, tgt_len)),
           torch.ones(batch, src_len, dtype=torch.int64), *past)
    return enc, dec


def export_transformer(ckpt, preset: str | None, out, *, opset: int = DEFAULT_OPSET, dtype: str = "float32",
                       overwrite: bool = False, tokenizer: dict | None = None):
    """Write encoder.onnx, decoder.onnx and manifest.json for a loaded checkpoint."""
    specs = specs_for(ckpt.config, dtype)
    model = model_in_dtype(ckpt.model, dtype)
    enc_args, dec_args = example_inputs(ckpt.config, specs, torch_dtype(dtype))

    def build(tmp):
        with torch.no_grad():
            with step("exporting encoder"):
                export_graph(EncoderGraph(model), enc_args, specs["encoder"], tmp / "encoder.onnx", opset,
                             dynamic_shapes_for(specs["encoder"]))
            with step("exporting decoder"):
                export_graph(DecoderGraph(model), dec_args, specs["decoder"], tmp / "decoder.onnx", opset,
                             dynamic_shapes_for(specs["decoder"], varargs_from=2))

    return write_artifact(out, overwrite, ckpt, preset, specs, build, opset=opset, dtype=dtype,
                          options={}, tokenizer=tokenizer)
