"""The encoder-decoder Transformer of the study notes: encoder.onnx + decoder.onnx with an
explicit KV cache. The declaration the registry reads (torch-free); see `families.base`."""

import click

from seqexport.families.attention import ATTENTIONS
from seqexport.families.base import Family

FAMILY = Family(
    name="transformer",
    package=__name__,
    graphs=("encoder", "decoder"),
    presets={
        "tiny": dict(src_vocab_size=100, tgt_vocab_size=100, d_model=64, n_heads=4, d_ff=128,
                     num_layers=2, max_len=512),
        # the notes' sizes (Transformer-base)
        "base": dict(src_vocab_size=10000, tgt_vocab_size=10000, d_model=512, n_heads=8,
                     d_ff=2048, num_layers=6, max_len=5000),
    },
    config_fields=dict(src_vocab_size=1, tgt_vocab_size=1, d_model=1, n_heads=1, num_layers=1, max_len=1,
                       pad_id=0),
    bundled="transformer-dates",
    export_options=(
        click.option("--attention", type=click.Choice(ATTENTIONS), default="matmul", show_default=True,
                     help="The decoder's attention: MatMul + Softmax nodes, or ONNX's fused Attention "
                          "(opset 23; a lower --opset is raised to 23)."),
    ),
    summary="Export an encoder-decoder Transformer: encoder.onnx + decoder.onnx (explicit KV cache).",
)
