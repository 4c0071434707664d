"""An RWKV-7 "Goose" (x070) language model in plain PyTorch.

Pieces, smallest first: the sequential reference WKV-7 recurrence -> TimeMix ->
ChannelMix -> Block -> RwkvConfig -> RwkvLM. Parameter names and shapes are those of
BlinkDL's RWKV-7 `.pth` releases (`emb.weight`, `blocks.{i}.att.*`, `blocks.{i}.ffn.*`,
`ln_out.*`, `head.weight`), so those checkpoints load as they are.

Dimension letters (reused as ONNX dim names and runtime names):
    b     batch
    l     sequence length
    c     n_embd, width of the residual stream           (C)
    h     heads, c / head_size                           (H)
    n     head_size                                      (N)
    f     d_ffn, channel-mix width (4c in the releases)
    v     vocabulary size
    dw, da, dv, dg   ranks of the decay, in-context rate, value-residual and gate LoRAs

Recurrent state, per layer (returned new, never written in place, so that every entry
point traces and exports):
    att_shift  (b, c)        the time mix's input at the last token (token shift)
    wkv        (b, h, n, n)  the WKV matrix state S per head, (value, key) indexed; float32
    ffn_shift  (b, c)        the channel mix's input at the last token

Per head and token, with w the decay, κ̂ = normalize(k·k_k), a the in-context rate:
    S = S·(diag(w) + (-κ̂)ᵀ(a·κ̂)) + vᵀk          (S is (n_v, n_k))
    y = S·r
The WKV recurrence, the decay and ln_x (GroupNorm per head) are float32 whatever the
module dtype.
"""

import math
from collections.abc import Callable
from dataclasses import dataclass

import torch
from seqexport.models.config import DictConfig
from torch import Tensor, nn

# (att_shift, wkv, ffn_shift) of one layer, and the list of them over layers.
LayerState = tuple[Tensor, Tensor, Tensor]
Wkv = Callable[..., tuple[Tensor, Tensor]]

DECAY_SCALE = math.exp(-0.5)  # w = exp(-e^-0.5 · sigmoid(·)): every decay lies in (e^-0.607, 1)


def wkv7_ref(r: Tensor, w: Tensor, k: Tensor, v: Tensor, a: Tensor, b: Tensor, s0: Tensor) -> tuple[Tensor, Tensor]:
    """The WKV-7 recurrence, one token after another: the reference to trust.

    For t = 0 .. l-1, starting from S = s0, per batch row and head:
        S   = S·diag(w_t) + (S·a_tᵀ)·b_t + v_tᵀ·k_t
        y_t = S·r_tᵀ
    (RWKV-7 calls it with a = -κ̂ and b = κ̂·a.)

    Args:
        r, w, k, v, a, b: (b, l, h, n) float32; w in (0, 1)
        s0:               (b, h, n, n) float32, the state before the first token
    Returns:
        y (b, l, h, n) and the state after the last token (b, h, n, n).
    """
    s = s0
    ys = []
    for t in range(r.shape[1]):
        r_t, w_t, k_t, v_t, a_t, b_t = (x[:, t] for x in (r, w, k, v, a, b))  # (b, h, n) each
        sa = s @ a_t.unsqueeze(-1)  # (b, h, n, 1)
        s = s * w_t.unsqueeze(-2) + sa @ b_t.unsqueeze(-2) + v_t.unsqueeze(-1) @ k_t.unsqueeze(-2)  # (b, h, n, n)
        ys.append((s @ r_t.unsqueeze(-1)).squeeze(-1))  # (b, h, n)
    y = torch.stack(ys, dim=1) if ys else torch.zeros_like(r)  # (b, l, h, n)
    return y, s


def _lora_rank(c: int, factor: float, power: float) -> int:
    """BlinkDL's suggested LoRA rank: factor · c^power rounded to a multiple of 32, at least 32."""
    return max(32, int(round(factor * c**power / 32) * 32))


