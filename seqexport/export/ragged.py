"""Prompts of unequal length in one prefill run: rows right-padded, with an attention_mask
(b, l) of 1s for a row's tokens, then 0s.

No padding may enter a recurrent state, and the model's own forward knows nothing of
padding (it stays the one traced: model files hold no export code). The export-side wrapper
around it therefore
- freezes the recurrence past each row's end: the scan function it hands the model masks
  the scan's inputs there (a Mamba Δ of 0, an RWKV-7 decay of 1 with no key: the state
  passes through unchanged, exactly);
- reads each row's shift / conv inputs at the row's own end, from the outputs of the modules
  a state is made of (forward hooks; the model's own states are those at the padded end);
- rotates each row's final hidden states so that its last token comes last, before the head:
  `logits_to_keep`'s Slice (export.common.keep_last_positions) then takes each row's last
  tokens. Rows without padding are not moved; positions past a row's end hold values of no
  meaning (the runtime asks for the last position only).
Padding is causal-safe: a position never reads a later one (conv, token shift, scan).
"""

import contextlib

import torch
from torch import Tensor, nn


def row_lengths(mask: Tensor) -> Tensor:
    """(b, l) 1s then 0s -> (b,) int64 tokens per row."""
    return mask.to(torch.int64).sum(1)


def valid(mask: Tensor, like: Tensor) -> Tensor:
    """The mask as `like`'s dtype, shaped (b, l, 1, ...) to broadcast against it."""
    return mask.to(like.dtype).reshape(mask.shape + (1,) * (like.dim() - 2))


def at_ends(x: Tensor, ends: Tensor, count: int, axis: int) -> Tensor:
    """Each row's `count` positions along `axis` that end just before ends[r] (exclusive):
    x (b, ..., l, ...) -> (b, ..., count, ...)."""
    positions = ends[:, None] - count + torch.arange(count, device=x.device)  # (b, count)
    shape = [1] * x.dim()
    shape[0], shape[axis] = x.shape[0], count
    index = positions.reshape(shape).expand(*[count if i == axis else s for i, s in enumerate(x.shape)])
    return torch.gather(x, axis, index)


def conv_window_at_ends(conv_state: Tensor, inputs: Tensor, lengths: Tensor) -> Tensor:
    """A causal conv's new state per row: its last k inputs up to the row's own end (a model's
    forward takes them at the padded end). conv_state (b, c, k) before the tokens, inputs
    (b, c, l) the conv's inputs for them, lengths (b,) -> (b, c, k)."""
    k = conv_state.shape[2]
    x_cat = torch.cat([conv_state.to(inputs.dtype), inputs], dim=-1)  # (b, c, k + l)
    return at_ends(x_cat, lengths + k, k, axis=2)


def last_token_last(x: Tensor, lengths: Tensor) -> Tensor:
    """x (b, l, c) with row r rotated along l so that its position lengths[r] - 1 comes last."""
    length = x.shape[1]
    index = torch.arange(length, device=x.device)[None, :] + lengths[:, None]  # (b, l)
    index = torch.where(index >= length, index - length, index)  # mod l (ONNX export takes no Mod by a dim)
    return torch.gather(x, 1, index[:, :, None].expand(x.shape))


@contextlib.contextmanager
def outputs_of(modules: list[nn.Module]):
    """The outputs of these modules' calls, in call order, while the context lasts."""
    seen: list[Tensor] = []
    handles = [m.register_forward_hook(lambda _m, _args, out: seen.append(out)) for m in modules]
    try:
        yield seen
    finally:
        for h in handles:
            h.remove()


@contextlib.contextmanager
def rotated_output(module: nn.Module, lengths: Tensor):
    """While the context lasts, `module`'s output (b, l, c) comes out `last_token_last`."""
    handle = module.register_forward_hook(lambda _m, _args, out: last_token_last(out, lengths))
    try:
        yield
    finally:
        handle.remove()
