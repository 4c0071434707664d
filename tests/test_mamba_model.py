"""The eager Mamba model: reference scan, forward == step == split prefill, and
parity with Hugging Face `MambaForCausalLM` through both public checkpoint layouts."""

import json
import math

import pytest
import torch
from safetensors.torch import load_file
from seqexport.models.mamba import MambaConfig, MambaLM, MambaMixer, selective_scan_ref

from seqexport.families.mamba.layouts import convert_mamba_state_dict, mamba_config_from_json


def literal_scan(u, delta, A, B, C, D, h0):
    """selective_scan_ref spelled out per (batch, channel, state) in Python floats."""
    b, seq_len, d_in = u.shape
    n = A.shape[1]
    h = [[[float(h0[i, c, s]) for s in range(n)] for c in range(d_in)] for i in range(b)]
    y = [[[0.0] * d_in for _ in range(seq_len)] for _ in range(b)]
    for i in range(b):
        for t in range(seq_len):
            for c in range(d_in):
                acc = 0.0
                for s in range(n):
                    dt = float(delta[i, t, c])
                    h[i][c][s] = math.exp(dt * float(A[c, s])) * h[i][c][s] + dt * float(u[i, t, c]) * float(B[i, t, s])
                    acc += h[i][c][s] * float(C[i, t, s])
                y[i][t][c] = acc + float(D[c]) * float(u[i, t, c])
    return torch.tensor(y), torch.tensor(h)


def scan_inputs(b=2, seq_len=5, d_in=3, n=4, seed=0):
    g = torch.Generator().manual_seed(seed)
    u = torch.randn(b, seq_len, d_in, generator=g)
    delta = torch.nn.functional.softplus(torch.randn(b, seq_len, d_in, generator=g))
    A = -torch.exp(torch.randn(d_in, n, generator=g))
    B = torch.randn(b, seq_len, n, generator=g)
    C = torch.randn(b, seq_len, n, generator=g)
    D = torch.randn(d_in, generator=g)
    h0 = torch.randn(b, d_in, n, generator=g)
    return u, delta, A, B, C, D, h0


