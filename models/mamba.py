"""A Mamba-1 (selective state space, "S6") language model in plain PyTorch.

Pieces, smallest first: the sequential reference scan -> MambaMixer -> RMSNorm
-> Block -> MambaConfig -> MambaLM. Parameter names and the state-dict layout
are those of the original state-spaces `mamba_simple.Mamba` / `MambaLMHeadModel`,
so their checkpoints load as they are.

Dimension letters (reused as ONNX dim names and runtime names; the paper's
symbols in brackets):
    b     batch                                      (B)
    l     sequence length                            (L)
    d     d_model, width of the residual stream      (D)
    d_in  d_inner = expand * d_model, mixer width    (E*D)
    n     d_state, SSM state size per channel        (N)
    k     d_conv, width of the causal depthwise conv
    r     dt_rank, rank of the Δ projection          (R)
    v     vocabulary size (padded to a multiple in the embedding)

Recurrent state, per layer (returned new, never written in place, so that every
entry point traces and exports):
    conv_state  (b, d_in, k)  the last k inputs of the conv (before the conv)
    ssm_state   (b, d_in, n)  the SSM hidden state h, always float32

A = -exp(A_log), Δ = softplus(dt_proj(dt)) and D are computed in float32 even
when the module is float16; the mixer casts its inputs to the scan and back.
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


def selective_scan_ref(
    u: Tensor, delta: Tensor, A: Tensor, B: Tensor, C: Tensor, D: Tensor, h0: Tensor
) -> tuple[Tensor, Tensor]:
    """The selective scan, one time step after another: the reference to trust.

    For t = 0 .. l-1, starting from h = h0:
        h   = exp(Δ_t A) * h + (Δ_t u_t) B_t      (zero-order hold for A, Euler for B)
        y_t = <h, C_t> + D u_t

    Args:
        u:     (b, l, d_in) float32, the input x after conv and SiLU
        delta: (b, l, d_in) float32, Δ = softplus(dt_proj(dt)) > 0
        A:     (d_in, n) float32, already -exp(A_log)
        B, C:  (b, l, n) float32, input-dependent
        D:     (d_in,) float32, skip connection
        h0:    (b, d_in, n) float32, state before the first step
    Returns:
        y (b, l, d_in) and the state after the last step, h (b, d_in, n).
    """
    h = h0
    ys = []
    for t in range(u.shape[1]):
        dA = torch.exp(delta[:, t, :, None] * A)  # (b, d_in, n)
        dBu = (delta[:, t] * u[:, t])[:, :, None] * B[:, t, None, :]  # (b, d_in, n)
        h = dA * h + dBu
        y = (h * C[:, t, None, :]).sum(-1) + D * u[:, t]  # (b, d_in)
        ys.append(y)
    return torch.stack(ys, dim=1), h  # (b, l, d_in), (b, d_in, n)


@dataclass
class MambaConfig(DictConfig):
    d_model: int = 64  # width of the residual stream (d)
    n_layer: int = 2  # number of residual blocks
    vocab_size: int = 100  # real vocabulary; logits are sliced to it
    d_state: int = 16  # SSM state size per channel (n)
    d_conv: int = 4  # width of the causal depthwise conv (k)
    expand: int = 2  # d_inner = expand * d_model
    dt_rank: int | None = None  # rank of the Δ projection (r); None -> ceil(d_model / 16)
    bias: bool = False  # bias in in_proj and out_proj
    conv_bias: bool = True  # bias in the depthwise conv
    rms_norm_eps: float = 1e-5  # epsilon of every RMSNorm
    pad_vocab_size_multiple: int = 8  # embedding rows rounded up to this multiple
    tie_embeddings: bool = True  # lm_head shares the embedding matrix
    # Falcon-Mamba: a weightless RMSNorm with this epsilon on each of x_proj's three outputs
    # (Δ's low-rank input, B, C) before they are used; None: no such norm (Mamba-1)
    mixer_rms_eps: float | None = None
    # Jamba: those norms have weights (dt_layernorm, b_layernorm, c_layernorm), with mixer_rms_eps
    mixer_norm_weights: bool = False

    def __post_init__(self):
        for name in ("d_model", "n_layer", "vocab_size", "d_state", "d_conv", "expand", "pad_vocab_size_multiple"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"MambaConfig.{name} must be a positive int, got {value!r}")
        if self.dt_rank is not None and (
            isinstance(self.dt_rank, bool) or not isinstance(self.dt_rank, int) or self.dt_rank < 1
        ):
            raise ValueError(f"MambaConfig.dt_rank must be a positive int or None, got {self.dt_rank!r}")
        if not self.rms_norm_eps > 0:
            raise ValueError(f"MambaConfig.rms_norm_eps must be > 0, got {self.rms_norm_eps!r}")
        if self.mixer_rms_eps is not None and (isinstance(self.mixer_rms_eps, bool) or not self.mixer_rms_eps > 0):
            raise ValueError(f"MambaConfig.mixer_rms_eps must be > 0 or None, got {self.mixer_rms_eps!r}")
        if self.mixer_norm_weights not in (False, True) or (self.mixer_norm_weights and self.mixer_rms_eps is None):
            raise ValueError(f"MambaConfig.mixer_norm_weights={self.mixer_norm_weights!r}; expected a bool, True only "
                             "with mixer_rms_eps set")

    @property
    def d_inner(self) -> int:
        return self.expand * self.d_model

    @property
    def resolved_dt_rank(self) -> int:
        return self.dt_rank if self.dt_rank is not None else math.ceil(self.d_model / 16)

    @property
    def padded_vocab_size(self) -> int:
        m = self.pad_vocab_size_multiple
        return (self.vocab_size + m - 1) // m * m


def weightless_rms_norm(x: Tensor, eps: float) -> Tensor:
    """x / sqrt(mean(x^2) + eps) over the last dim, in float32, back in x's dtype: (..., c) -> (..., c)."""
    xf = x.float()
    return (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)).to(x.dtype)