@dataclass
class RwkvConfig(DictConfig):
    n_embd: int = 64  # width of the residual stream (c)
    n_layer: int = 2  # number of blocks
    vocab_size: int = 100  # embedding rows and logits
    head_size: int = 16  # n; heads h = n_embd / head_size
    d_ffn: int | None = None  # channel-mix width (f); None -> 4 · n_embd
    d_decay: int | None = None  # rank of the decay LoRA (w1, w2); None -> BlinkDL's suggestion
    d_aaa: int | None = None  # rank of the in-context-rate LoRA (a1, a2); None -> suggestion
    d_mv: int | None = None  # rank of the value-residual LoRA (v1, v2); None -> suggestion
    d_gate: int | None = None  # rank of the gate LoRA (g1, g2); None -> suggestion
    layer_norm_eps: float = 1e-5  # ln0, ln1, ln2, ln_out
    ln_x_eps: float = 64e-5  # the per-head GroupNorm after the WKV (as the x070 releases)

    def __post_init__(self):
        for name in ("n_embd", "n_layer", "vocab_size", "head_size"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"RwkvConfig.{name} must be a positive int, got {value!r}")
        for name in ("d_ffn", "d_decay", "d_aaa", "d_mv", "d_gate"):
            value = getattr(self, name)
            if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < 1):
                raise ValueError(f"RwkvConfig.{name} must be a positive int or None, got {value!r}")
        if self.n_embd % self.head_size:
            raise ValueError(f"RwkvConfig.n_embd {self.n_embd} is not a multiple of head_size {self.head_size}")
        for name in ("layer_norm_eps", "ln_x_eps"):
            if not getattr(self, name) > 0:
                raise ValueError(f"RwkvConfig.{name} must be > 0, got {getattr(self, name)!r}")

    @property
    def n_head(self) -> int:
        return self.n_embd // self.head_size

    @property
    def ffn_width(self) -> int:
        return self.d_ffn or 4 * self.n_embd

    @property
    def ranks(self) -> dict[str, int]:
        """LoRA ranks: decay (w), in-context rate (a), value residual (v), gate (g)."""
        c = self.n_embd
        return {"w": self.d_decay or _lora_rank(c, 1.8, 0.5), "a": self.d_aaa or _lora_rank(c, 1.8, 0.5),
                "v": self.d_mv or _lora_rank(c, 1.3, 0.5), "g": self.d_gate or _lora_rank(c, 0.6, 0.8)}


def _shifted(x: Tensor, shift: Tensor) -> Tensor:
    """x (b, l, c) and the input before it (b, c) -> the previous token's input (b, l, c)."""
    return torch.cat([shift.to(x.dtype).unsqueeze(1), x[:, :-1]], dim=1)


def _vec(c: int) -> nn.Parameter:
    """A per-channel parameter in the releases' (1, 1, c) shape."""
    return nn.Parameter(torch.zeros(1, 1, c))


