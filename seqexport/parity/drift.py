"""State drift of a quantised recurrent model over a long decode (validate's `state_drift` check).

A quantised copy whose state drifts is what users of quantised SSMs report: greedy tokens stay
right for a while, then the state the model carries has wandered off (int8 state collapsed a
Mamba's GSM8K score from 81% to 41%, vllm#55196). Top-1 agreement over a few dozen tokens does
not see it; the state itself does. So: the quantised graphs decode `DRIFT_STEPS` random tokens
one step at a time (the step graph, as generation runs it), the float32 eager model takes the
same tokens (its sequential reference), and every replaced state tensor (`state.kinds_of`: the
Mamba conv/SSM states, RWKV-7's shifts and WKV state) is compared over the last `WINDOW` steps:

    drift = max over rows of ‖quantised − eager‖₂ / ‖eager‖₂     (the window's states stacked;
                                                                   per tensor, per layer)

judged against `QuantRule.max_drift`. Measured on this machine (AVX-512 VNNI), 256 steps, batch
2: int8 copies 0.001-0.030 (bundled Mamba / RWKV-7 over eight seeds, the tiny presets), int4
(block 32, accuracy level 4) 0.005-0.189: the largest in the last layers of Mamba 130m's conv
state (each layer's int4 noise adds up along the residual stream: 0.07 at layer 0, 0.19 at 23)
and in the bundled RWKV-7's last ffn shift. The drift does not grow with length (bundled Mamba
int4, last step alone: 0.087 at 32 steps, 0.098 at 256, 0.073 at 1024): quantisation noise,
not accumulation. A copy with layer 1's in_proj scales 1.3x too large drifts 0.36-0.37 there,
1.45x 0.56-0.58. Bounds (`checks.QuantRule`): int8 0.1, 3.3x the worst measured, since AVX2
machines without VNNI compute int8 products otherwise (saturating 16-bit pair sums); int4 0.3,
1.6x, since its products cannot saturate and differ in rounding only.
"""

import re

import numpy as np

from seqexport.parity.report import Case
from seqexport.state import kinds_of

DRIFT_STEPS = 256
# the states of the last WINDOW steps are compared together: a token-shift state is one token's
# activations, whose relative error alone swings with the token (bundled RWKV-7 int4, last step
# only: 0.12-0.53 over seeds; over the last 16 steps: see checks.QuantRule)
WINDOW = 16


def recurrent_states(rt) -> list[str]:
    """The state inputs some graph of the model replaces whole each step (its own feeds)."""
    names = []
    for spec in rt.specs.values():
        names += [n for n, kind in kinds_of(spec).items() if kind == "replaced" and n not in names]
    return names


def relative_drift(got: np.ndarray, ref: np.ndarray) -> float:
    """The worst row's ‖got − ref‖₂ / ‖ref‖₂ (inf for NaN/Inf)."""
    b = ref.shape[0]
    g, r = got.reshape(b, -1).astype(np.float64), ref.reshape(b, -1).astype(np.float64)
    if not np.isfinite(g).all():
        return float("inf")
    return float(np.max(np.linalg.norm(g - r, axis=1) / np.maximum(np.linalg.norm(r, axis=1), 1e-30)))


def layer_of(name: str) -> str:
    """`past_ssm_state.3` -> "layer 3" (the first index in the name); the name itself otherwise."""
    m = re.search(r"\.(\d+)(?:\.|$)", name)
    return f"layer {m.group(1)}" if m else name


def state_drift(rt, cases, rng: np.random.Generator, max_drift: float, steps: int = DRIFT_STEPS,
                window: int = WINDOW) -> list[Case]:
    """One case per layer: each recurrent state tensor's drift over the last `window` of `steps`
    one-token steps of the quantised graphs against the float32 eager model on the same random
    tokens."""
    names = recurrent_states(rt)
    if not names:
        return []
    start = cases.start_args()
    tokens = rng.integers(1, rt.vocab_size, (cases.batch, steps))  # (b, steps)
    state, got = rt.start(*start), []
    for t in range(steps):
        _, state = rt.step(tokens[:, t : t + 1], state)
        if t >= steps - window:
            arrays = state.numpy().arrays
            got.append({n: np.array(arrays[n]) for n in names})  # copies: the runtime may reuse its buffers
    eager = cases.eager(cache=True)
    _, ref_state = eager.step(tokens[:, : steps - window], eager.start(*start))  # the sequential reference
    ref = []
    for t in range(steps - window, steps):
        _, ref_state = eager.step(tokens[:, t : t + 1], ref_state)
        ref.append(ref_state.arrays)
    layers: dict[str, dict[str, float]] = {}
    for name in names:  # (b, window, ...) each: one vector per row over the window's states
        q, f = (np.stack([s[name] for s in states], 1) for states in (got, ref))
        layers.setdefault(layer_of(name), {})[name] = relative_drift(q, f)
    out = []
    for layer, drift in layers.items():
        worst = max(drift, key=drift.get)
        ok = drift[worst] <= max_drift
        label = f"{layer}: " + ", ".join(f"{_short(n)} {d:.2%}" for n, d in drift.items())
        note = (f"steps {steps - window + 1}-{steps}, worst {worst} {drift[worst]:.2%} "
                + (f"<= {max_drift:.0%}" if ok else f"> the {max_drift:.0%} bound: the state drifts"))
        out.append(Case("state_drift", label, note=note, ok=ok))
    return out


def _short(name: str) -> str:
    """`past_ssm_state.3` -> `ssm_state`: the layer is in the case's label."""
    return re.sub(r"^(past_|past_key_values\.\d+\.)|\.\d+$", "", name)
