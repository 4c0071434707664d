"""models/mamba2.py and families/mamba2/layouts.py: the chunked SSD against the sequential
reference, forward / step / continuation agreement, and parity with transformers' own
`Mamba2ForCausalLM` torch path loaded from its saved checkpoint (and from a state-spaces
layout written from it)."""

import json
import math
from functools import partial

import pytest
import torch
import torch.nn.functional as F
from safetensors.torch import load_file, save_file
from seqexport.models.mamba2 import Mamba2Config, Mamba2LM, ssd_chunked, ssd_sequential

from seqexport.families.mamba2.layouts import (
    convert_state_dict,
    is_mamba2_config,
    mamba2_config_from_json,
)

transformers = pytest.importorskip("transformers")


def _max_err(a, b) -> float:
    return (a.double() - b.double()).abs().max().item()


def _ssd_inputs(b, length, h, p, g, n, dtype, seed=0):
    gen = torch.Generator().manual_seed(seed)
    r = partial(torch.randn, generator=gen, dtype=dtype)
    x = r(b, length, h, p)
    # Δ in about 0.5-3: decays exp(ΔA) far from 1, so a wrong segsum or state carry shows.
    dt = F.softplus(torch.rand(b, length, h, generator=gen, dtype=dtype) * 2.5 + 0.2)
    A = -torch.rand(h, generator=gen, dtype=dtype) * 1.5 - 0.1
    return x, dt, A, r(b, length, g, n), r(b, length, g, n), r(h), r(b, h, p, n)


@pytest.mark.parametrize("ngroups", [1, 2])
@pytest.mark.parametrize("chunk", [4, 8, 64])
@pytest.mark.parametrize("dtype, tol", [(torch.float64, 1e-10), (torch.float32, 1e-5)])
def test_ssd_chunked_equals_sequential(ngroups, chunk, dtype, tol):
    for length in sorted({1, 3, chunk - 1, chunk, chunk + 1, 3 * chunk + 2}):
        args = _ssd_inputs(2, length, 4, 3, ngroups, 5, dtype, seed=length)
        y_ref, h_ref = ssd_sequential(*args)
        y, h = ssd_chunked(*args, chunk=chunk)
        assert y.shape == y_ref.shape and h.shape == h_ref.shape
        scale = max(1.0, y_ref.abs().max().item())
        assert _max_err(y, y_ref) <= tol * scale, (length, _max_err(y, y_ref))
        assert _max_err(h, h_ref) <= tol * max(1.0, h_ref.abs().max().item()), (length, _max_err(h, h_ref))


def _states_err(s1, s2) -> float:
    return max(_max_err(a, b) for la, lb in zip(s1, s2, strict=True) for a, b in zip(la, lb, strict=True))


@pytest.mark.parametrize("ngroups, norm_before_gate", [(1, False), (2, True)])
def test_forward_step_and_continuation_agree(ngroups, norm_before_gate):
    torch.manual_seed(0)
    config = Mamba2Config(ngroups=ngroups, norm_before_gate=norm_before_gate, chunk_size=8)
    model = Mamba2LM(config).eval()
    with torch.no_grad():
        for layer in model.backbone.layers:
            layer.mixer.dt_bias.uniform_(0.5, 2.5)  # Δ ≈ 1-3
            layer.mixer.conv1d.bias.normal_(0, 0.2)
            layer.mixer.norm.weight.normal_(1, 0.2)
    ids = torch.randint(0, config.vocab_size, (2, 21))
    with torch.no_grad():
        ref, ref_state = model(ids)
        chunked, chunked_state = model(ids, scan=partial(ssd_chunked, chunk=config.chunk_size))
        state, steps = model.allocate_inference_cache(2), []
        for t in range(ids.shape[1]):
            logits, state = model.step(ids[:, t], state)
            steps.append(logits)
        head, mid = model(ids[:, :9], scan=partial(ssd_chunked, chunk=4))
        tail, tail_state = model(ids[:, 9:], mid, scan=partial(ssd_chunked, chunk=4))
    assert ref.shape == (2, 21, config.vocab_size) and ref.dtype == torch.float32
    assert _max_err(chunked, ref) < 1e-5 and _states_err(chunked_state, ref_state) < 1e-5
    assert _max_err(torch.stack(steps, 1), ref) < 1e-5 and _states_err(state, ref_state) < 1e-5
    assert _max_err(torch.cat([head, tail], 1), ref) < 1e-5 and _states_err(tail_state, ref_state) < 1e-5
    # The state is returned new: the zero state handed in is still zero.
    zero = model.allocate_inference_cache(2)
    model(ids[:, :3], zero)
    assert all(not s.any() for layer in zero for s in layer)


