"""Batching helpers shared by every family's training task."""

from collections.abc import Sequence

import torch
from torch import Tensor


def pad_batch(rows: Sequence[Sequence[int]], pad_id: int) -> Tensor:
    """Right-pad lists of ids to one (b, t) int64 tensor."""
    width = max(len(r) for r in rows)
    return torch.tensor([list(r) + [pad_id] * (width - len(r)) for r in rows], dtype=torch.long)
