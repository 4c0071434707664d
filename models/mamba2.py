"""A Mamba-2 (SSD, "state space duality") language model in plain PyTorch.

Pieces, smallest first: the sequential reference scan -> the chunked SSD scan
(the `ssd_minimal.py` form) -> Mamba2Config -> RMSNormGated -> Mamba2Mixer ->
RMSNorm -> Block -> Backbone -> Mamba2LM. Parameter names and the state-dict
layout are those of state-spaces' `Mamba2` / `MambaLMHeadModel`, so their
checkpoints load as they are (transformers' `Mamba2ForCausalLM` differs only in
`backbone.embeddings.weight`; see `seqexport.families.mamba2.layouts`).

Dimension letters (reused as ONNX dim names and runtime names; the paper's
symbols in brackets):
    b     batch                                              (B)
    l     sequence length                                    (T)
    d     d_model, width of the residual stream              (D)
    d_in  d_inner = expand * d_model, mixer width
    h     nheads = d_in // headdim, SSM heads                (H)
    p     headdim, channels per head                         (P)
    g     ngroups, groups of heads sharing B and C           (G)
    n     d_state, SSM state size per channel                (N)
    k     d_conv, width of the causal depthwise conv
    c     conv_dim = d_in + 2 * g * n, channels of the conv (x, B and C)
    v     vocabulary size (padded to a multiple in the embedding)

Recurrent state, per layer (returned new, never written in place, so that every
entry point traces and exports):
    conv_state  (b, c, k)     the last k inputs of the conv (before the conv)
    ssm_state   (b, h, p, n)  the SSM hidden state, always float32

Per head, A is a scalar: h_t = exp(Δ_t A) h_{t-1} + Δ_t x_t ⊗ B_t, y_t = h_t C_t + D x_t,
with B, C shared by the h / g heads of a group. A = -exp(A_log), Δ = softplus(dt + dt_bias)
(clamped to [dt_min_limit, dt_max_limit]) and D are float32 even when the module is float16;
the mixer casts its inputs to the scan and back.
"""

import math
from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from seqexport.models.config import DictConfig
from torch import Tensor, nn

# (conv_state, ssm_state) of one layer, and the list of them over layers.
LayerState = tuple[Tensor, Tensor]
Scan = Callable[..., tuple[Tensor, Tensor]]


