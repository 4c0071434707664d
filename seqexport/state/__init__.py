"""State kinds: what a graph's state inputs are, and every operation on them written once per kind.

    appended   a buffer (b, ..., past_len, ...) with per-row valid lengths (the graph's
               `lengths` input); the graph reads every slot, masked, and returns only the new
               positions, written in place at each row's length (attention self-K/V)
    replaced   tensors the graph returns whole each step (Mamba conv/SSM, RWKV shifts/WKV)
    static     computed once per request by another graph and only read afterwards, ragged
               along a source axis with a 0/1 mask over it (cross-attention K/V)

A graph spec declares the kinds with what it already says: an input its `appends` write is
appended, one its own `feeds` replace is replaced, any other state input (fed by another graph)
is static. A family composes kinds by declaring its specs; `StateLayout` does the rest:
allocation, rows joining and leaving (join / take / extend / retain), in-place writes, branch
copies, memory accounting. numpy only.

    appended.py  the appended buffer: capacities, growth, in-place writes of new positions
    rows.py      moving and copying rows of (b, ...) arrays in place (the engine's joins and leaves)
    layout.py    StateLayout: one graph's state inputs by kind, and the operations on a whole state
"""

from seqexport.state.layout import KINDS, StateLayout, kinds_of

__all__ = ["KINDS", "StateLayout", "kinds_of"]
