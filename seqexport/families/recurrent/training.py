"""The date task framed for a decoder-only LM: bos + "<input> = <output>" + eos; the loss covers
only the output bytes and the eos (the prompt is given at decode time). A family's training
module adds its bundled shape and schedule (`CONFIG`, `STEPS`, `LR`).
Dimension letters: b batch, t sequence length, v vocabulary.
"""

from collections.abc import Sequence

import torch.nn.functional as F
from torch import Tensor, nn

from seqexport.runtime.tokenizer import ByteTokenizer
from seqexport.training.batches import pad_batch

SEPARATOR = " = "  # between input and output
# How the runtime frames a text prompt (recorded in the tokenizer; see runtime.tokenizer.encode_prompt).
PROMPT = {"bos": True, "suffix": SEPARATOR, "eos": False}


def prompt_ids(text: str, tok: ByteTokenizer) -> list[int]:
    """The ids the model is given at decode time: bos + input + " = "."""
    return tok.encode(text + SEPARATOR, add_bos=True)


def make_batch(pairs: Sequence[tuple[str, str]], tok: ByteTokenizer) -> tuple[Tensor, Tensor]:
    """pairs -> ids (b, t) and targets (b, t): targets are the next ids, pad over the prompt.
    Padding goes after each row's end, so it never enters a recurrent state before a real token."""
    ids, targets = [], []
    for x, y in pairs:
        prompt = prompt_ids(x, tok)
        answer = tok.encode(y, add_eos=True)
        seq = prompt + answer
        ids.append(seq[:-1])
        targets.append([tok.pad_id] * (len(prompt) - 1) + answer)
    return pad_batch(ids, tok.pad_id), pad_batch(targets, tok.pad_id)


def loss(model: nn.Module, batch: tuple[Tensor, Tensor], pad_id: int) -> Tensor:
    """Cross-entropy of the model's forward ((logits, state)) against the targets."""
    ids, targets = batch
    logits, _ = model(ids)  # (b, t, v)
    return F.cross_entropy(logits.flatten(0, 1), targets.flatten(), ignore_index=pad_id)