@pytest.mark.parametrize("seq_len", [1, 2, 5])
def test_selective_scan_ref_matches_literal_loops(seq_len):
    args = scan_inputs(seq_len=seq_len)
    y, h = selective_scan_ref(*args)
    y_lit, h_lit = literal_scan(*args)
    assert y.shape == (2, seq_len, 3) and h.shape == (2, 3, 4)
    torch.testing.assert_close(y, y_lit, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(h, h_lit, atol=1e-5, rtol=1e-5)


# ---------------------------------------------------------------- our model alone

TINY = dict(d_model=16, n_layer=2, vocab_size=50, d_state=4, d_conv=4)


def tiny_model(seed=0, **overrides) -> MambaLM:
    """A tiny MambaLM with every parameter perturbed (non-zero biases, Δ of order 0.1-1)."""
    torch.manual_seed(seed)
    model = MambaLM(MambaConfig(**{**TINY, **overrides})).eval()
    with torch.no_grad():
        for p in model.parameters():
            p.add_(0.1 * torch.randn_like(p))
        for layer in model.backbone.layers:
            layer.mixer.dt_proj.bias.uniform_(-3.0, 0.0)
    return model


def assert_states_close(s1, s2, atol=1e-5):
    assert len(s1) == len(s2)
    for (c1, h1), (c2, h2) in zip(s1, s2):
        torch.testing.assert_close(c1, c2, atol=atol, rtol=0)
        torch.testing.assert_close(h1, h2, atol=atol, rtol=0)


def test_config_properties_and_dict_round_trip():
    cfg = MambaConfig(d_model=40, vocab_size=97)
    assert cfg.d_inner == 80 and cfg.resolved_dt_rank == 3 and cfg.padded_vocab_size == 104
    assert MambaConfig(vocab_size=96).padded_vocab_size == 96
    assert MambaConfig.from_dict(cfg.to_dict()) == cfg
    with pytest.raises(ValueError, match="d_modle"):
        MambaConfig.from_dict({"d_modle": 3})
    with pytest.raises(ValueError, match="d_state"):
        MambaConfig(d_state=0)


def test_state_dict_keys_are_the_state_spaces_layout():
    model = MambaLM(MambaConfig(**TINY))
    keys = set(model.state_dict())
    for k in [
        "backbone.embedding.weight",
        "backbone.layers.1.mixer.in_proj.weight",
        "backbone.layers.1.mixer.conv1d.weight",
        "backbone.layers.1.mixer.conv1d.bias",
        "backbone.layers.1.mixer.x_proj.weight",
        "backbone.layers.1.mixer.dt_proj.weight",
        "backbone.layers.1.mixer.dt_proj.bias",
        "backbone.layers.1.mixer.A_log",
        "backbone.layers.1.mixer.D",
        "backbone.layers.1.mixer.out_proj.weight",
        "backbone.layers.1.norm.weight",
        "backbone.norm_f.weight",
        "lm_head.weight",
    ]:
        assert k in keys, k
    assert model.lm_head.weight is model.backbone.embedding.weight
    assert model.backbone.embedding.weight.shape == (56, 16)  # 50 padded to a multiple of 8


@pytest.mark.parametrize("overrides", [{}, dict(bias=True, conv_bias=False, dt_rank=3)])
@pytest.mark.parametrize("seq_len", [1, 2, 3, 7])
def test_forward_equals_step_by_step_and_split_prefill(seq_len, overrides):
    model = tiny_model(**overrides)
    ids = torch.randint(0, 50, (2, seq_len), generator=torch.Generator().manual_seed(seq_len))
    with torch.no_grad():
        logits, state = model(ids)
        assert logits.shape == (2, seq_len, 50) and logits.dtype == torch.float32
        assert state[0][0].shape == (2, 32, 4) and state[0][1].shape == (2, 32, 4)

        step_state = model.allocate_inference_cache(2)
        for t in range(seq_len):
            step_logits, step_state = model.step(ids[:, t], step_state)
            torch.testing.assert_close(step_logits, logits[:, t], atol=1e-5, rtol=0)
        assert_states_close(step_state, state)

        for cut in range(1, seq_len):
            first, mid_state = model(ids[:, :cut])
            rest, end_state = model(ids[:, cut:], mid_state)
            torch.testing.assert_close(torch.cat([first, rest], dim=1), logits, atol=1e-5, rtol=0)
            assert_states_close(end_state, state)


def test_mixer_step_equals_forward_from_a_random_state():
    torch.manual_seed(1)
    mixer = MambaMixer(MambaConfig(**TINY)).eval()
    x = torch.randn(3, 1, 16)
    conv_state, ssm_state = torch.randn(3, 32, 4), torch.randn(3, 32, 4)
    with torch.no_grad():
        a = mixer(x, conv_state, ssm_state)
        b = mixer.step(x, conv_state, ssm_state)
    for ta, tb in zip(a, b):
        torch.testing.assert_close(ta, tb, atol=1e-5, rtol=0)
    with pytest.raises(ValueError, match="one token"):
        mixer.step(torch.randn(3, 2, 16), conv_state, ssm_state)


def test_scan_argument_is_used_by_every_layer():
    model = tiny_model()
    calls = []

    def counting_scan(*args):
        calls.append(args[0].shape)
        return selective_scan_ref(*args)

    ids = torch.randint(0, 50, (1, 4))
    with torch.no_grad():
        ref, _ = model(ids)
        got, _ = model(ids, scan=counting_scan)
    assert calls == [(1, 4, 32)] * 2
    torch.testing.assert_close(got, ref, atol=0, rtol=0)


def test_float16_keeps_ssm_in_float32():
    model = tiny_model()
    ids = torch.randint(0, 50, (2, 5), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        ref, _ = model(ids)
        half = model.half()
        logits, state = half(ids)
        step_logits, step_state = half.step(ids[:, 0], half.allocate_inference_cache(2))
    assert logits.dtype == torch.float32 and step_logits.dtype == torch.float32
    for conv_state, ssm_state in [*state, *step_state]:
        assert conv_state.dtype == torch.float16 and ssm_state.dtype == torch.float32
    torch.testing.assert_close(logits, ref, atol=2e-2, rtol=0)


# ------------------------------------------------- Hugging Face and state-spaces layouts

HF_VARIANTS = {
    "default": dict(vocab_size=100),
    "bias-noconvbias-vocab97-untied": dict(
        vocab_size=97, use_bias=True, use_conv_bias=False, tie_word_embeddings=False, pad_vocab_size_multiple=8
    ),
    "vocab97-k3-rank3": dict(vocab_size=97, use_bias=True, conv_kernel=3, time_step_rank=3),
}
# transformers' FalconMambaForCausalLM: Mamba-1 with a weightless RMSNorm on Δ's input, B and C
FALCON_VARIANTS = {
    "falcon-default": dict(vocab_size=100),
    "falcon-eps1e-2-untied-k3-bias": dict(
        vocab_size=97, mixer_rms_eps=1e-2, tie_word_embeddings=False, conv_kernel=3, use_bias=True
    ),
}


@pytest.fixture(scope="module", params=[*HF_VARIANTS, *FALCON_VARIANTS])
def hf_checkpoint(request, tmp_path_factory):
    """A randomly initialised, perturbed MambaForCausalLM (or FalconMambaForCausalLM) saved
    with save_pretrained."""
    import transformers  # the independent reference: a missing package fails, never skips
    falcon = request.param in FALCON_VARIANTS
    kwargs = (FALCON_VARIANTS if falcon else HF_VARIANTS)[request.param]
    config_class, model_class = ((transformers.FalconMambaConfig, transformers.FalconMambaForCausalLM) if falcon
                                 else (transformers.MambaConfig, transformers.MambaForCausalLM))
    cfg = config_class(hidden_size=32, num_hidden_layers=2, state_size=8, **kwargs)
    torch.manual_seed(0)
    hf = model_class(cfg).eval()
    with torch.no_grad():
        for p in hf.parameters():
            p.add_(0.1 * torch.randn_like(p))
        for layer in hf.backbone.layers:
            layer.mixer.dt_proj.bias.uniform_(-3.0, 0.0)
    path = tmp_path_factory.mktemp(request.param)
    hf.save_pretrained(path)
    ids = torch.randint(0, kwargs["vocab_size"], (2, 9), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        hf_logits = hf(ids).logits
    return hf, path, ids, hf_logits


def load_ours(config_dict: dict, state_dict: dict) -> MambaLM:
    config = mamba_config_from_json(config_dict)
    model = MambaLM(config).eval()
    model.load_state_dict(convert_mamba_state_dict(state_dict, config), strict=True)
    return model


def test_hf_checkpoint_gives_hf_logits(hf_checkpoint):
    hf, path, ids, hf_logits = hf_checkpoint
    config_dict = json.loads((path / "config.json").read_text())
    ours = load_ours(config_dict, load_file(path / "model.safetensors"))
    assert ours.config.vocab_size == hf.config.vocab_size
    assert ours.config.tie_embeddings == hf.config.tie_word_embeddings
    assert ours.config.mixer_rms_eps == getattr(hf.config, "mixer_rms_eps", None)
    with torch.no_grad():
        logits, _ = ours(ids)
    assert logits.shape == hf_logits.shape
    torch.testing.assert_close(logits, hf_logits, atol=1e-4, rtol=0)


def test_hf_checkpoint_token_by_token_and_prefill_then_step(hf_checkpoint):
    hf, path, ids, hf_logits = hf_checkpoint
    config_dict = json.loads((path / "config.json").read_text())
    ours = load_ours(config_dict, load_file(path / "model.safetensors"))
    seq_len = ids.shape[1]
    with torch.no_grad():
        # Token by token from an empty cache, on both sides.
        out = hf(ids[:, :1], use_cache=True)
        cache, hf_steps = out.cache, [out.logits[:, 0]]
        for t in range(1, seq_len):
            out = hf(ids[:, t : t + 1], cache=cache, use_cache=True)
            cache = out.cache
            hf_steps.append(out.logits[:, 0])
        state, our_steps = ours.allocate_inference_cache(2), []
        for t in range(seq_len):
            step_logits, state = ours.step(ids[:, t], state)
            our_steps.append(step_logits)
        torch.testing.assert_close(torch.stack(hf_steps, 1), hf_logits, atol=1e-4, rtol=0)
        torch.testing.assert_close(torch.stack(our_steps, 1), hf_logits, atol=1e-4, rtol=0)

        # generate()-style: prefill a prompt, then one token at a time.
        cut = 5
        out = hf(ids[:, :cut], use_cache=True)
        cache, hf_gen = out.cache, [out.logits]
        prompt_logits, state = ours(ids[:, :cut])
        our_gen = [prompt_logits]
        for t in range(cut, seq_len):
            out = hf(ids[:, t : t + 1], cache=cache, use_cache=True)
            cache = out.cache
            hf_gen.append(out.logits)
            step_logits, state = ours.step(ids[:, t : t + 1], state)
            our_gen.append(step_logits[:, None])
        torch.testing.assert_close(torch.cat(our_gen, 1), torch.cat(hf_gen, 1), atol=1e-4, rtol=0)
        torch.testing.assert_close(torch.cat(our_gen, 1), hf_logits, atol=1e-4, rtol=0)


@pytest.mark.parametrize("hf_checkpoint", list(HF_VARIANTS), indirect=True)  # state-spaces has no Falcon norms
def test_state_spaces_layout_gives_hf_logits(hf_checkpoint):
    hf, path, ids, hf_logits = hf_checkpoint
    hc = hf.config
    original_config = {
        "d_model": hc.hidden_size,
        "d_intermediate": 0,
        "n_layer": hc.num_hidden_layers,
        "vocab_size": hc.vocab_size,
        "ssm_cfg": {
            "d_state": hc.state_size,
            "d_conv": hc.conv_kernel,
            "expand": hc.expand,
            "dt_rank": hc.time_step_rank,
            "bias": hc.use_bias,
            "conv_bias": hc.use_conv_bias,
            "dt_min": 0.001,
        },
        "attn_layer_idx": [],
        "attn_cfg": {},
        "rms_norm": True,
        "residual_in_fp32": True,
        "fused_add_norm": True,
        "pad_vocab_size_multiple": 8,
        "tie_embeddings": hc.tie_word_embeddings,
    }
    config = mamba_config_from_json(json.loads(json.dumps(original_config)))
    # As MambaLMHeadModel saves it: embedding already padded, no HF names;
    # lm_head absent when tied, padded like the embedding when not.
    sd = {k.replace("backbone.embeddings.", "backbone.embedding."): v for k, v in hf.state_dict().items()}
    sd.pop("lm_head.weight")
    pad = config.padded_vocab_size - hc.vocab_size
    sd["backbone.embedding.weight"] = torch.nn.functional.pad(sd["backbone.embedding.weight"], (0, 0, 0, pad))
    if not hc.tie_word_embeddings:
        sd["lm_head.weight"] = torch.nn.functional.pad(hf.lm_head.weight.detach(), (0, 0, 0, pad))
    ours = load_ours(original_config, sd)
    with torch.no_grad():
        logits, _ = ours(ids)
    torch.testing.assert_close(logits, hf_logits, atol=1e-4, rtol=0)


# ------------------------------------------------------------ configs and errors

def test_config_layouts_agree():
    ours = MambaConfig(d_model=32, n_layer=3, vocab_size=97, d_state=8, d_conv=3, bias=True, tie_embeddings=False)
    hf = {
        "model_type": "mamba", "hidden_size": 32, "num_hidden_layers": 3, "vocab_size": 97, "state_size": 8,
        "conv_kernel": 3, "expand": 2, "intermediate_size": 64, "time_step_rank": "auto", "use_bias": True,
        "use_conv_bias": True, "layer_norm_epsilon": 1e-5, "tie_word_embeddings": False, "transformers_version": "x",
        # the legacy duplicates of converted checkpoints:
        "d_model": 32, "n_layer": 3, "d_inner": 64, "ssm_cfg": {}, "rms_norm": True,
    }
    original = {
        "d_model": 32, "n_layer": 3, "vocab_size": 97, "tie_embeddings": False,
        "ssm_cfg": {"d_state": 8, "d_conv": 3, "bias": True, "dt_rank": "auto", "use_fast_path": True},
    }
    assert mamba_config_from_json({"family": "mamba", **ours.to_dict()}) == ours
    assert mamba_config_from_json(hf) == ours
    assert mamba_config_from_json(original) == ours


def test_falcon_mamba_width_comes_from_intermediate_size():
    """tiiuae/falcon-mamba-7b's config says expand 16 beside intermediate_size 8192 for a
    4096-wide model, and its weights are 8192 wide: intermediate_size decides."""
    seven_b = {"model_type": "falcon_mamba", "hidden_size": 4096, "num_hidden_layers": 64, "vocab_size": 65024,
               "state_size": 16, "conv_kernel": 4, "expand": 16, "intermediate_size": 8192, "time_step_rank": 256,
               "layer_norm_epsilon": 1e-05, "tie_word_embeddings": False, "use_bias": False, "use_conv_bias": True}
    config = mamba_config_from_json(seven_b)
    assert (config.d_inner, config.resolved_dt_rank, config.mixer_rms_eps) == (8192, 256, 1e-6)
    assert mamba_config_from_json({**seven_b, "mixer_rms_eps": 1e-3}).mixer_rms_eps == 1e-3
    # a Mamba (not Falcon) config that disagrees with itself is still refused
    with pytest.raises(ValueError, match="intermediate_size=8192"):
        mamba_config_from_json({**seven_b, "model_type": "mamba"})


@pytest.mark.parametrize(
    "config, match",
    [
        ({"model_type": "falcon_mamba", "hidden_size": 32, "num_hidden_layers": 2, "vocab_size": 10,
          "intermediate_size": 48}, "intermediate_size=48 is not a multiple of hidden_size=32"),
        ({"model_type": "falcon_mamba", "hidden_size": 32, "num_hidden_layers": 2, "vocab_size": 10,
          "mixer_rms_eps": 0}, "mixer_rms_eps"),
        ({"model_type": "falcon_h1", "hidden_size": 32}, "falcon_h1"),
        ({"model_type": "mamba", "hidden_size": 32, "num_hidden_layers": 2, "vocab_size": 10,
          "intermediate_size": 48}, "intermediate_size=48"),
        ({"model_type": "mamba", "hidden_size": 32, "num_hidden_layers": 2, "vocab_size": 10,
          "n_layer": 3}, "n_layer=3"),
        ({"model_type": "mamba2", "hidden_size": 32}, "mamba2"),
        ({"model_type": "mamba", "hidden_size": 32}, "num_hidden_layers"),
        ({"d_model": 32, "n_layer": 2, "vocab_size": 10, "ssm_cfg": {"layer": "Mamba2"}}, "Mamba2"),
        ({"d_model": 32, "n_layer": 2, "vocab_size": 10, "ssm_cfg": {}, "d_state": 8}, "d_state"),
        ({"family": "mamba", "d_model": 32, "hidden_size": 32}, "hidden_size"),
        ({"family": "transformer"}, "transformer"),
        ({"width": 32, "depth": 2}, "hidden_size"),
    ],
)
def test_bad_configs_are_refused_by_name(config, match):
    with pytest.raises(ValueError, match=match):
        mamba_config_from_json(config)


def test_mismatched_state_dicts_name_the_key():
    config = MambaConfig(**TINY)
    good = MambaLM(config).state_dict()

    missing = {k: v for k, v in good.items() if k != "backbone.layers.1.mixer.D"}
    with pytest.raises(RuntimeError, match=r"backbone\.layers\.1\.mixer\.D"):
        MambaLM(config).load_state_dict(convert_mamba_state_dict(missing, config), strict=True)

    wrong = {**good, "backbone.layers.0.mixer.x_proj.weight": torch.zeros(7, 32)}
    with pytest.raises(RuntimeError, match=r"backbone\.layers\.0\.mixer\.x_proj\.weight"):
        MambaLM(config).load_state_dict(convert_mamba_state_dict(wrong, config), strict=True)

    short_vocab = {**good, "backbone.embedding.weight": torch.zeros(40, 16)}
    with pytest.raises(ValueError, match="backbone.embedding.weight"):
        convert_mamba_state_dict(short_vocab, config)

    untied = {**good, "lm_head.weight": torch.ones(56, 16)}
    with pytest.raises(ValueError, match="lm_head.weight"):
        convert_mamba_state_dict(untied, config)

    both = {**good, "backbone.embeddings.weight": good["backbone.embedding.weight"]}
    with pytest.raises(ValueError, match="backbone.embeddings.weight"):
        convert_mamba_state_dict(both, config)


def test_convert_pads_vocab_and_does_not_modify_its_input():
    config = MambaConfig(**{**TINY, "vocab_size": 53})  # padded to 56
    sd = {k: v for k, v in MambaLM(config).state_dict().items() if k != "lm_head.weight"}
    sd["backbone.embeddings.weight"] = sd.pop("backbone.embedding.weight")[:53]
    before = dict(sd)
    out = convert_mamba_state_dict(sd, config)
    assert sd.keys() == before.keys()
    assert out["backbone.embedding.weight"].shape == (56, 16)
    assert out["lm_head.weight"] is out["backbone.embedding.weight"]
    torch.testing.assert_close(out["backbone.embedding.weight"][:53], before["backbone.embeddings.weight"])
    assert not out["backbone.embedding.weight"][53:].any()