def _hf_model(ngroups: int, tie: bool = False, limit=None, seed: int = 0):
    torch.manual_seed(seed)
    kwargs = {} if limit is None else {"time_step_limit": limit}
    config = transformers.Mamba2Config(
        hidden_size=64, num_hidden_layers=3, vocab_size=100, state_size=16, conv_kernel=4, expand=2,
        head_dim=16, num_heads=8, n_groups=ngroups, chunk_size=8, tie_word_embeddings=tie, **kwargs,
    )
    model = transformers.Mamba2ForCausalLM(config).eval()
    with torch.no_grad():
        for layer in model.backbone.layers:
            mixer = layer.mixer
            dt = torch.rand(8) * 2 + 1  # softplus(dt + dt_bias) ≈ 1-3
            mixer.dt_bias.copy_(dt + torch.log(-torch.expm1(-dt)))
            mixer.A_log.copy_(torch.log(torch.rand(8) * 0.5 + 0.05))  # decays exp(ΔA) over a wide range
            mixer.D.uniform_(0.5, 1.5)
            mixer.conv1d.bias.normal_(0, 0.2)
            mixer.norm.weight.normal_(1, 0.3)
            layer.norm.weight.normal_(1, 0.2)
    return model


def _load_ours(path) -> Mamba2LM:
    config = mamba2_config_from_json(json.loads((path / "config.json").read_text()))
    model = Mamba2LM(config).eval()
    model.load_state_dict(convert_state_dict(load_file(path / "model.safetensors"), config), strict=True)
    return model


def _hf_decode(model, prompt, steps):
    """transformers' prefill then single steps, feeding its Cache back; logits (b, l+steps, v)."""
    with torch.no_grad():
        out = model(prompt, use_cache=True)
        cache, logits = out.cache, [out.logits]
        for token in steps.T:
            out = model(token[:, None], cache=cache, use_cache=True)
            cache = out.cache
            logits.append(out.logits)
    states = [(cache.layers[i].conv_states[0], cache.layers[i].recurrent_states[0])
              for i in range(len(model.backbone.layers))]
    return torch.cat(logits, 1), states


def _our_decode(model, prompt, steps, scan):
    with torch.no_grad():
        logits, state = model(prompt, scan=scan)
        out = [logits]
        for token in steps.T:
            logits, state = model.step(token, state)
            out.append(logits[:, None])
    return torch.cat(out, 1), state