class TimeMix(nn.Module):
    """RWKV-7 time mixing: token shift, r/w/k/v/a/g, WKV-7, GroupNorm per head, bonus, gate."""

    def __init__(self, config: RwkvConfig, layer_id: int):
        super().__init__()
        c, ranks = config.n_embd, config.ranks
        self.layer_id, self.n_head, self.head_size, self.ln_x_eps = layer_id, config.n_head, config.head_size, config.ln_x_eps
        self.x_r, self.x_w, self.x_k, self.x_v, self.x_a, self.x_g = (_vec(c) for _ in range(6))
        self.w0, self.w1, self.w2 = _vec(c), nn.Parameter(torch.zeros(c, ranks["w"])), nn.Parameter(torch.zeros(ranks["w"], c))
        self.a0, self.a1, self.a2 = _vec(c), nn.Parameter(torch.zeros(c, ranks["a"])), nn.Parameter(torch.zeros(ranks["a"], c))
        if layer_id > 0:  # the first layer's v is the residual every later layer mixes in
            self.v0, self.v1, self.v2 = _vec(c), nn.Parameter(torch.zeros(c, ranks["v"])), nn.Parameter(torch.zeros(ranks["v"], c))
        self.g1, self.g2 = nn.Parameter(torch.zeros(c, ranks["g"])), nn.Parameter(torch.zeros(ranks["g"], c))
        self.k_k, self.k_a = _vec(c), _vec(c)
        self.r_k = nn.Parameter(torch.zeros(config.n_head, config.head_size))
        self.receptance = nn.Linear(c, c, bias=False)
        self.key = nn.Linear(c, c, bias=False)
        self.value = nn.Linear(c, c, bias=False)
        self.output = nn.Linear(c, c, bias=False)
        self.ln_x = nn.GroupNorm(config.n_head, c, eps=config.ln_x_eps)

    def forward(self, x: Tensor, shift: Tensor, wkv: Tensor, v_first: Tensor | None,
                scan: Wkv = wkv7_ref) -> tuple[Tensor, Tensor, Tensor, Tensor]:
        """Run l >= 1 tokens on from a given state.

        Args:
            x:       (b, l, c) the block's ln1 output
            shift:   (b, c) ln1 output at the token before these
            wkv:     (b, h, n, n) float32
            v_first: (b, l, c) the first layer's v (None in the first layer)
            scan:    a function with the signature of `wkv7_ref`
        Returns:
            out (b, l, c), new shift (b, c), new wkv (b, h, n, n) float32, v_first (b, l, c).
        """
        bsz, length, c = x.shape
        h, n = self.n_head, self.head_size
        xx = _shifted(x, shift) - x  # (b, l, c)
        xr, xw, xk, xv, xa, xg = (x + xx * m for m in (self.x_r, self.x_w, self.x_k, self.x_v, self.x_a, self.x_g))
        r = self.receptance(xr)
        w = torch.tanh(xw @ self.w1) @ self.w2
        k = self.key(xk)
        v = self.value(xv)
        a = torch.sigmoid(self.a0 + (xa @ self.a1) @ self.a2)  # in-context learning rate
        g = torch.sigmoid(xg @ self.g1) @ self.g2

        kk = (k * self.k_k).view(bsz, length, h, n)  # (b, l, h, n)
        kk = (kk / kk.norm(dim=-1, keepdim=True).clamp_min(1e-12)).view(bsz, length, c)  # κ̂, unit per head
        k = k * (1 + (a - 1) * self.k_a)
        if v_first is None:
            v_first = v
        else:
            v = v + (v_first - v) * torch.sigmoid(self.v0 + (xv @ self.v1) @ self.v2)
        w = torch.exp(-DECAY_SCALE * torch.sigmoid((self.w0 + w).float()))  # (b, l, c) float32, in (0, 1)

        def heads(t: Tensor) -> Tensor:  # (b, l, c) -> (b, l, h, n) float32
            return t.float().view(bsz, length, h, n)

        y, new_wkv = scan(heads(r), heads(w), heads(k), heads(v), heads(-kk), heads(kk * a), wkv.float())
        # ln_x: GroupNorm with one group per head, in float32
        mean = y.mean(-1, keepdim=True)
        var = (y - mean).pow(2).mean(-1, keepdim=True)
        y = ((y - mean) * torch.rsqrt(var + self.ln_x_eps)).reshape(bsz, length, c)  # (b, l, c)
        y = (y * self.ln_x.weight.float() + self.ln_x.bias.float()).to(x.dtype)
        bonus = (heads(r * k) * self.r_k.float()).sum(-1, keepdim=True) * heads(v)  # (b, l, h, n)
        y = y + bonus.reshape(bsz, length, c).to(x.dtype)
        return self.output(y * g), x[:, -1], new_wkv, v_first