def _per_head(B: Tensor, h: int) -> Tensor:
    """(..., g, n) -> (..., h, n): head i uses group i // (h / g), as state-spaces' kernels."""
    *lead, g, n = B.shape
    return B.unsqueeze(-2).expand(*lead, g, h // g, n).reshape(*lead, h, n)  # (..., h, n)


def ssd_sequential(
    x: Tensor, dt: Tensor, A: Tensor, B: Tensor, C: Tensor, D: Tensor, h0: Tensor
) -> tuple[Tensor, Tensor]:
    """The SSD recurrence, one time step after another: the reference to trust.

    For t = 0 .. l-1, starting from h = h0, per head:
        h   = exp(Δ_t A) h + Δ_t x_t ⊗ B_t
        y_t = h C_t + D x_t

    Args:
        x:     (b, l, h, p) float32, the input after conv and SiLU
        dt:    (b, l, h) float32, Δ (already softplus'd, biased and clamped)
        A:     (h,) float32, already -exp(A_log)
        B, C:  (b, l, g, n) float32; the heads of a group share its B and C
        D:     (h,) float32, skip connection
        h0:    (b, h, p, n) float32, state before the first step
    Returns:
        y (b, l, h, p) and the state after the last step (b, h, p, n).
    """
    nheads = x.shape[2]
    B, C = _per_head(B, nheads), _per_head(C, nheads)  # (b, l, h, n)
    state, ys = h0, []
    for t in range(x.shape[1]):
        decay = torch.exp(dt[:, t] * A)[:, :, None, None]  # (b, h, 1, 1)
        state = decay * state + (dt[:, t, :, None] * x[:, t])[..., None] * B[:, t, :, None, :]  # (b, h, p, n)
        ys.append((state * C[:, t, :, None, :]).sum(-1) + D[:, None] * x[:, t])  # (b, h, p)
    return torch.stack(ys, dim=1), state  # (b, l, h, p), (b, h, p, n)


def segsum(a: Tensor) -> Tensor:
    """a (..., T) -> (..., T, T): out[i, j] = a[j+1] + ... + a[i] for j <= i, -inf above the diagonal.

    A cumsum of `a` masked below the diagonal rather than a difference of one cumsum, which
    would lose precision when the sum is large (ssd_minimal.py's stable form).
    """
    T = a.shape[-1]
    a = a[..., None].expand(*a.shape, T)  # (..., T, T): a[..., i, j] = a[i]
    below = torch.tril(torch.ones(T, T, dtype=torch.bool, device=a.device), diagonal=-1)
    a = a.masked_fill(~below, 0)
    out = torch.cumsum(a, dim=-2)  # out[i, j] = sum of a[j+1 .. i]
    on_or_below = torch.tril(torch.ones(T, T, dtype=torch.bool, device=a.device), diagonal=0)
    return out.masked_fill(~on_or_below, -torch.inf)


def ssd_chunked(
    x: Tensor, dt: Tensor, A: Tensor, B: Tensor, C: Tensor, D: Tensor, h0: Tensor, chunk: int = 64
) -> tuple[Tensor, Tensor]:
    """The SSD in its chunked (matrix) form: same arguments and results as `ssd_sequential`.

    The length is padded with zeros to a multiple of `chunk` (Δ = 0 leaves the state as it
    is); inside a chunk the output is a masked attention-like product (the diagonal blocks),
    each chunk's contribution to the state is summed, the states at chunk starts come from a
    small segsum matrix over chunks (no loop, so a dynamic length traces), and each chunk
    start state is read out by C. Computed in the inputs' dtype (float32 from the mixer).
    """
    b, length, h, p = x.shape  # length: l
    nc = (length + chunk - 1) // chunk  # chunks; the pad is derived from it so that a symbolic l reshapes
    pad = nc * chunk - length
    B, C = _per_head(B, h), _per_head(C, h)  # (b, l, h, n)
    xdt = x * dt[..., None]  # (b, l, h, p), Δ x
    Adt = A * dt  # (b, l, h), Δ A
    # F.pad pads from the last dim backwards: (0, 0) per trailing dim, then (0, pad) on l.
    xdt = F.pad(xdt, (0, 0, 0, 0, 0, pad)).reshape(b, nc, chunk, h, p)  # (b, nc, chunk, h, p)
    B = F.pad(B, (0, 0, 0, 0, 0, pad)).reshape(b, nc, chunk, h, B.shape[-1])  # (b, nc, chunk, h, n)
    C = F.pad(C, (0, 0, 0, 0, 0, pad)).reshape(b, nc, chunk, h, C.shape[-1])  # (b, nc, chunk, h, n)
    Adt = F.pad(Adt, (0, 0, 0, pad)).reshape(b, nc, chunk, h).permute(0, 3, 1, 2)  # (b, h, nc, chunk)
    A_cumsum = torch.cumsum(Adt, dim=-1)  # (b, h, nc, chunk)

    # 1. Within each chunk (diagonal blocks): y_i = sum_{j<=i} C_i.B_j exp(A_j+1 + .. + A_i) Δx_j.
    L = torch.exp(segsum(Adt))  # (b, h, nc, chunk, chunk)
    scores = torch.einsum("bclhn,bcshn->bhcls", C, B) * L  # (b, h, nc, chunk, chunk)
    y_diag = torch.einsum("bhcls,bcshp->bclhp", scores, xdt)  # (b, nc, chunk, h, p)

    # 2. Each chunk's own contribution to the state at its end.
    decay_to_end = torch.exp(A_cumsum[..., -1:] - A_cumsum)  # (b, h, nc, chunk)
    states = torch.einsum("bclhn,bhcl,bclhp->bchpn", B, decay_to_end, xdt)  # (b, nc, h, p, n)

    # 3. The state at every chunk start (and the final one): a segsum matrix over chunks.
    states = torch.cat([h0[:, None].to(states.dtype), states], dim=1)  # (b, nc + 1, h, p, n)
    decay_chunk = torch.exp(segsum(F.pad(A_cumsum[..., -1], (1, 0))))  # (b, h, nc + 1, nc + 1)
    states = torch.einsum("bhzc,bchpn->bzhpn", decay_chunk, states)  # (b, nc + 1, h, p, n)
    states, final = states[:, :-1], states[:, -1]  # (b, nc, h, p, n), (b, h, p, n)

    # 4. The chunk start states read out by C, decayed to each position.
    y_off = torch.einsum("bclhn,bchpn,bhcl->bclhp", C, states, torch.exp(A_cumsum))  # (b, nc, chunk, h, p)

    y = (y_diag + y_off).reshape(b, nc * chunk, h, p)[:, :length]  # (b, l, h, p)
    return y + D[:, None] * x, final


@dataclass
class Mamba2Config(DictConfig):
    d_model: int = 64  # width of the residual stream (d)
    n_layer: int = 2  # number of residual blocks
    vocab_size: int = 100  # real vocabulary; logits are sliced to it
    d_state: int = 16  # SSM state size per channel (n)
    d_conv: int = 4  # width of the causal depthwise conv (k)
    expand: int = 2  # d_inner = expand * d_model
    headdim: int = 16  # channels per SSM head (p); nheads = d_inner // headdim
    ngroups: int = 1  # groups of heads sharing B and C (g)
    chunk_size: int = 64  # chunk length of the chunked SSD (prefill)
    bias: bool = False  # bias in in_proj and out_proj
    conv_bias: bool = True  # bias in the depthwise conv
    rms_norm_eps: float = 1e-5  # epsilon of every RMSNorm (the gated one too)
    norm_before_gate: bool = False  # gated norm: False = norm(y * SiLU(z)), True = norm(y) * SiLU(z)
    dt_min_limit: float = 0.0  # Δ clamped to >= this (transformers' time_step_limit[0])
    dt_max_limit: float | None = None  # Δ clamped to <= this; None = no upper limit
    pad_vocab_size_multiple: int = 16  # embedding rows rounded up to this multiple
    tie_embeddings: bool = True  # lm_head shares the embedding matrix

    def __post_init__(self):
        ints = ("d_model", "n_layer", "vocab_size", "d_state", "d_conv", "expand", "headdim", "ngroups",
                "chunk_size", "pad_vocab_size_multiple")
        for name in ints:
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"Mamba2Config.{name} must be a positive int, got {value!r}")
        for name in ("bias", "conv_bias", "norm_before_gate", "tie_embeddings"):
            if not isinstance(getattr(self, name), bool):
                raise ValueError(f"Mamba2Config.{name} must be a bool, got {getattr(self, name)!r}")
        if isinstance(self.rms_norm_eps, bool) or not isinstance(self.rms_norm_eps, int | float) \
                or not self.rms_norm_eps > 0:
            raise ValueError(f"Mamba2Config.rms_norm_eps must be > 0, got {self.rms_norm_eps!r}")
        if isinstance(self.dt_min_limit, bool) or not isinstance(self.dt_min_limit, int | float) \
                or not 0 <= self.dt_min_limit < math.inf:
            raise ValueError(f"Mamba2Config.dt_min_limit must be a finite number >= 0, got {self.dt_min_limit!r}")
        if self.dt_max_limit is not None and (
            isinstance(self.dt_max_limit, bool) or not isinstance(self.dt_max_limit, int | float)
            or not self.dt_min_limit < self.dt_max_limit < math.inf
        ):
            raise ValueError(
                f"Mamba2Config.dt_max_limit must be None (no limit) or a finite number > "
                f"dt_min_limit={self.dt_min_limit!r}, got {self.dt_max_limit!r}"
            )
        if self.d_inner % self.headdim:
            raise ValueError(
                f"Mamba2Config.headdim={self.headdim} must divide d_inner = expand * d_model = {self.d_inner}"
            )
        if self.nheads % self.ngroups:
            raise ValueError(
                f"Mamba2Config.ngroups={self.ngroups} must divide nheads = d_inner // headdim = {self.nheads}"
            )

    @property
    def d_inner(self) -> int:
        return self.expand * self.d_model

    @property
    def nheads(self) -> int:
        return self.d_inner // self.headdim

    @property
    def conv_dim(self) -> int:
        return self.d_inner + 2 * self.ngroups * self.d_state

    @property
    def padded_vocab_size(self) -> int:
        m = self.pad_vocab_size_multiple
        return (self.vocab_size + m - 1) // m * m