@pytest.mark.parametrize("ngroups", [1, 2])
def test_parity_with_transformers(tmp_path, ngroups):
    hf = _hf_model(ngroups)
    hf.save_pretrained(tmp_path)
    ours = _load_ours(tmp_path)
    assert ours.config.ngroups == ngroups and ours.config.padded_vocab_size == 100
    assert ours.config.dt_max_limit is None and not ours.config.tie_embeddings
    gen = torch.Generator().manual_seed(ngroups)
    for length in (1, 17, 300):
        prompt = torch.randint(0, 100, (2, length), generator=gen)
        steps = torch.randint(0, 100, (2, 20), generator=gen)
        want, want_state = _hf_decode(hf, prompt, steps)
        # the sequential reference on the short prompts only (it is what ssd_chunked is tested against)
        for scan in (partial(ssd_chunked, chunk=16), *([ssd_sequential] if length < 100 else [])):
            got, state = _our_decode(ours, prompt, steps, scan)
            assert _max_err(got, want) < 1e-4, (length, _max_err(got, want))
            for (conv, ssm), (hf_conv, hf_ssm) in zip(state, want_state, strict=True):
                assert conv.shape == hf_conv.shape and ssm.shape == hf_ssm.shape
                assert _max_err(conv, hf_conv) < 1e-4 and _max_err(ssm, hf_ssm) < 1e-4


def test_parity_with_transformers_time_step_limit(tmp_path):
    """A binding Δ clamp: transformers clamps in its chunked prefill (its single-token path
    does not), so only prefill logits are compared; ours clamps in both."""
    hf = _hf_model(2, limit=(0.0, 1.5))
    hf.save_pretrained(tmp_path)
    ours = _load_ours(tmp_path)
    assert ours.config.dt_max_limit == 1.5
    prompt = torch.randint(0, 100, (2, 40), generator=torch.Generator().manual_seed(3))
    with torch.no_grad():
        want = hf(prompt).logits
        got, _ = ours(prompt, scan=partial(ssd_chunked, chunk=8))
        unclamped = Mamba2LM(Mamba2Config(**{**ours.config.to_dict(), "dt_max_limit": None}))
        unclamped.load_state_dict(ours.state_dict())
        off, _ = unclamped(prompt)
    assert _max_err(got, want) < 1e-4
    assert _max_err(off, want) > 1e-3  # the clamp binds: without it the logits move


def test_float16_follows_float32():
    torch.manual_seed(0)
    model = Mamba2LM(Mamba2Config(ngroups=2, chunk_size=8)).eval()
    ids = torch.randint(0, 100, (2, 19))
    half = Mamba2LM(model.config).eval()
    half.load_state_dict(model.state_dict())
    half = half.half()
    with torch.no_grad():
        want, want_state = model(ids)
        got, state = half(ids, scan=partial(ssd_chunked, chunk=8))
        step_logits, state = half.step(ids[:, -1], state)
    assert got.dtype == torch.float32 and state[0][1].dtype == torch.float32 and state[0][0].dtype == torch.float16
    assert _max_err(got, want) < 2e-2
    assert torch.isfinite(step_logits).all()


def test_state_spaces_layout_loads(tmp_path):
    hf = _hf_model(2, tie=True, seed=1)
    hf.save_pretrained(tmp_path / "hf")
    hf_config = json.loads((tmp_path / "hf" / "config.json").read_text())
    sd = load_file(tmp_path / "hf" / "model.safetensors")
    ss = {("backbone.embedding.weight" if k == "backbone.embeddings.weight" else k): v
          for k, v in sd.items() if k != "lm_head.weight"}
    emb = ss["backbone.embedding.weight"]
    ss["backbone.embedding.weight"] = torch.cat([emb, torch.randn(12, emb.shape[1])])  # 100 -> 112 rows
    (tmp_path / "ss").mkdir()
    save_file(ss, tmp_path / "ss" / "model.safetensors")
    ssm_cfg = {"layer": "Mamba2", "d_state": 16, "d_conv": 4, "expand": 2, "headdim": 16, "ngroups": 2,
               "chunk_size": 8, "dt_limit": [0.0, math.inf]}
    (tmp_path / "ss" / "config.json").write_text(json.dumps({
        "d_model": 64, "d_intermediate": 0, "n_layer": 3, "vocab_size": 100, "ssm_cfg": ssm_cfg,
        "attn_layer_idx": [], "attn_cfg": {}, "rms_norm": True, "residual_in_fp32": True, "fused_add_norm": True,
        "pad_vocab_size_multiple": 16, "tie_embeddings": True,
    }))
    assert hf_config["tie_word_embeddings"] is True
    ours = _load_ours(tmp_path / "ss")
    assert ours.config.padded_vocab_size == 112 and ours.config.ngroups == 2
    prompt = torch.randint(0, 100, (1, 30), generator=torch.Generator().manual_seed(5))
    with torch.no_grad():
        want = hf(prompt).logits
        got, _ = ours(prompt, scan=partial(ssd_chunked, chunk=8))
    assert got.shape == want.shape and _max_err(got, want) < 1e-4