class ChannelMix(nn.Module):
    """RWKV-7 channel mixing: token shift, relu², value."""

    def __init__(self, config: RwkvConfig):
        super().__init__()
        self.x_k = _vec(config.n_embd)
        self.key = nn.Linear(config.n_embd, config.ffn_width, bias=False)
        self.value = nn.Linear(config.ffn_width, config.n_embd, bias=False)

    def forward(self, x: Tensor, shift: Tensor) -> tuple[Tensor, Tensor]:
        """x (b, l, c), shift (b, c) -> out (b, l, c), new shift (b, c)."""
        k = x + (_shifted(x, shift) - x) * self.x_k
        return self.value(torch.relu(self.key(k)) ** 2), x[:, -1]


class Block(nn.Module):
    """x + att(ln1(x)), then + ffn(ln2(x)); the first block normalises the embedding (ln0)."""

    def __init__(self, config: RwkvConfig, layer_id: int):
        super().__init__()
        c, eps = config.n_embd, config.layer_norm_eps
        if layer_id == 0:
            self.ln0 = nn.LayerNorm(c, eps=eps)
        self.ln1, self.ln2 = nn.LayerNorm(c, eps=eps), nn.LayerNorm(c, eps=eps)
        self.att = TimeMix(config, layer_id)
        self.ffn = ChannelMix(config)

    def forward(self, x: Tensor, state: LayerState, v_first: Tensor | None,
                scan: Wkv = wkv7_ref) -> tuple[Tensor, LayerState, Tensor]:
        """x (b, l, c) -> (b, l, c), the layer's new state, v_first (b, l, c)."""
        att_shift, wkv, ffn_shift = state
        if hasattr(self, "ln0"):
            x = self.ln0(x)
        out, att_shift, wkv, v_first = self.att(self.ln1(x), att_shift, wkv, v_first, scan=scan)
        x = x + out
        out, ffn_shift = self.ffn(self.ln2(x), ffn_shift)
        return x + out, (att_shift, wkv, ffn_shift), v_first