class RMSNormGated(nn.Module):
    """RMSNorm of y gated by SiLU(z), normalised per group of d_in // g channels, in float32.

    norm_before_gate False: norm(y * SiLU(z)) * weight (transformers' torch path, always);
    True: norm(y) * weight * SiLU(z). As state-spaces' RMSNormGated(group_size=d_in // g).
    """

    def __init__(self, d_in: int, group_size: int, eps: float = 1e-5, norm_before_gate: bool = False):
        super().__init__()
        self.group_size, self.eps, self.norm_before_gate = group_size, eps, norm_before_gate
        self.weight = nn.Parameter(torch.ones(d_in))

    def forward(self, y: Tensor, z: Tensor) -> Tensor:
        """y, z (..., d_in) -> (..., d_in) float32."""
        y, gate = y.float(), F.silu(z.float())
        if not self.norm_before_gate:
            y = y * gate
        y = y.unflatten(-1, (-1, self.group_size))  # (..., g, d_in // g)
        y = (y * torch.rsqrt(y.pow(2).mean(-1, keepdim=True) + self.eps)).flatten(-2)  # (..., d_in)
        if self.norm_before_gate:
            y = y * gate
        return y * self.weight.float()


class Mamba2Mixer(nn.Module):
    """The Mamba-2 layer: in_proj -> causal conv over (x, B, C) -> SiLU -> SSD -> gated norm -> out_proj."""

    def __init__(self, config: Mamba2Config, dt_min: float = 1e-3, dt_max: float = 1e-1,
                 dt_init_floor: float = 1e-4, A_init_range: tuple[float, float] = (1.0, 16.0)):
        super().__init__()
        d, d_in, h, g, n, k = (config.d_model, config.d_inner, config.nheads, config.ngroups, config.d_state,
                               config.d_conv)
        c = config.conv_dim
        self.d_inner, self.nheads, self.headdim, self.ngroups, self.d_state, self.d_conv, self.conv_dim = (
            d_in, h, config.headdim, g, n, k, c)
        self.dt_min_limit, self.dt_max_limit = config.dt_min_limit, config.dt_max_limit

        self.in_proj = nn.Linear(d, 2 * d_in + 2 * g * n + h, bias=config.bias)  # -> z, xBC, dt
        self.conv1d = nn.Conv1d(c, c, kernel_size=k, groups=c, padding=k - 1, bias=config.conv_bias)
        self.dt_bias = nn.Parameter(torch.empty(h))
        self.A_log = nn.Parameter(torch.empty(h))
        self.D = nn.Parameter(torch.ones(h))
        self.norm = RMSNormGated(d_in, d_in // g, config.rms_norm_eps, config.norm_before_gate)
        self.out_proj = nn.Linear(d_in, d, bias=config.bias)

        # As state-spaces' Mamba2: Δ drawn log-uniformly in [dt_min, dt_max] and stored as its
        # inverse softplus in dt_bias; A drawn uniformly in A_init_range, stored as log.
        with torch.no_grad():
            dt = torch.exp(torch.rand(h) * (math.log(dt_max) - math.log(dt_min)) + math.log(dt_min))
            dt = dt.clamp(min=dt_init_floor)
            self.dt_bias.copy_(dt + torch.log(-torch.expm1(-dt)))  # softplus^-1(dt)
            self.A_log.copy_(torch.log(torch.empty(h).uniform_(*A_init_range)))

    def _delta(self, dt: Tensor) -> Tensor:
        """dt (..., h) from in_proj -> Δ = clamp(softplus(dt + dt_bias)) float32."""
        delta = F.softplus(dt.float() + self.dt_bias.float())
        return delta.clamp(min=self.dt_min_limit, max=self.dt_max_limit)

    def forward(
        self, hidden: Tensor, conv_state: Tensor, ssm_state: Tensor, scan: Scan = ssd_sequential
    ) -> tuple[Tensor, Tensor, Tensor]:
        """Run l >= 1 tokens on from a given state.

        Args:
            hidden:     (b, l, d)
            conv_state: (b, c, k) the last k conv inputs before these tokens (zeros to start)
            ssm_state:  (b, h, p, n) float32
            scan:       a function with the signature of `ssd_sequential`
        Returns:
            out (b, l, d), new conv_state (b, c, k), new ssm_state (b, h, p, n) float32.
        """
        dtype = hidden.dtype
        z, xBC, dt = torch.split(self.in_proj(hidden), [self.d_inner, self.conv_dim, self.nheads], dim=-1)
        xBC = xBC.transpose(1, 2)  # (b, c, l)
        x_cat = torch.cat([conv_state.to(xBC.dtype), xBC], dim=-1)  # (b, c, k + l)
        new_conv_state = x_cat[:, :, -self.d_conv :]  # (b, c, k)
        # The conv of the l new positions sees the last k-1 inputs of the state as
        # left context: a valid (unpadded) conv over (k - 1) + l inputs gives l outputs.
        xBC = F.conv1d(x_cat[:, :, 1:], self.conv1d.weight, self.conv1d.bias, groups=self.conv_dim)  # (b, c, l)
        xBC = F.silu(xBC).transpose(1, 2)  # (b, l, c)
        gn = self.ngroups * self.d_state
        x, B, C = torch.split(xBC, [self.d_inner, gn, gn], dim=-1)
        x = x.unflatten(-1, (self.nheads, self.headdim))  # (b, l, h, p)
        B = B.unflatten(-1, (self.ngroups, self.d_state))  # (b, l, g, n)
        C = C.unflatten(-1, (self.ngroups, self.d_state))  # (b, l, g, n)

        A = -torch.exp(self.A_log.float())  # (h,)
        y, new_ssm_state = scan(x.float(), self._delta(dt), A, B.float(), C.float(), self.D.float(),
                                ssm_state.float())  # (b, l, h, p), (b, h, p, n)
        y = self.norm(y.flatten(-2), z)  # (b, l, d_in) float32
        return self.out_proj(y.to(dtype)), new_conv_state, new_ssm_state

    def step(self, hidden: Tensor, conv_state: Tensor, ssm_state: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        """One token, no loop: equal to `forward` with l = 1.

        Args:
            hidden: (b, 1, d); conv_state (b, c, k); ssm_state (b, h, p, n) float32
        Returns:
            out (b, 1, d), new conv_state (b, c, k), new ssm_state (b, h, p, n) float32.
        """
        if hidden.shape[1] != 1:
            raise ValueError(f"Mamba2Mixer.step takes one token, hidden of shape (b, 1, d); got {tuple(hidden.shape)}")
        dtype = hidden.dtype
        z, xBC, dt = torch.split(self.in_proj(hidden[:, 0]), [self.d_inner, self.conv_dim, self.nheads], dim=-1)
        new_conv_state = torch.cat([conv_state[:, :, 1:].to(xBC.dtype), xBC[:, :, None]], dim=-1)  # (b, c, k)
        xBC = (new_conv_state * self.conv1d.weight[:, 0, :]).sum(-1)  # (b, c)
        if self.conv1d.bias is not None:
            xBC = xBC + self.conv1d.bias
        xBC = F.silu(xBC)
        gn = self.ngroups * self.d_state
        x, B, C = torch.split(xBC, [self.d_inner, gn, gn], dim=-1)
        x = x.unflatten(-1, (self.nheads, self.headdim)).float()  # (b, h, p)
        B = _per_head(B.unflatten(-1, (self.ngroups, self.d_state)).float(), self.nheads)  # (b, h, n)
        C = _per_head(C.unflatten(-1, (self.ngroups, self.d_state)).float(), self.nheads)  # (b, h, n)

        delta = self._delta(dt)  # (b, h)
        decay = torch.exp(delta * -torch.exp(self.A_log.float()))[:, :, None, None]  # (b, h, 1, 1)
        new_ssm_state = decay * ssm_state.float() + (delta[:, :, None] * x)[..., None] * B[:, :, None, :]  # (b, h, p, n)
        y = (new_ssm_state * C[:, :, None, :]).sum(-1) + self.D.float()[:, None] * x  # (b, h, p)
        y = self.norm(y.flatten(-2), z)  # (b, d_in) float32
        return self.out_proj(y.to(dtype))[:, None, :], new_conv_state, new_ssm_state  # (b, 1, d)

    def allocate_inference_cache(
        self, batch: int, dtype: torch.dtype | None = None, device: torch.device | None = None
    ) -> LayerState:
        """Zero state: conv_state (b, c, k) in `dtype` (default: the conv's), ssm_state (b, h, p, n) float32."""
        w = self.conv1d.weight
        conv_state = torch.zeros(batch, self.conv_dim, self.d_conv, dtype=dtype or w.dtype, device=device or w.device)
        ssm_state = torch.zeros(batch, self.nheads, self.headdim, self.d_state, dtype=torch.float32,
                                device=device or w.device)
        return conv_state, ssm_state


class RMSNorm(nn.Module):
    """x / sqrt(mean(x^2) + eps) * weight over the last dim, computed in float32."""

    def __init__(self, d: int, eps: float = 1e-5):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(d))

    def forward(self, x: Tensor) -> Tensor:
        """x (..., d) -> (..., d) in x's dtype."""
        xf = x.float()
        xf = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + self.eps)
        return xf.to(x.dtype) * self.weight