_SS = {"d_model": 64, "n_layer": 2, "vocab_size": 100, "ssm_cfg": {"layer": "Mamba2", "d_state": 16, "headdim": 16}}
_HF = {"model_type": "mamba2", "hidden_size": 64, "num_hidden_layers": 2, "vocab_size": 100, "num_heads": 8,
       "head_dim": 16, "n_groups": 1}


@pytest.mark.parametrize("config, key", [
    ({**_SS, "attn_layer_idx": [1]}, "attn_layer_idx"),
    ({**_SS, "d_intermediate": 128}, "d_intermediate"),
    ({**_SS, "ssm_cfg": {**_SS["ssm_cfg"], "D_has_hdim": True}}, "D_has_hdim"),
    ({**_SS, "ssm_cfg": {**_SS["ssm_cfg"], "d_ssm": 64}}, "d_ssm"),
    ({**_SS, "rms_norm": False}, "rms_norm"),
    ({**_SS, "ssm_cfg": {"d_state": 16}}, "ssm_cfg.layer"),
    ({**_HF, "model_type": "mamba"}, "model_type"),
    ({**_HF, "num_heads": 4}, "num_heads"),
    ({**_HF, "n_groups": 3}, "ngroups"),
    ({**_HF, "time_step_limit": [0.0]}, "time_step_limit"),
])
def test_refusals_name_the_key(config, key):
    with pytest.raises(ValueError, match=key):
        mamba2_config_from_json(config)


def test_layout_defaults_and_detection():
    ss = mamba2_config_from_json({"d_model": 64, "n_layer": 2, "vocab_size": 100, "ssm_cfg": {"layer": "Mamba2"}})
    # mamba_ssm's Mamba2 defaults, not ours; MambaConfig's pad multiple 8
    assert (ss.d_state, ss.headdim, ss.chunk_size, ss.padded_vocab_size) == (128, 64, 256, 104)
    hf = mamba2_config_from_json({**_HF, "time_step_limit": [0.0, {"__float__": "Infinity"}]})
    assert hf.dt_max_limit is None and hf.padded_vocab_size == 100 and hf.d_state == 128
    assert mamba2_config_from_json(Mamba2Config(ngroups=2).to_dict()) == Mamba2Config(ngroups=2)
    assert is_mamba2_config(_HF) and is_mamba2_config(_SS)
    assert not is_mamba2_config({"model_type": "mamba", "hidden_size": 64})
    assert not is_mamba2_config({"d_model": 64, "n_layer": 2, "vocab_size": 100, "ssm_cfg": {}})
    assert not is_mamba2_config({"d_model": 64, "n_layer": 2, "ssm_cfg": {"layer": "Mamba1"}})


def test_a_transformers_config_json_missing_keys_reads_as_mamba2config_does():
    """A config.json holding only what the layout requires: every omitted key takes the value
    transformers' own Mamba2Config gives it (n_groups 8, state_size 128, ...), not ours."""
    given = {"model_type": "mamba2", "hidden_size": 64, "num_hidden_layers": 2, "vocab_size": 100,
             "num_heads": 8, "head_dim": 16}
    theirs = transformers.Mamba2Config(**{k: v for k, v in given.items() if k != "model_type"})
    ours = mamba2_config_from_json(given)
    assert (ours.ngroups, ours.d_state, ours.d_conv, ours.chunk_size, ours.bias, ours.conv_bias) == (
        theirs.n_groups, theirs.state_size, theirs.conv_kernel, theirs.chunk_size, theirs.use_bias,
        theirs.use_conv_bias)
    assert (ours.rms_norm_eps, ours.tie_embeddings, ours.nheads, ours.headdim) == (
        theirs.layer_norm_epsilon, theirs.tie_word_embeddings, theirs.num_heads, theirs.head_dim)