class RwkvLM(nn.Module):
    """RWKV-7 language model: embedding -> blocks -> ln_out -> head (untied).

    State-dict keys are those of BlinkDL's `.pth` releases: `emb.weight`, `blocks.0.ln0.*`,
    `blocks.{i}.ln1|ln2.*`, `blocks.{i}.att.{x_r, x_w, x_k, x_v, x_a, x_g, w0, w1, w2, a0, a1,
    a2, v0, v1, v2 (not in layer 0), g1, g2, k_k, k_a, r_k, receptance, key, value, output,
    ln_x}`, `blocks.{i}.ffn.{x_k, key, value}`, `ln_out.*`, `head.weight`.

    Logits are float32: (b, l, vocab_size).
    """

    def __init__(self, config: RwkvConfig):
        super().__init__()
        self.config = config
        self.emb = nn.Embedding(config.vocab_size, config.n_embd)
        self.blocks = nn.ModuleList([Block(config, i) for i in range(config.n_layer)])
        self.ln_out = nn.LayerNorm(config.n_embd, eps=config.layer_norm_eps)
        self.head = nn.Linear(config.n_embd, config.vocab_size, bias=False)
        self._init_weights()

    @torch.no_grad()
    def _init_weights(self):
        # After BlinkDL's x070 init (lerps ramped over depth and channels, decays spread over
        # channels, value residual on, k_k 0.85), but with small random projections and LoRAs
        # everywhere instead of zeros, so that every parameter moves the logits from the start.
        cfg = self.config
        c, n_layer = cfg.n_embd, cfg.n_layer
        ramp = torch.arange(c, dtype=torch.float32) / c  # (c,)
        nn.init.uniform_(self.emb.weight, -0.01, 0.01)  # ln0 rescales it
        nn.init.normal_(self.head.weight, std=c**-0.5)  # logits of unit scale after ln_out
        for i, block in enumerate(self.blocks):
            att, ffn = block.att, block.ffn
            r0 = i / max(1, n_layer - 1)  # 0 .. 1
            r1 = 1.0 - i / n_layer  # 1 .. ~0
            att.x_r.copy_(1.0 - ramp.pow(0.2 * r1))
            att.x_w.copy_(1.0 - ramp.pow(0.9 * r1))
            att.x_k.copy_(1.0 - ramp.pow(0.7 * r1))
            att.x_v.copy_(1.0 - ramp.pow(0.7 * r1))
            att.x_a.copy_(1.0 - ramp.pow(0.9 * r1))
            att.x_g.copy_(1.0 - ramp.pow(0.2 * r1))
            decay = -6 + 6 * (torch.arange(c, dtype=torch.float32) / max(1, c - 1)) ** (1 + r0 ** 0.3)
            att.w0.copy_(decay + 0.5)
            for name in ("w1", "a1", "g1") + (("v1",) if i else ()):
                nn.init.normal_(getattr(att, name), std=0.1)
            for name in ("w2", "a2", "g2") + (("v2",) if i else ()):
                nn.init.normal_(getattr(att, name), std=0.1)
            nn.init.normal_(att.a0, std=0.1)
            if i:
                att.v0.fill_(1.0)
            att.k_k.fill_(0.85)
            att.k_a.fill_(1.0)
            nn.init.normal_(att.r_k, mean=-0.04, std=0.1)
            for lin in (att.receptance, att.key, att.value):
                nn.init.uniform_(lin.weight, -0.5 / c**0.5, 0.5 / c**0.5)
            nn.init.normal_(att.output.weight, std=0.1 / c**0.5)
            ffn.x_k.copy_(1.0 - ramp.pow(r1**4))
            nn.init.uniform_(ffn.key.weight, -0.5 / c**0.5, 0.5 / c**0.5)
            nn.init.normal_(ffn.value.weight, std=0.1 / cfg.ffn_width**0.5)

    def forward(self, input_ids: Tensor, state: list[LayerState] | None = None,
                scan: Wkv = wkv7_ref) -> tuple[Tensor, list[LayerState]]:
        """Run l >= 1 tokens on from `state` (None: a fresh sequence).

        Args:
            input_ids: (b, l) int64
            state:     list over layers of (att_shift (b, c), wkv (b, h, n, n), ffn_shift (b, c))
            scan:      the WKV recurrence to use (an exporter's lowering, same signature)
        Returns:
            logits (b, l, vocab_size) float32 and the new state.
        """
        if state is None:
            state = self.allocate_inference_cache(input_ids.shape[0], device=input_ids.device)
        x = self.emb(input_ids)  # (b, l, c)
        v_first, new_state = None, []
        for block, layer_state in zip(self.blocks, state, strict=True):
            x, layer_state, v_first = block(x, layer_state, v_first, scan=scan)
            new_state.append(layer_state)
        return self.head(self.ln_out(x)).float(), new_state

    def step(self, token_ids: Tensor, state: list[LayerState]) -> tuple[Tensor, list[LayerState]]:
        """One token per sequence: `forward` with l = 1 (the recurrence runs once, no loop).

        Args:
            token_ids: (b,) or (b, 1) int64
            state:     as in `forward`
        Returns:
            logits (b, vocab_size) float32 and the new state.
        """
        logits, new_state = self.forward(token_ids.reshape(-1, 1), state)  # (b, 1, v)
        return logits[:, 0], new_state

    def allocate_inference_cache(self, batch: int, dtype: torch.dtype | None = None,
                                 device: torch.device | None = None) -> list[LayerState]:
        """Zero state for a fresh sequence: shifts (b, c) in `dtype` (default: the model's),
        wkv (b, h, n, n) float32, one triple per layer."""
        cfg, w = self.config, self.emb.weight
        dtype, device = dtype or w.dtype, device or w.device
        c, h, n = cfg.n_embd, cfg.n_head, cfg.head_size
        return [(torch.zeros(batch, c, dtype=dtype, device=device),
                 torch.zeros(batch, h, n, n, dtype=torch.float32, device=device),
                 torch.zeros(batch, c, dtype=dtype, device=device)) for _ in range(cfg.n_layer)]
