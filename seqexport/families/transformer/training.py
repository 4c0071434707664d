"""The date task framed for the encoder-decoder Transformer (the bundled checkpoint).

src = input + eos, tgt = bos + output + eos; teacher forcing on tgt[:, :-1] -> tgt[:, 1:];
source padding hidden by `padding_mask` (as src_mask and memory_mask), `generate_mask` as
tgt_mask. Dimension letters: b batch, s source length, t target length, v vocabulary.
"""

from collections.abc import Sequence

import torch.nn.functional as F
from torch import Tensor

from seqexport.models.transformer import Transformer, TransformerConfig, generate_mask, padding_mask
from seqexport.runtime.tokenizer import ByteTokenizer
from seqexport.training.batches import pad_batch

# The shape of the bundled model (a few MB) and its training schedule.
CONFIG = TransformerConfig(
    src_vocab_size=259, tgt_vocab_size=259, d_model=128, n_heads=4, d_ff=256,
    num_layers=2, dropout=0.0, max_len=64, pad_id=0,
)  # fmt: skip
STEPS, LR = 3000, 1e-3
PROMPT = None  # the family's default framing: input + eos


def make_batch(pairs: Sequence[tuple[str, str]], tok: ByteTokenizer) -> tuple[Tensor, Tensor]:
    """pairs -> src (b, s) = input + eos, tgt (b, t) = bos + output + eos, both right-padded."""
    src = pad_batch([tok.encode(x, add_eos=True) for x, _ in pairs], tok.pad_id)
    tgt = pad_batch([tok.encode(y, add_bos=True, add_eos=True) for _, y in pairs], tok.pad_id)
    return src, tgt


def loss(model: Transformer, batch: tuple[Tensor, Tensor], pad_id: int) -> Tensor:
    src, tgt = batch
    tgt_in, tgt_out = tgt[:, :-1], tgt[:, 1:]  # (b, t - 1) each
    src_mask = padding_mask(src, pad_id)  # (b, 1, 1, s)
    logits = model(src, tgt_in, src_mask, generate_mask(tgt_in.size(1)), src_mask)  # (b, t - 1, v)
    return F.cross_entropy(logits.flatten(0, 1), tgt_out.flatten(), ignore_index=pad_id)
