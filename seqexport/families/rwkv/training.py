"""The date task framed for an RWKV-7 LM (the bundled checkpoint): bos + "<input> = <output>" +
eos; the loss covers only the output bytes and the eos (the prompt is given at decode time).
Dimension letters: b batch, t sequence length, v vocabulary.
"""

from collections.abc import Sequence

import torch.nn.functional as F
from torch import Tensor

from seqexport.models.rwkv import RwkvConfig, RwkvLM
from seqexport.runtime.tokenizer import ByteTokenizer
from seqexport.training.batches import pad_batch

# ≈0.5M parameters: 2 layers of width 128 in 4 heads of 32
CONFIG = RwkvConfig(n_embd=128, n_layer=2, vocab_size=259, head_size=32)
STEPS, LR = 1500, 2e-3
SEPARATOR = " = "  # between input and output
# How the runtime frames a text prompt (recorded in the tokenizer; see runtime.tokenizer.encode_prompt).
PROMPT = {"bos": True, "suffix": SEPARATOR, "eos": False}


def prompt_ids(text: str, tok: ByteTokenizer) -> list[int]:
    """The ids the model is given at decode time: bos + input + " = "."""
    return tok.encode(text + SEPARATOR, add_bos=True)


def make_batch(pairs: Sequence[tuple[str, str]], tok: ByteTokenizer) -> tuple[Tensor, Tensor]:
    """pairs -> ids (b, t) and targets (b, t): targets are the next ids, pad over the prompt.
    Padding goes after each row's end, so it never enters the state before a real token."""
    ids, targets = [], []
    for x, y in pairs:
        prompt = prompt_ids(x, tok)
        answer = tok.encode(y, add_eos=True)
        seq = prompt + answer
        ids.append(seq[:-1])
        targets.append([tok.pad_id] * (len(prompt) - 1) + answer)
    return pad_batch(ids, tok.pad_id), pad_batch(targets, tok.pad_id)


def loss(model: RwkvLM, batch: tuple[Tensor, Tensor], pad_id: int) -> Tensor:
    ids, targets = batch
    logits, _ = model(ids)  # (b, t, v)
    return F.cross_entropy(logits.flatten(0, 1), targets.flatten(), ignore_index=pad_id)