class Block(nn.Module):
    """Pre-norm residual block: x + mixer(norm(x))."""

    def __init__(self, config: Mamba2Config):
        super().__init__()
        self.norm = RMSNorm(config.d_model, config.rms_norm_eps)
        self.mixer = Mamba2Mixer(config)

    def forward(
        self, x: Tensor, conv_state: Tensor, ssm_state: Tensor, scan: Scan = ssd_sequential
    ) -> tuple[Tensor, Tensor, Tensor]:
        """x (b, l, d) -> (b, l, d), new conv_state, new ssm_state."""
        out, conv_state, ssm_state = self.mixer(self.norm(x), conv_state, ssm_state, scan=scan)
        return x + out, conv_state, ssm_state

    def step(self, x: Tensor, conv_state: Tensor, ssm_state: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        """x (b, 1, d) -> (b, 1, d), new conv_state, new ssm_state."""
        out, conv_state, ssm_state = self.mixer.step(self.norm(x), conv_state, ssm_state)
        return x + out, conv_state, ssm_state


class Backbone(nn.Module):
    """Embedding -> blocks -> final norm; the container that gives the `backbone.*` keys."""

    def __init__(self, config: Mamba2Config):
        super().__init__()
        self.embedding = nn.Embedding(config.padded_vocab_size, config.d_model)
        self.layers = nn.ModuleList([Block(config) for _ in range(config.n_layer)])
        self.norm_f = RMSNorm(config.d_model, config.rms_norm_eps)

    def forward(
        self, input_ids: Tensor, state: list[LayerState], scan: Scan = ssd_sequential
    ) -> tuple[Tensor, list[LayerState]]:
        """input_ids (b, l) -> hidden (b, l, d), new state."""
        x = self.embedding(input_ids)  # (b, l, d)
        new_state = []
        for layer, (conv_state, ssm_state) in zip(self.layers, state, strict=True):
            x, conv_state, ssm_state = layer(x, conv_state, ssm_state, scan=scan)
            new_state.append((conv_state, ssm_state))
        return self.norm_f(x), new_state

    def step(self, input_ids: Tensor, state: list[LayerState]) -> tuple[Tensor, list[LayerState]]:
        """input_ids (b, 1) -> hidden (b, 1, d), new state."""
        x = self.embedding(input_ids)  # (b, 1, d)
        new_state = []
        for layer, (conv_state, ssm_state) in zip(self.layers, state, strict=True):
            x, conv_state, ssm_state = layer.step(x, conv_state, ssm_state)
            new_state.append((conv_state, ssm_state))
        return self.norm_f(x), new_state


class Mamba2LM(nn.Module):
    """Mamba-2 language model: backbone + lm_head (tied to the embedding by default).

    State-dict keys are state-spaces' MambaLMHeadModel ones with Mamba2 layers:
    `backbone.embedding.weight`, `backbone.layers.{i}.norm.weight`,
    `backbone.layers.{i}.mixer.{in_proj,conv1d,out_proj}.*`,
    `backbone.layers.{i}.mixer.{dt_bias,A_log,D}`, `backbone.layers.{i}.mixer.norm.weight`,
    `backbone.norm_f.weight`, `lm_head.weight`.

    Logits are float32 and sliced to `config.vocab_size` (the padding rows of the
    embedding never reach the output): (b, l, vocab_size).
    """

    def __init__(self, config: Mamba2Config):
        super().__init__()
        self.config = config
        self.backbone = Backbone(config)
        self.lm_head = nn.Linear(config.d_model, config.padded_vocab_size, bias=False)
        self._init_weights()
        if config.tie_embeddings:
            self.lm_head.weight = self.backbone.embedding.weight

    @torch.no_grad()
    def _init_weights(self):
        # As state-spaces' MambaLMHeadModel: embedding ~ N(0, 0.02), linear biases zero,
        # out_proj scaled by 1/sqrt(n_layer) (GPT-2 style).
        nn.init.normal_(self.backbone.embedding.weight, std=0.02)
        for module in self.modules():
            if isinstance(module, nn.Linear) and module.bias is not None:
                nn.init.zeros_(module.bias)
        for layer in self.backbone.layers:
            layer.mixer.out_proj.weight.div_(math.sqrt(self.config.n_layer))

    def forward(
        self, input_ids: Tensor, state: list[LayerState] | None = None, scan: Scan = ssd_sequential
    ) -> tuple[Tensor, list[LayerState]]:
        """Run l >= 1 tokens on from `state` (None: a fresh sequence).

        Args:
            input_ids: (b, l) int64
            state:     list over layers of (conv_state (b, c, k), ssm_state (b, h, p, n))
            scan:      the SSD scan to use (`ssd_sequential`, `partial(ssd_chunked, chunk=...)`,
                       or an exporter's wrapper of the same signature)
        Returns:
            logits (b, l, vocab_size) float32 and the new state.
        """
        if state is None:
            state = self.allocate_inference_cache(input_ids.shape[0], device=input_ids.device)
        hidden, new_state = self.backbone(input_ids, state, scan=scan)  # (b, l, d)
        logits = self.lm_head(hidden).float()[..., : self.config.vocab_size]  # (b, l, v)
        return logits, new_state

    def step(self, token_ids: Tensor, state: list[LayerState]) -> tuple[Tensor, list[LayerState]]:
        """One token per sequence.

        Args:
            token_ids: (b,) or (b, 1) int64
            state:     as in `forward`
        Returns:
            logits (b, vocab_size) float32 and the new state.
        """
        input_ids = token_ids.reshape(-1, 1)  # (b, 1)
        hidden, new_state = self.backbone.step(input_ids, state)  # (b, 1, d)
        logits = self.lm_head(hidden[:, 0]).float()[..., : self.config.vocab_size]  # (b, v)
        return logits, new_state

    def allocate_inference_cache(
        self, batch: int, dtype: torch.dtype | None = None, device: torch.device | None = None
    ) -> list[LayerState]:
        """Zero state for a fresh sequence: one (conv_state, ssm_state) per layer."""
        return [layer.mixer.allocate_inference_cache(batch, dtype, device) for layer in self.backbone.layers]