class MambaMixer(nn.Module):
    """The Mamba layer: in_proj -> causal conv -> SiLU -> selective SSM, gated -> out_proj."""

    def __init__(self, config: MambaConfig, dt_min: float = 1e-3, dt_max: float = 1e-1, dt_init_floor: float = 1e-4):
        super().__init__()
        d, d_in, n, k, r = config.d_model, config.d_inner, config.d_state, config.d_conv, config.resolved_dt_rank
        self.d_model, self.d_inner, self.d_state, self.d_conv, self.dt_rank = d, d_in, n, k, r
        self.mixer_rms_eps = config.mixer_rms_eps

        self.in_proj = nn.Linear(d, 2 * d_in, bias=config.bias)
        self.conv1d = nn.Conv1d(d_in, d_in, kernel_size=k, groups=d_in, padding=k - 1, bias=config.conv_bias)
        self.x_proj = nn.Linear(d_in, r + 2 * n, bias=False)
        self.dt_proj = nn.Linear(r, d_in, bias=True)
        self.A_log = nn.Parameter(torch.log(torch.arange(1, n + 1, dtype=torch.float32)).repeat(d_in, 1))  # (d_in, n)
        self.D = nn.Parameter(torch.ones(d_in))
        self.out_proj = nn.Linear(d_in, d, bias=config.bias)
        if config.mixer_norm_weights:  # Jamba's weighted norms on x_proj's three outputs
            self.dt_layernorm, self.b_layernorm, self.c_layernorm = (RMSNorm(m, config.mixer_rms_eps) for m in (r, n, n))

        # As the original: dt_proj keeps the variance of its input, and its bias is
        # the inverse softplus of a Δ drawn log-uniformly in [dt_min, dt_max].
        with torch.no_grad():
            dt_init_std = r**-0.5
            nn.init.uniform_(self.dt_proj.weight, -dt_init_std, dt_init_std)
            dt = torch.exp(torch.rand(d_in) * (math.log(dt_max) - math.log(dt_min)) + math.log(dt_min))
            dt = dt.clamp(min=dt_init_floor)
            self.dt_proj.bias.copy_(dt + torch.log(-torch.expm1(-dt)))  # softplus^-1(dt)

    def dt_b_c(self, x: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        """x (..., d_in) -> x_proj's three parts: Δ's low-rank input (..., r), B (..., n), C (..., n),
        each RMS-normed when the config says so: weightless (Falcon-Mamba) or with weights (Jamba)."""
        dt, B, C = torch.split(self.x_proj(x), [self.dt_rank, self.d_state, self.d_state], dim=-1)
        if hasattr(self, "dt_layernorm"):
            dt, B, C = self.dt_layernorm(dt), self.b_layernorm(B), self.c_layernorm(C)
        elif self.mixer_rms_eps is not None:
            dt, B, C = (weightless_rms_norm(t, self.mixer_rms_eps) for t in (dt, B, C))
        return dt, B, C

    def _ssm_params(self, x: Tensor) -> tuple[Tensor, Tensor, Tensor, Tensor]:
        """x (..., d_in) -> Δ (..., d_in), A (d_in, n), B (..., n), C (..., n); all but B, C float32."""
        dt, B, C = self.dt_b_c(x)
        dt = F.linear(dt, self.dt_proj.weight).float() + self.dt_proj.bias.float()  # (..., d_in)
        delta = F.softplus(dt)
        A = -torch.exp(self.A_log.float())  # (d_in, n)
        return delta, A, B.float(), C.float()

    def forward(
        self, hidden: Tensor, conv_state: Tensor, ssm_state: Tensor, scan: Scan = selective_scan_ref
    ) -> tuple[Tensor, Tensor, Tensor]:
        """Run l >= 1 tokens on from a given state.

        Args:
            hidden:     (b, l, d)
            conv_state: (b, d_in, k) the last k conv inputs before these tokens (zeros to start)
            ssm_state:  (b, d_in, n) float32
            scan:       a function with the signature of `selective_scan_ref`
        Returns:
            out (b, l, d), new conv_state (b, d_in, k), new ssm_state (b, d_in, n) float32.
        """
        dtype = hidden.dtype
        x, z = self.in_proj(hidden).chunk(2, dim=-1)  # (b, l, d_in) each
        x = x.transpose(1, 2)  # (b, d_in, l)
        x_cat = torch.cat([conv_state.to(x.dtype), x], dim=-1)  # (b, d_in, k + l)
        new_conv_state = x_cat[:, :, -self.d_conv :]  # (b, d_in, k)
        # The conv of the l new positions sees the last k-1 inputs of the state as
        # left context: a valid (unpadded) conv over (k - 1) + l inputs gives l outputs.
        x = F.conv1d(x_cat[:, :, 1:], self.conv1d.weight, self.conv1d.bias, groups=self.d_inner)  # (b, d_in, l)
        x = F.silu(x).transpose(1, 2)  # (b, l, d_in)

        delta, A, B, C = self._ssm_params(x)  # (b, l, d_in), (d_in, n), (b, l, n), (b, l, n)
        y, new_ssm_state = scan(x.float(), delta, A, B, C, self.D.float(), ssm_state.float())
        y = (y * F.silu(z.float())).to(dtype)  # (b, l, d_in)
        return self.out_proj(y), new_conv_state, new_ssm_state

    def step(self, hidden: Tensor, conv_state: Tensor, ssm_state: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        """One token, no loop: equal to `forward` with l = 1.

        Args:
            hidden: (b, 1, d); conv_state (b, d_in, k); ssm_state (b, d_in, n) float32
        Returns:
            out (b, 1, d), new conv_state (b, d_in, k), new ssm_state (b, d_in, n) float32.
        """
        if hidden.shape[1] != 1:
            raise ValueError(f"MambaMixer.step takes one token, hidden of shape (b, 1, d); got {tuple(hidden.shape)}")
        dtype = hidden.dtype
        x, z = self.in_proj(hidden[:, 0]).chunk(2, dim=-1)  # (b, d_in) each
        new_conv_state = torch.cat([conv_state[:, :, 1:].to(x.dtype), x[:, :, None]], dim=-1)  # (b, d_in, k)
        x = (new_conv_state * self.conv1d.weight[:, 0, :]).sum(-1)  # (b, d_in)
        if self.conv1d.bias is not None:
            x = x + self.conv1d.bias
        x = F.silu(x)

        delta, A, B, C = self._ssm_params(x)  # (b, d_in), (d_in, n), (b, n), (b, n)
        u = x.float()
        dA = torch.exp(delta[:, :, None] * A)  # (b, d_in, n)
        dBu = (delta * u)[:, :, None] * B[:, None, :]  # (b, d_in, n)
        new_ssm_state = dA * ssm_state.float() + dBu  # (b, d_in, n)
        y = (new_ssm_state * C[:, None, :]).sum(-1) + self.D.float() * u  # (b, d_in)
        y = (y * F.silu(z.float())).to(dtype)
        return self.out_proj(y)[:, None, :], new_conv_state, new_ssm_state  # (b, 1, d)

    def allocate_inference_cache(
        self, batch: int, dtype: torch.dtype | None = None, device: torch.device | None = None
    ) -> LayerState:
        """Zero state: conv_state (b, d_in, k) in `dtype` (default: the conv's), ssm_state (b, d_in, n) float32."""
        w = self.conv1d.weight
        conv_state = torch.zeros(batch, self.d_inner, self.d_conv, dtype=dtype or w.dtype, device=device or w.device)
        ssm_state = torch.zeros(batch, self.d_inner, self.d_state, dtype=torch.float32, device=device or w.device)
        return conv_state, ssm_state


class RMSNorm(nn.Module):
    """x / sqrt(mean(x^2) + eps) * weight over the last dim, computed in float32."""

    def __init__(self, d: int, eps: float = 1e-5):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(d))

    def forward(self, x: Tensor) -> Tensor:
        """x (..., d) -> (..., d) in x's dtype."""
        return weightless_rms_norm(x, self.eps) * self.weight


class Block(nn.Module):
    """Pre-norm residual block: x + mixer(norm(x))."""

    def __init__(self, config: MambaConfig):
        super().__init__()
        self.norm = RMSNorm(config.d_model, config.rms_norm_eps)
        self.mixer = MambaMixer(config)

    def forward(
        self, x: Tensor, conv_state: Tensor, ssm_state: Tensor, scan: Scan = selective_scan_ref
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

    def __init__(self, config: MambaConfig):
        super().__init__()
        self.embedding = nn.Embedding(config.padded_vocab_size, config.d_model)
        self.layers = nn.ModuleList([Block(config) for _ in range(config.n_layer)])
        self.norm_f = RMSNorm(config.d_model, config.rms_norm_eps)

    def forward(
        self, input_ids: Tensor, state: list[LayerState], scan: Scan = selective_scan_ref
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


class MambaLM(nn.Module):
    """Mamba language model: backbone + lm_head (tied to the embedding by default).

    State-dict keys are the original state-spaces ones: `backbone.embedding.weight`,
    `backbone.layers.{i}.norm.weight`, `backbone.layers.{i}.mixer.{in_proj,conv1d,
    x_proj,dt_proj,out_proj}.*`, `backbone.layers.{i}.mixer.{A_log,D}`,
    `backbone.norm_f.weight`, `lm_head.weight`.

    Logits are float32 and sliced to `config.vocab_size` (the padding rows of the
    embedding never reach the output): (b, l, vocab_size).
    """

    def __init__(self, config: MambaConfig):
        super().__init__()
        self.config = config
        self.backbone = Backbone(config)
        self.lm_head = nn.Linear(config.d_model, config.padded_vocab_size, bias=False)
        self._init_weights()
        if config.tie_embeddings:
            self.lm_head.weight = self.backbone.embedding.weight

    @torch.no_grad()
    def _init_weights(self):
        # As the original MambaLMHeadModel: embedding ~ N(0, 0.02), linear biases
        # zero except dt_proj's, out_proj scaled by 1/sqrt(n_layer) (GPT-2 style).
        nn.init.normal_(self.backbone.embedding.weight, std=0.02)
        for name, module in self.named_modules():
            if isinstance(module, nn.Linear) and module.bias is not None and not name.endswith("dt_proj"):
                nn.init.zeros_(module.bias)
        for layer in self.backbone.layers:
            layer.mixer.out_proj.weight.div_(math.sqrt(self.config.n_layer))

    def forward(
        self, input_ids: Tensor, state: list[LayerState] | None = None, scan: Scan = selective_scan_ref
    ) -> tuple[Tensor, list[LayerState]]:
        """Run l >= 1 tokens on from `state` (None: a fresh sequence).

        Args:
            input_ids: (b, l) int64
            state:     list over layers of (conv_state (b, d_in, k), ssm_state (b, d_in, n))
            scan:      the selective scan to use (an exporter's lowering, same signature)
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
