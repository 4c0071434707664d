"""The admission policy: whether one more request may join the running batch, and which
newcomers an empty batch prefills together. Pure functions of counts and prompts (no model
runs here, no threads)."""

from dataclasses import dataclass

from seqexport.runtime.engine.request import Request


@dataclass(frozen=True)
class Limits:
    """The caps a round admits under."""

    max_rows: int
    max_state_bytes: int | None
    continuous_batching: bool  # rows of the model may sit at different positions


def room(limits: Limits, rows: int, state_bytes: int, pending: int, running: int) -> bool:
    """Whether one more waiting request may join `rows` running ones, `pending` others already
    joining this round (`running`: the rows there before this round)."""
    if rows + pending >= limits.max_rows:
        return False
    if running and not limits.continuous_batching:
        return False  # rows of this model must start together: wait for an empty batch
    if limits.max_state_bytes is None:
        return True
    if not rows:
        return pending == 0  # nothing to measure a row by: one newcomer, measured next round
    return state_bytes + state_bytes / rows * (pending + 1) <= limits.max_state_bytes  # average rows


def by_start(reqs: list[Request]) -> dict[int | None, list[Request]]:
    """Requests grouped by their decoder start token (a transformer's; None: the default)."""
    groups: dict[int | None, list[Request]] = {}
    for req in reqs:
        groups.setdefault(req.options.start_id, []).append(req)
    return groups


def pads_little(group: list[Request], newcomer: Request) -> bool:
    """Whether `newcomer` may join a prefill run of `group`: its rows are padded to the longest
    prompt, and the padding may at most equal the prompts' own tokens."""
    lengths = [len(r.prompt) for r in group] + [len(newcomer.prompt)]
    return len(lengths) * max(lengths) <= 2 * sum(lengths)


def first_prefill(newcomers: list[Request], ragged_prefill: bool) -> list[Request]:
    """The newcomers an empty batch prefills at once: where the model takes prompts of unequal
    length in one run, the first and those that pad little beside it; else the largest group
    of one length (and start token)."""
    if ragged_prefill:
        first = [newcomers[0]]
        for req in newcomers[1:]:
            if pads_little(first, req):
                first.append(req)
        return first
    by_len: dict[tuple, list[Request]] = {}
    for req in newcomers:
        by_len.setdefault((len(req.prompt), req.options.start_id), []).append(req)
    return max(by_len.values(), key=len)