def test_a_tied_config_with_a_different_head_is_refused():
    config = Mamba2Config(n_layer=1, tie_embeddings=True)
    sd = dict(Mamba2LM(config).state_dict())
    assert torch.equal(convert_state_dict(sd, config)["lm_head.weight"], sd["backbone.embedding.weight"])
    untied = {**sd, "lm_head.weight": sd["backbone.embedding.weight"] + 1e-3}
    with pytest.raises(ValueError, match="'lm_head.weight' differs from 'backbone.embedding.weight'"):
        convert_state_dict(untied, config)


def test_convert_state_dict_refusals():
    config = Mamba2Config(n_layer=1)
    sd = {k: v for k, v in Mamba2LM(config).state_dict().items()}
    with pytest.raises(ValueError, match="backbone.layers.0.mixer.dt_bias"):
        convert_state_dict({k: v for k, v in sd.items() if not k.endswith("dt_bias")}, config)
    wide = dict(sd)
    wide["backbone.layers.0.mixer.in_proj.weight"] = torch.zeros(sd["backbone.layers.0.mixer.in_proj.weight"].shape[0]
                                                                 + 256, 64)
    with pytest.raises(ValueError, match="d_mlp"):
        convert_state_dict(wide, config)
    half = {k: v.half() for k, v in sd.items()}
    assert all(v.dtype == torch.float32 for v in convert_state_dict(half, config).values())


@pytest.mark.parametrize("field, value", [("headdim", 24), ("ngroups", 3), ("dt_max_limit", math.inf),
                                          ("chunk_size", 0), ("norm_before_gate", 1)])
def test_config_validation_names_the_field(field, value):
    with pytest.raises(ValueError, match=field):
        Mamba2Config(**{field: value})


class _Chunked(torch.nn.Module):
    def forward(self, x, dt, A, B, C, D, h0):
        return ssd_chunked(x, dt, A, B, C, D, h0, chunk=4)


def test_ssd_chunked_exports_with_a_dynamic_length(tmp_path):
    """No data-dependent Python on l: one ONNX graph (torch.onnx, dynamo) serves every length,
    fewer than a chunk included."""
    ort = pytest.importorskip("onnxruntime")
    args = _ssd_inputs(2, 11, 4, 3, 2, 5, torch.float32)
    b, l_ = torch.export.Dim("b"), torch.export.Dim("l")
    dynamic = ({0: b, 1: l_}, {0: b, 1: l_}, None, {0: b, 1: l_}, {0: b, 1: l_}, None, {0: b})
    names = ["x", "dt", "A", "B", "C", "D", "h0"]
    program = torch.onnx.export(_Chunked(), args, dynamo=True, input_names=names, output_names=["y", "h"],
                                dynamic_shapes=dynamic, verbose=False)
    program.save(tmp_path / "ssd.onnx")
    session = ort.InferenceSession(tmp_path / "ssd.onnx")
    for batch, length in ((1, 1), (2, 4), (3, 5), (2, 11)):
        args = _ssd_inputs(batch, length, 4, 3, 2, 5, torch.float32, seed=length)
        y, h = session.run(None, {name: a.numpy() for name, a in zip(names, args, strict=True)})
        y_ref, h_ref = ssd_sequential(*args)
        assert _max_err(torch.from_numpy(y), y_ref) < 1e-4 and _max_err(torch.from_numpy(h), h_ref) < 1e-4
