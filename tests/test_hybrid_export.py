"""Hybrid attention + Mamba-2 export end to end, from checkpoints in transformers' layouts
(`BambaForCausalLM`, `GraniteMoeHybridForCausalLM` dense with RoPE and with NoPE and with
experts, `NemotronHForCausalLM`, `FalconH1ForCausalLM` (attention beside Mamba-2 in every layer);
attention at the first, a middle and the last layer; GQA 4:2): the
exported graphs through the torch-free runtime against transformers' own models, prompts of 1,
17 and 300 tokens then 20 single steps, every layer's state of both kinds; rows at different
positions in one call; validate and its layer localisation through both layer kinds; the
serving engine's continuous batching; both forms of the experts (ONNX Runtime's MoE kernel, the
standard dense form)."""

import json
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import onnx
import pytest
import requests
import torch
from click.testing import CliRunner
from onnx import numpy_helper

import seqexport.runtime as rt
from seqexport.cli import cli
from seqexport.families.hybrid.layouts import hybrid_config_from_json
from seqexport.parity.validate import validate
from seqexport.runtime.engine import Engine
from seqexport.serve.process import ServerProcess
from tests.damage import damaged_copy
from tests.test_hybrid_model import HF_MODELS, VOCAB, _hf, _hf_decode, hf_kinds

TOL = 1e-4


@pytest.fixture(scope="module")
def exported(tmp_path_factory):
    """name -> (transformers' model, runtime model, export folder), exported on first use."""
    made = {}

    def get(name):
        if name not in made:
            tmp = tmp_path_factory.mktemp(name)
            hf = _hf(name, seed=len(name))
            hf.save_pretrained(tmp / "hf")
            result = CliRunner().invoke(cli, ["export", "hybrid", "--checkpoint", str(tmp / "hf"),
                                              "--out", str(tmp / "export")])
            assert result.exit_code == 0, result.output
            made[name] = hf, rt.load(tmp / "export", provider="cpu", threads=1), tmp / "export"
        return made[name]

    return get


def kinds_of(hf) -> list[str]:
    return hf_kinds(hf.config)


def assert_states_equal(state, want, kinds, rows=slice(None), first=0):
    """Every layer's state against transformers' cache: the Mamba-2 conv/SSM tensors whole, the
    attention K/V on each row's valid slots (`want` and `kinds` from layer `first` on)."""
    lengths = state.arrays["past_lengths"][rows]
    for i, (kind, layer) in enumerate(zip(kinds, want, strict=True), start=first):
        if kind == "hybrid":  # Falcon-H1: attention's K/V, then the mixer's conv/SSM
            assert_states_equal(state, [layer[:2]], ["full_attention"], rows, first=i)
            assert_states_equal(state, [layer[2:]], ["linear_attention"], rows, first=i)
        elif kind == "conv":  # LFM2's short conv
            np.testing.assert_allclose(state.arrays[f"past_conv_state.{i}"][rows], layer[0], atol=TOL, rtol=0)
        elif kind == "linear_attention":
            np.testing.assert_allclose(state.arrays[f"past_conv_state.{i}"][rows], layer[0], atol=TOL, rtol=0)
            np.testing.assert_allclose(state.arrays[f"past_ssm_state.{i}"][rows], layer[1], atol=TOL, rtol=0)
        elif kind == "full_attention":  # (Kimi-Linear's latent attention: its latents and shared key parts)
            parts = ("latent", "rope") if f"past_key_values.{i}.latent" in state.arrays else ("key", "value")
            for kv, theirs in zip(parts, layer, strict=True):
                ours = state.arrays[f"past_key_values.{i}.{kv}"][rows]
                assert (lengths == theirs.shape[2]).all()
                np.testing.assert_allclose(ours[:, :, : theirs.shape[2]], theirs, atol=TOL, rtol=0)
        elif kind == "sliding_attention":  # our window, its last slots each row's latest positions
            for kv, theirs in zip(("key", "value"), layer, strict=True):  # (transformers: the last W - 1)
                ours = state.arrays[f"past_window.{i}.{kv}"][rows]
                np.testing.assert_allclose(ours[:, :, ours.shape[2] - theirs.shape[2]:], theirs, atol=TOL, rtol=0)


@pytest.mark.parametrize("name", list(HF_MODELS))
@pytest.mark.parametrize("length", [1, 17, 300])
def test_prefill_then_20_steps_equal_transformers(exported, name, length):
    hf, m, _ = exported(name)
    assert_decode_equals_transformers(hf, m, length, 20, seed=length)


def assert_decode_equals_transformers(hf, m, length: int, n_steps: int, seed: int) -> None:
    """Two random prompts of `length` through the runtime model `m`, then `n_steps` single steps:
    every position's logits and the final state of every layer equal transformers' `hf`."""
    g = torch.Generator().manual_seed(seed)
    prompt, steps = torch.randint(0, VOCAB, (2, length), generator=g), torch.randint(0, VOCAB, (2, n_steps), generator=g)
    want, _, want_state = _hf_decode(hf, prompt, steps)
    logits, state = m.step(prompt.numpy(), m.start(2))  # (2, length, v): every position
    got = [logits]
    for token in steps.T:
        logits, state = m.step(token.numpy(), state)
        got.append(logits[:, None])
    np.testing.assert_allclose(np.concatenate(got, 1), want.numpy(), atol=TOL, rtol=0)
    assert_states_equal(state, [tuple(t.numpy() for t in layer) for layer in want_state], kinds_of(hf))


@pytest.mark.parametrize("name", ["granite-rope", "falcon_h1", "lfm2", "jamba", "qwen3_5", "olmo_hybrid", "lfm3",
                                  "zamba2", "kimi_linear", "ling3"])
def test_a_prompt_fed_in_turns_gives_transformers_logits(exported, name):
    """A chat's turns: a prefill, then more prefills continuing the same rows (each reads the
    slots the rows hold, its cache cut to them or read whole with its spare slots), then a step:
    every position's logits and the final state are transformers' over the whole sequence."""
    hf, m, _ = exported(name)
    g = torch.Generator().manual_seed(11)
    turns = [torch.randint(0, VOCAB, (2, n), generator=g) for n in (17, 40, 2, 1)]
    want, _, want_state = _hf_decode(hf, torch.cat(turns[:-1], 1), turns[-1])
    state, got = m.start(2), []
    for turn in turns:
        logits, state = m.step(turn.numpy(), state)
        got.append(logits if logits.ndim == 3 else logits[:, None])
    np.testing.assert_allclose(np.concatenate(got, 1), want.numpy(), atol=TOL, rtol=0)
    assert_states_equal(state, [tuple(t.numpy() for t in layer) for layer in want_state], kinds_of(hf))


@pytest.mark.parametrize("name", ["nemotron_h", "falcon_h1", "lfm2", "lfm3", "kimi_linear"])
def test_a_step_reads_the_cache_where_it_lies(exported, name):
    """The step graph's attention takes each past K/V input straight into its products (K
    through a transpose): no copy of the cache per query head, nor with the new K/V appended,
    which a step at 4096 tokens of Falcon-H1-Tiny's shape took 2.2x as long with."""
    import onnx

    _, _, out = exported(name)
    graph = onnx.load(out / "step.onnx", load_external_data=False).graph
    readers = {}
    for node in graph.node:
        for name_in in node.input:
            readers.setdefault(name_in, []).append(node)
    caches = [i.name for i in graph.input if i.name.startswith("past_key_values.")]
    assert caches
    for cache in caches:
        nodes = [n for n in readers[cache] if n.op_type != "Shape"]  # its slot count, read without a copy
        ops = sorted(n.op_type for n in nodes)
        # (a latent attention's latent is its keys and its values: read by both products)
        assert ops in (["MatMul"], ["Transpose"], ["MatMul", "Transpose"]), (cache, ops)
        for transpose in (n for n in nodes if n.op_type == "Transpose"):
            assert [n.op_type for n in readers[transpose.output[0]]] == ["MatMul"], cache


def test_a_fresh_prompt_reads_no_spare_cache_slots(exported):
    """A prefill from fresh rows gets empty cache inputs, not the buffers sized for the prompt
    (whose spare slots every prompt token would attend over, masked: at 1024 tokens of
    Falcon-H1-Tiny's shape the prefill took 1.5x as long)."""
    _, m, _ = exported("falcon_h1")
    graph, seen = m.graphs["prefill"], {}
    run = graph.run
    graph.run = lambda feeds: seen.update(feeds) or run(feeds)
    try:
        m.step(np.arange(30)[None] % VOCAB, m.start(1))
    finally:
        del graph.run
    assert seen["past_key_values.0.key"].shape == (1, 2, 0, 16)  # (b, nkv, no slots, hd)
    assert seen["past_conv_state.0"].shape == (1, 96 + 2 * 2 * 16, 4)  # replaced state: as it is


@pytest.mark.parametrize("name", ["granite-rope", "falcon_h1", "lfm2", "jamba", "qwen3_5", "olmo_hybrid", "lfm3",
                                  "zamba2", "kimi_linear-q"])
def test_the_eager_model_behind_the_step_api_equals_transformers(exported, name):
    """The cached eager decoder that bench, the demo and training drive (its KV cache appended
    through the same state layout as the runtime's; Falcon-H1's layers hold both kinds): a
    prompt then single steps, every logit and every layer's final state are transformers'."""
    from seqexport import families
    from seqexport.checkpoints.io import load_checkpoint

    hf, _, out = exported(name)
    eager = families.eager_model(load_checkpoint(out.parent / "hf"), None, cache=True)
    assert_decode_equals_transformers(hf, eager, 17, 8, seed=5)


@pytest.mark.parametrize("name", ["bamba", "falcon_h1", "lfm2-tied", "jamba", "qwen3_5", "olmo_hybrid-nope", "lfm3",
                                  "zamba2-plain", "kimi_linear", "ling3"])
def test_rows_at_different_positions_share_each_call(exported, name):
    """Right-padded prompts of unequal length in one prefill, then every row stepped together
    (each at its own position): each row's logits and state equal transformers' for it alone."""
    hf, m, _ = exported(name)
    g = np.random.default_rng(3)
    rows = [list(map(int, g.integers(0, VOCAB, n))) for n in (17, 3, 40, 1, 25)]
    logits, state = m.begin(rows)
    assert m.ragged_prefill and list(state.arrays["past_lengths"]) == [17, 3, 40, 1, 25]
    steps = g.integers(0, VOCAB, (len(rows), 6))
    got = [logits]
    for token in steps.T:
        logits, state = m.step(token, state)
        got.append(logits)
    got = np.stack(got, 1)  # (rows, 7, v)
    for r, row in enumerate(rows):
        want, _, want_state = _hf_decode(hf, torch.tensor([row]), torch.from_numpy(steps[r:r + 1]))
        np.testing.assert_allclose(got[r], want[0, len(row) - 1:].numpy(), atol=TOL, rtol=0)
        assert_states_equal(state, [tuple(t.numpy() for t in layer) for layer in want_state], kinds_of(hf),
                            rows=slice(r, r + 1))


def test_a_sliding_layers_state_is_its_window_however_long_the_context(exported):
    """LFM3's sliding layers (a 5-position window) hold 5 slots after 60 tokens, declared
    replaced with a fixed size in both graphs, while the full layer's appended cache holds every
    position; the logits stay transformers' (the prefill-then-steps test checks them)."""
    hf, m, _ = exported("lfm3")
    windowed = [i for i, t in enumerate(kinds_of(hf)) if t == "sliding_attention"]
    state = m.start(2)
    for turn in (np.arange(40).reshape(2, 20) % VOCAB, np.arange(40).reshape(2, 20) % VOCAB, np.array([3, 4])):
        _, state = m.step(turn, state)
    for graph in ("prefill", "step"):
        spec = m.specs[graph]
        for i in windowed:
            assert spec.input(f"past_window.{i}.key").dims == ("batch", 2, 5, 16)
            assert (f"present_window.{i}.key", f"past_window.{i}.key") in spec.feeds
    assert all(state.arrays[f"past_window.{i}.value"].shape == (2, 2, 5, 16) for i in windowed)
    assert state.arrays["past_key_values.3.key"].shape[2] >= 41 and list(state.arrays["past_lengths"]) == [41, 41]


def test_a_branch_copies_the_cache_once_and_leaves_the_earlier_state_as_it_was(exported):
    _, m, _ = exported("nemotron_h")
    prompt = np.arange(3, 23)[None]
    _, state = m.step(prompt, m.start(1))
    before = {k: np.array(v) for k, v in state.arrays.items()}
    a, after_a = m.step(np.array([5]), state)
    b, _ = m.step(np.array([5]), state)  # the same state stepped again: a branch
    np.testing.assert_array_equal(a, b)
    for k, v in before.items():  # its valid slots (the newest state writes past them in place)
        valid = (slice(None), slice(None), slice(0, 20)) if k.startswith("past_key_values.") else ()
        np.testing.assert_array_equal(state.arrays[k][valid], v[valid])
    assert after_a.arrays["past_lengths"][0] == 21


def test_a_long_validate_compares_the_final_cache_over_the_slots_it_uses(exported):
    """The teacher-forced decode's cache, grown step by step, has more slots than the eager
    one written in one call: compared over the positions both hold. Before, `validate --steps`
    120 and more failed every hybrid on the cache's shape (max abs inf)."""
    _, _, out = exported("granite-rope")
    result = CliRunner().invoke(cli, ["validate", str(out), "--steps", "150"])
    assert result.exit_code == 0, result.output
    assert "final past_key_values." in result.output and "inf" not in result.output


@pytest.mark.parametrize("name", ["granite-rope", "falcon_h1", "lfm2", "lfm2-moe", "jamba", "qwen3_5",
                                  "olmo_hybrid", "lfm3", "zamba2", "kimi_linear", "ling3", "ling3-clipped"])
def test_validate_passes_and_engine_rows_get_their_generate_tokens(exported, name):
    _, m, out = exported(name)
    result = CliRunner().invoke(cli, ["validate", str(out), "--steps", "8"])
    assert result.exit_code == 0, result.output
    assert "result: PASS" in result.output
    rng = np.random.default_rng(0)
    prompts = [rng.integers(3, VOCAB, int(rng.integers(1, 30))).tolist() for _ in range(12)]
    options = [rt.SearchOptions(max_new_tokens=1 + (5 * i) % 11, eos_id=-1) for i in range(12)]
    engine = Engine(m, max_rows=4)
    reqs = [engine.submit(p, o) for p, o in zip(prompts, options)]
    while engine.has_work():
        engine.step()
    assert [r.tokens for r in reqs] == [rt.generate(m, [p], o)[0] for p, o in zip(prompts, options)]


@pytest.mark.parametrize("graph", ["prefill", "step"])
@pytest.mark.parametrize("layer, weight", [(2, "mixer.q_proj.weight.T"), (3, "mixer.out_proj.weight.T")],
                         ids=["attention", "mamba2"])
def test_a_damaged_weight_fails_naming_its_layer(exported, tmp_path, graph, layer, weight):
    hf, _, out = exported("bamba")
    assert kinds_of(hf)[layer] == ("full_attention" if "q_proj" in weight else "linear_attention")
    bad = damaged_copy(out, tmp_path, graph, f"model.layers.{layer}.{weight}", delta=0.5)
    report = validate(bad, steps=4, write_summary=False)
    assert not report.passed
    failing = [c for c in report.cases if c.check == "graphs" and not c.passed]
    assert failing and all(c.label.startswith(graph) for c in failing)
    assert failing[0].divergence.layer == f"layers.{layer}"


@pytest.mark.parametrize("name", ["bamba", "lfm2", "jamba", "qwen3_5", "olmo_hybrid", "zamba2", "kimi_linear",
                                  "ling3", "granite-moe", "qwen3_5-moe"])
def test_int4_keeps_float_only_the_mamba2_mixers_in_proj_and_the_routers(exported, tmp_path, name):
    """A Mamba-2 mixer's in_proj (Δ, B, C of the scan) stays float32, and a Mamba-1 mixer's x_proj
    and dt_proj (Jamba), and a Gated DeltaNet's in_proj (its keys and queries), a_proj and b_proj
    (its decay and write strength: Qwen3.5); a short conv's in_proj (LFM2), whose window of a few
    tokens forgets the error, goes int4 like every other linear, as do the DeltaNet's z and out
    projections. Every experts layer's router stays float32 (its choice is discrete), and a
    gated shared expert's gate (Qwen3.5-MoE), while the experts themselves go int4."""
    hf, m, out = exported(name)
    result = CliRunner().invoke(cli, ["quantize", str(out), "--bits", "4", "--out", str(tmp_path / "q")])
    assert result.exit_code == 0, result.output
    q = json.loads((tmp_path / "q" / "manifest.json").read_text())["quantization"]
    mambas = [i for i, kind in enumerate(kinds_of(hf)) if kind in ("linear_attention", "hybrid")]
    assert (name == "lfm2") == (not mambas)
    deltanet = ("in_proj", "a_proj", "b_proj")
    kda = ("in_proj", "f_a_proj", "f_b_proj", "b_proj")  # (its decay: a low-rank pair)
    parts = {"jamba": ("x_proj", "dt_proj"), "qwen3_5": deltanet, "olmo_hybrid": deltanet, "qwen3_5-moe": deltanet,
             "kimi_linear": kda, "ling3": ("in_proj", "f_proj", "b_proj")}.get(name, ("in_proj",))
    # the layers with experts, by transformers' own modules: a router is an (E, d) gate or router
    n_experts = getattr(hf.config, "num_experts", None) or getattr(hf.config, "num_local_experts", 0)
    experts = sorted({int(k.split(".")[2]) for k, module in hf.named_modules() if k.startswith("model.layers.")
                      and k.endswith((".gate", ".router")) and getattr(module, "weight", None) is not None
                      and module.weight.shape[0] == n_experts})
    assert bool(experts) == (name in ("kimi_linear", "ling3", "granite-moe", "qwen3_5-moe")), experts
    routing = {f"layers.{i}.experts.router" for i in experts}
    if name == "qwen3_5-moe":
        routing |= {f"layers.{i}.shared_gate" for i in experts}
    for graph in ("prefill", "step"):
        assert set(q["kept_float"][graph]) == {f"layers.{i}.mixer.{p}" for i in mambas for p in parts} | routing
        nodes = onnx.load(str(tmp_path / "q" / f"{graph}.onnx"), load_external_data=False).graph.node
        # the experts int4 (QMoE), each router a float32 MatMul
        assert len([n for n in nodes if n.op_type == "QMoE"]) == len(experts)
        routers = [n for n in nodes if any(".experts.router.weight" in i for i in n.input)]
        assert len(routers) == len(experts) and {n.op_type for n in routers} <= {"MatMul"}
    quantized = rt.load(tmp_path / "q", provider="cpu", threads=1)
    prompt = np.arange(1, 9)[None] % VOCAB
    want, _ = m.step(prompt, m.start(1))
    got, _ = quantized.step(prompt, quantized.start(1))
    if experts:  # int4 upstream of a router flips some tokens' expert choices (discrete): coarser, still this model's
        assert np.corrcoef(got.ravel(), want.ravel())[0, 1] > 0.5
    else:
        assert np.abs(got - want).max() < 0.5 * np.abs(want).max()  # int4's error, not another model's



def test_quantize_sensitive_takes_the_familys_kept_projections_to_int4_too(exported, tmp_path):
    """`--quantize-sensitive`: the projections the family keeps float32 (here a Gated DeltaNet's
    in_proj, a_proj and b_proj) go int4 with the rest; the manifest names the rule it waived; the
    copy still decodes close to float32, and more coarsely than with the rule kept."""
    hf, m, out = exported("qwen3_5")
    for flags, q in (([], "kept"), (["--quantize-sensitive"], "all")):
        result = CliRunner().invoke(cli, ["quantize", str(out), "--bits", "4", "--out", str(tmp_path / q), *flags])
        assert result.exit_code == 0, result.output
    kept, every = (json.loads((tmp_path / q / "manifest.json").read_text())["quantization"] for q in ("kept", "all"))
    deltanets = [i for i, kind in enumerate(kinds_of(hf)) if kind == "linear_attention"]
    rule = [f"*layers.{i}.mixer.{p}" for i in deltanets for p in ("in_proj", "a_proj", "b_proj")]
    assert kept["family_kept_float"] == rule and "sensitive_quantized" not in kept
    assert every["family_kept_float"] == [] and every["sensitive_quantized"] == rule
    for graph in ("prefill", "step"):
        assert every["kept_float"][graph] == []
        nbits = {n.name for n in onnx.load(str(tmp_path / "all" / f"{graph}.onnx"), load_external_data=False).graph.node
                 if n.op_type == "MatMulNBits"}
        float_nbits = {n.name for n in onnx.load(str(tmp_path / "kept" / f"{graph}.onnx"),
                                                 load_external_data=False).graph.node if n.op_type == "MatMulNBits"}
        assert len(nbits) == len(float_nbits) + 3 * len(deltanets)
    prompt = np.arange(1, 9)[None] % VOCAB
    want, _ = m.step(prompt, m.start(1))
    errors = []
    for q in ("kept", "all"):
        quantized = rt.load(tmp_path / q, provider="cpu", threads=1)
        got, _ = quantized.step(prompt, quantized.start(1))
        errors.append(float(np.abs(got - want).max()))
        # int4 of a tiny random model is coarse, but still this model's logits (another's: about 0)
        assert np.corrcoef(got.ravel(), want.ravel())[0, 1] > 0.5, q
    assert errors[0] < errors[1]  # the rule keeps what it keeps for a reason

def _ops(path) -> dict[tuple[str, str], int]:
    import collections

    import onnx

    return collections.Counter((n.domain, n.op_type) for n in onnx.load(path, load_external_data=False).graph.node)


def _expert_gathers(path) -> int:
    """Gather nodes whose data is a 3-D weight (an expert stack)."""
    import onnx

    model = onnx.load(path, load_external_data=False)
    stacks = {i.name for i in model.graph.initializer if len(i.dims) == 3}
    return sum(n.op_type in ("Gather", "GatherND") and n.input[0] in stacks for n in model.graph.node)


@pytest.mark.parametrize("name", ["granite-moe", "jamba-moe", "qwen3_5-moe", "kimi_linear"])
def test_the_experts_dense_form_equals_transformers_with_standard_operators_only(exported, tmp_path, name):
    """`--experts dense` (no com.microsoft node: the prefill runs every expert on every token, the
    step gathers each row's k experts) gives transformers' logits and state over a prefill and
    20 steps, as the kernel form does (Granite's and Qwen3.5-MoE's routing renormalised, Jamba's
    not; Qwen3.5-MoE's gated shared expert beside the kernel; Kimi-Linear's grouped sigmoid
    routing, computed in standard ONNX and handed to the kernel as logits), and validates;
    each form's manifest names it, and an export without experts names none."""
    hf, kernel, folder = exported(name)
    result = CliRunner().invoke(cli, ["export", "hybrid", "--checkpoint", str(folder.parent / "hf"),
                                      "--out", str(tmp_path / "dense"), "--experts", "dense"])
    assert result.exit_code == 0, result.output
    dense = rt.load(tmp_path / "dense", provider="cpu", threads=1)
    config = hybrid_config_from_json(json.loads((folder.parent / "hf" / "config.json").read_text()))
    n_layers = len(config.layer_types if config.expert_layers is None else config.expert_layers)
    for graph in ("prefill", "step"):
        assert _ops(folder / f"{graph}.onnx")[("com.microsoft", "MoE")] == n_layers
        assert not [op for op in _ops(tmp_path / "dense" / f"{graph}.onnx") if op[0]]  # standard ONNX only
    # the dense step gathers each row's k experts (gate/up and down stacks), the dense prefill runs all
    assert _expert_gathers(tmp_path / "dense" / "step.onnx") == 2 * n_layers
    assert _expert_gathers(tmp_path / "dense" / "prefill.onnx") == 0
    assert kernel.manifest["export_options"]["experts"] == "kernel"
    assert dense.manifest["export_options"]["experts"] == "dense"
    assert "experts" not in exported("granite-rope")[1].manifest["export_options"]
    assert_decode_equals_transformers(hf, dense, 40, 20, seed=5)
    for f in (folder, tmp_path / "dense"):
        result = CliRunner().invoke(cli, ["validate", str(f), "--steps", "8"])
        assert result.exit_code == 0 and "result: PASS" in result.output, result.output


@pytest.mark.parametrize("config, message", [
    ({"model_type": "granitemoehybrid", "hidden_size": 64, "num_local_experts": 4, "num_experts_per_tok": 5},
     "experts_per_token=5 must be <= n_experts=4"),
    ({"model_type": "nemotron_h", "hidden_size": 64, "layers_block_type": ["mamba", "moe"], "moe_latent_size": 16},
     "moe_latent_size=16"),
])
def test_unsupported_or_bad_experts_are_refused_naming_the_key(tmp_path, config, message):
    from safetensors.torch import save_file

    folder = tmp_path / "ckpt"
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps(config))
    save_file({"x": torch.zeros(1)}, folder / "model.safetensors")
    result = CliRunner().invoke(cli, ["export", "hybrid", "--checkpoint", str(folder), "--out", str(tmp_path / "o")])
    assert result.exit_code == 2 and message in result.output and "Traceback" not in result.output
    assert not (tmp_path / "o").exists()


def test_bench_times_steps_whose_cache_grows_with_the_context(exported):
    from seqexport.bench.run import run_bench

    _, _, out = exported("nemotron_h")
    result = run_bench(out, provider="cpu", fast=True, contexts=(3, 40))
    assert result["family"] == "hybrid" and [p["length"] for p in result["prefills"]] == [3, 40]
    assert all(row["ort_ms"] > 0 and row["eager_ms"] > 0 for row in result["steps"])
    assert result["state_bytes"]["40"] > result["state_bytes"]["3"]  # the attention layers' K/V


@pytest.mark.parametrize("heads", [0, -2, "8", None])
def test_a_head_count_that_is_no_count_is_refused_naming_it(tmp_path, heads):
    """num_attention_heads 0 raised a bare ZeroDivisionError while the config was read."""
    from tests.test_hybrid_model import _hf

    _hf("bamba", seed=1).save_pretrained(tmp_path / "hf")
    config = json.loads((tmp_path / "hf" / "config.json").read_text())
    config["num_attention_heads"] = heads
    (tmp_path / "hf" / "config.json").write_text(json.dumps(config))
    result = CliRunner().invoke(cli, ["export", "hybrid", "--checkpoint", str(tmp_path / "hf"),
                                      "--out", str(tmp_path / "o")])
    assert result.exit_code == 2 and f"num_attention_heads must be an integer >= 1, got {heads!r}" in result.output, \
        result.output
    assert "Traceback" not in result.output and not (tmp_path / "o").exists()


def test_a_model_without_full_attention_is_refused_naming_its_layers(tmp_path):
    """A hybrid of Mamba-2 and MLP layers only: its graphs would have no cache to count positions
    by, so the export stops naming layer_types (it raised a bare ValueError from the graph spec)."""
    from seqexport.models.hybrid import HybridConfig, HybridLM

    from seqexport.checkpoints.io import save_checkpoint

    config = HybridConfig(layer_types=["mamba2", "mlp", "mamba2"])
    save_checkpoint(HybridLM(config), config, "hybrid", tmp_path / "ckpt")
    result = CliRunner().invoke(cli, ["export", "hybrid", "--checkpoint", str(tmp_path / "ckpt"),
                                      "--out", str(tmp_path / "o")])
    assert result.exit_code == 2 and "layer_types=['mamba2', 'mlp', 'mamba2'] has no full attention layer" in \
        result.output, result.output
    assert "Traceback" not in result.output and not (tmp_path / "o").exists()


def test_quantize_turns_the_moe_kernel_into_qmoe(exported, tmp_path):
    """int8 and int4 copies of a Granite MoE export: every MoE node becomes a QMoE node over the
    same experts in 8 or 4 bits (a scale per row: 32 divides no 48-wide expert), the float
    stacks are gone, the manifest records it and `seqexport inspect` says it, and the copies
    decode through the runtime and pass validate's graph checks."""
    import onnx

    hf, _, folder = exported("granite-moe")
    n_layers = len(kinds_of(hf))
    for bits in ("8", "4"):
        result = CliRunner().invoke(cli, ["quantize", str(folder), "--bits", bits, "--out", str(tmp_path / bits)])
        assert result.exit_code == 0, result.output
        assert f"{n_layers} mixture-of-experts nodes as QMoE int{bits} (a scale per row)" in result.output
        for graph in ("prefill", "step"):
            model = onnx.load(tmp_path / bits / f"{graph}.onnx", load_external_data=False)
            qmoe = [n for n in model.graph.node if n.op_type == "QMoE"]
            assert len(qmoe) == n_layers and not [n for n in model.graph.node if n.op_type == "MoE"]
            assert {onnx.helper.get_attribute_value(a) for n in qmoe for a in n.attribute
                    if a.name == "expert_weight_bits"} == {int(bits)}
            assert not [i for i in model.graph.initializer if "_gate_up_interleaved" == i.name.split(".")[-1]]
            # each router stays a float32 MatMul, in int8 as in int4 (its choice of experts is discrete)
            routers = [n for n in model.graph.node if any(".experts.router.weight" in i for i in n.input)]
            assert len(routers) == n_layers and {n.op_type for n in routers} == {"MatMul"}, bits
        m = rt.load(tmp_path / bits, provider="cpu")
        assert m.manifest["quantization"]["experts"] == {"op": "QMoE", "bits": int(bits), "block_size": None}
        assert len(rt.generate(m, [[5, 6, 7]], rt.SearchOptions(max_new_tokens=4, eos_id=-1))[0]) == 4
        shown = CliRunner().invoke(cli, ["inspect", str(tmp_path / bits)]).output
        assert f"experts QMoE int{bits} (a scale per row); from {folder.resolve()}" in shown, shown
        assert ("quantization: int4 weight-only (block 32" if bits == "4" else "quantization: int8 (dynamic)") in shown
        report = validate(tmp_path / bits, steps=4, write_summary=False)
        assert all(c.passed for c in report.cases if c.check == "graphs"), bits


def test_quantize_reads_each_expert_stack_once(exported, tmp_path, monkeypatch):
    """The prefill and the step read the same expert stacks: the second graph quantised does not
    read them again from the weights file (at Granite-4.0-H Tiny's width 1.6 GB, and int4's
    peak went from 6.6 to 5.6 GB), and its QMoE nodes take the first graph's tensors."""
    import onnx

    from seqexport.export import quantize as q

    _, _, folder = exported("granite-moe")
    read = []
    real = q.external_data_helper.load_external_data_for_tensor

    def reading(tensor, base_dir):
        read.append(tensor.name)
        real(tensor, base_dir)

    monkeypatch.setattr(q.external_data_helper, "load_external_data_for_tensor", reading)
    result = CliRunner().invoke(cli, ["quantize", str(folder), "--bits", "4", "--out", str(tmp_path / "q")])
    assert result.exit_code == 0, result.output
    stacks = [n for n in read if n.endswith("_gate_up_interleaved") or n.endswith("experts.down_proj")]
    assert stacks and len(stacks) == len(set(stacks)), sorted(stacks)
    experts = []  # each graph's QMoE weights (its initializers among the nodes' inputs)
    for g in ("prefill", "step"):
        model = onnx.load(tmp_path / "q" / f"{g}.onnx", load_external_data=False)
        weights = {t.name for t in model.graph.initializer}
        experts.append({i for n in model.graph.node if n.op_type == "QMoE" for i in n.input if i in weights})
    assert experts[0] and experts[0] == experts[1]


@pytest.mark.parametrize("bits", ["8", "4"])
def test_quantize_stores_the_dense_form_experts_in_int8(exported, tmp_path, bits):
    """Nemotron-H's experts (the dense form: ONNX Runtime's QMoE cannot run them): with
    `--dense-experts int8` an int8 or int4 copy stores every expert stack in int8 with a scale per
    expert row, dequantised where it is read (in the step after the Gather: the k experts a token
    takes); by default, and before, they stay float32. Each stored value is within half a scale step of the float export's weight;
    the copy's logits stay near the float export's, validate passes it as a quantised copy, and
    inspect says how its experts are stored."""
    import onnx

    hf, m, folder = exported("nemotron_h-moe")
    out = tmp_path / bits
    result = CliRunner().invoke(cli, ["quantize", str(folder), "--bits", bits, "--dense-experts", "int8",
                                      "--out", str(out)])
    assert result.exit_code == 0, result.output
    moe_layers = list(hf.config.layers_block_type).count("moe")
    assert f"{2 * moe_layers} expert stacks int8" in result.output
    source = {t.name: numpy_helper.to_array(t) for t in onnx.load(folder / "prefill.onnx").graph.initializer
              if len(t.dims) == 3 and not t.name.endswith("conv1d.weight")}
    assert len(source) == 2 * moe_layers
    for graph in ("prefill", "step"):
        model = onnx.load(out / f"{graph}.onnx")
        inits = {t.name: numpy_helper.to_array(t) for t in model.graph.initializer}
        assert not set(source) & set(inits)  # no float stack left
        for name, w in source.items():
            q, scale = inits[f"{name}.int8"], inits[f"{name}.scales"]  # (E, r, c) int8, (E, r, 1)
            assert q.dtype == np.int8 and scale.shape == (*w.shape[:2], 1)
            assert np.all(np.abs(q * scale - w) <= scale / 2 + 1e-7), name
    # the step reads only its rows' experts: a Gather of each stack's int8 rows and one of its scales
    assert _expert_gathers(out / "step.onnx") == 2 * 2 * moe_layers
    # the experts alone in int8 (every other MatMul kept float) decode as the float export does
    # with each stack rounded here, row by row, to 127 steps of its largest value
    alone = tmp_path / f"{bits}-experts-only"
    result = CliRunner().invoke(cli, ["quantize", str(folder), "--bits", bits, "--exclude", "*",
                                      "--dense-experts", "int8", "--out", str(alone)])
    assert result.exit_code == 0, result.output

    def rounded(w):
        step = np.abs(w).max(-1, keepdims=True) / np.float32(127)  # (E, r, 1)
        return (np.clip(np.rint(w / step), -127, 127) * step).astype(np.float32)

    reference = folder
    for graph in ("prefill", "step"):
        for name in source:
            reference = damaged_copy(reference, tmp_path, graph, name, edit=rounded)
    ids = np.random.default_rng(0).integers(3, VOCAB, (2, 12))
    experts_only, by_hand = rt.load(alone, provider="cpu"), rt.load(reference, provider="cpu")
    got, state = experts_only.step(ids, experts_only.start(2))
    want, want_state = by_hand.step(ids, by_hand.start(2))
    np.testing.assert_allclose(got, want, atol=1e-4, rtol=0)
    got, _ = experts_only.step(ids[:, -1], state)  # and a step (its k experts gathered, then dequantised)
    want, _ = by_hand.step(ids[:, -1], want_state)
    np.testing.assert_allclose(got, want, atol=1e-4, rtol=0)
    float_logits, _ = m.step(ids, m.start(2))
    assert np.abs(float_logits - by_hand.step(ids, by_hand.start(2))[0]).max() > 1e-3  # the rounding shows
    q = rt.load(out, provider="cpu")
    assert q.manifest["quantization"]["experts"] == {"op": "dense", "bits": 8, "block_size": None}
    assert "experts dense int8 (a scale per row)" in CliRunner().invoke(cli, ["inspect", str(out)]).output
    report = validate(alone, steps=8, write_summary=False)  # (the whole copy's MatMuls move this random
    assert report.passed, report.table()                    # model's near-flat logits more than its experts)
    # by default the stacks stay float32 (int8 ones are smaller but slower: every read casts them)
    default = tmp_path / f"{bits}-default"
    result = CliRunner().invoke(cli, ["quantize", str(folder), "--bits", bits, "--out", str(default)])
    assert result.exit_code == 0 and "expert stacks" not in result.output, result.output
    kept = {t.name: t.data_type for t in onnx.load(default / "step.onnx", load_external_data=False).graph.initializer}
    assert all(kept[name] == onnx.TensorProto.FLOAT for name in source)
    assert "experts" not in rt.load(default, provider="cpu").manifest["quantization"]


def test_clipped_experts_run_dense_beside_the_kernel(exported, tmp_path):
    """Ling 3's experts clipped after the activation (layers 2 and 4), which ONNX Runtime's CPU
    MoE kernel cannot: `auto` runs the other layers' experts in the kernel and these dense (the
    step gathers their k experts; the manifest names them), and the decode equals transformers'
    (test_prefill_then_20_steps_equal_transformers[ling3-clipped]); `--experts kernel` exits 2
    naming the layers, writing nothing; `--experts dense` equals transformers too."""
    hf, m, folder = exported("ling3-clipped")
    assert m.manifest["export_options"]["experts"] == "kernel"
    assert m.manifest["export_options"]["dense_expert_layers"] == [2, 4]
    for graph in ("prefill", "step"):
        assert _ops(folder / f"{graph}.onnx")[("com.microsoft", "MoE")] == 2  # layers 1 and 3
    assert _expert_gathers(folder / "step.onnx") == 2 * 2 and _expert_gathers(folder / "prefill.onnx") == 0
    run = CliRunner().invoke
    result = run(cli, ["export", "hybrid", "--checkpoint", str(folder.parent / "hf"), "--out", str(tmp_path / "k"),
                       "--experts", "kernel"])
    assert result.exit_code == 2 and "Traceback" not in result.output, result.output
    assert "--experts kernel: layers [2, 4] clip their experts' SwiGLU after the activation" in result.output
    assert not (tmp_path / "k").exists()
    result = run(cli, ["export", "hybrid", "--checkpoint", str(folder.parent / "hf"), "--out", str(tmp_path / "d"),
                       "--experts", "dense"])
    assert result.exit_code == 0, result.output
    dense = rt.load(tmp_path / "d", provider="cpu", threads=1)
    assert "dense_expert_layers" not in dense.manifest["export_options"]
    assert not [op for op in _ops(tmp_path / "d" / "step.onnx") if op[0]]
    assert_decode_equals_transformers(hf, dense, 17, 8, seed=3)


def test_quantize_a_kernel_export_with_dense_layers_stores_both(exported, tmp_path):
    """A kernel export whose clipped layers run dense (Ling 3): int4 turns its MoE nodes into QMoE
    and, with `--dense-experts int8`, the dense layers' stacks into int8; the manifest and inspect
    say both; the copy decodes close to the float export."""
    _, m, folder = exported("ling3-clipped")
    out = tmp_path / "q"
    result = CliRunner().invoke(cli, ["quantize", str(folder), "--bits", "4", "--dense-experts", "int8",
                                      "--out", str(out)])
    assert result.exit_code == 0, result.output
    # (the clipped layers' stacks alone: not the latent attention's folded 3-D key weights)
    assert "2 mixture-of-experts nodes as QMoE int4" in result.output and "4 expert stacks int8" in result.output
    stacks = [t.name for t in onnx.load(out / "step.onnx", load_external_data=False).graph.initializer
              if t.name.endswith(".int8")]
    assert sorted(stacks) == [f"model.layers.{i}.experts.{p}.int8" for i in (2, 4) for p in ("down_proj", "gate_up_proj")]
    q = rt.load(out, provider="cpu")
    experts = q.manifest["quantization"]["experts"]
    assert (experts["op"], experts["bits"], experts["dense_bits"]) == ("QMoE", 4, 8)
    assert ", the dense ones int8" in CliRunner().invoke(cli, ["inspect", str(out)]).output
    ids = np.random.default_rng(0).integers(3, VOCAB, (2, 12))
    got, want = q.step(ids, q.start(2))[0], m.step(ids, m.start(2))[0]
    assert np.corrcoef(got.ravel(), want.ravel())[0, 1] > 0.5  # (int4 flips some tokens' experts: see above)


def test_ling3_bounded_kda_layers_take_the_factored_lowering(exported):
    """Ling 3's decays are bounded (g > kda_lower_bound = -5): its KDA layers hand the bound to the
    delta rule's lowering, which takes the decays out of each chunk's key products (one Exp of
    a Neg per layer: e^{R - G}); with an unbounded decay (kda_safe_gate false) none does."""
    import onnx

    def factored(name):
        model = onnx.load(exported(name)[2] / "prefill.onnx", load_external_data=False)
        made_by = {o: n.op_type for n in model.graph.node for o in n.output}
        return sum(n.op_type == "Exp" and made_by.get(n.input[0]) == "Neg" for n in model.graph.node)

    assert factored("ling3") == kinds_of(exported("ling3")[0]).count("linear_attention") == 4
    assert factored("ling3-softplus") == 0


def test_auto_takes_the_kernel_unless_every_experts_layer_clips():
    from seqexport.models.hybrid import HybridConfig, HybridLM

    from seqexport.families.hybrid.experts import clipped_layers, resolved

    for limits, form, clipped in (([0, 1.0, 0], "kernel", [1]), ([2.0] * 3, "dense", [0, 1, 2]), (None, "kernel", [])):
        model = HybridLM(HybridConfig(n_experts=4, expert_swiglu_limits=limits))
        assert clipped_layers(model) == clipped and resolved(model, "auto") == form
    assert resolved(HybridLM(HybridConfig(n_experts=0)), "auto") == "kernel"  # (no experts, none clipped)


def test_nemotron_h_experts_export_dense_and_the_kernel_is_refused_naming_why(exported, tmp_path):
    """Nemotron-H's experts (grouped sigmoid routing, squared ReLU) have no ONNX Runtime kernel:
    `--experts auto` writes the dense form (standard ONNX only; its decode equals transformers'
    in test_prefill_then_20_steps_equal_transformers), and `--experts kernel` exits 2 saying why,
    writing nothing."""
    _, m, folder = exported("nemotron_h-moe")
    assert m.manifest["export_options"]["experts"] == "dense"
    assert not [op for op in _ops(folder / "step.onnx") if op[0]]
    result = CliRunner().invoke(cli, ["export", "hybrid", "--checkpoint", str(folder.parent / "hf"),
                                      "--out", str(tmp_path / "k"), "--experts", "kernel"])
    assert result.exit_code == 2 and "Traceback" not in result.output, result.output
    assert "--experts kernel: ONNX Runtime's CPU MoE kernel has no 'relu2' experts" in result.output
    assert "--experts dense" in result.output and not (tmp_path / "k").exists()


@pytest.mark.parametrize("name, weight", [("granite-moe", "model.layers.2.experts._gate_up_interleaved"),
                                          ("nemotron_h-moe", "model.layers.4.mixer.down_proj")],
                         ids=["kernel", "dense"])
def test_a_damaged_expert_weight_fails_naming_its_layer(exported, tmp_path, name, weight):
    _, _, out = exported(name)
    bad = damaged_copy(out, tmp_path, "step", weight, delta=0.5)
    report = validate(bad, steps=4, write_summary=False)
    failing = [c for c in report.cases if c.check == "graphs" and not c.passed]
    assert not report.passed and failing and all(c.label.startswith("step") for c in failing)
    assert failing[0].divergence.layer == f"layers.{weight.split('.')[2]}"


@pytest.mark.parametrize("name", ["granite-moe", "nemotron_h-moe"], ids=["kernel", "dense"])
def test_a_served_moe_hybrid_gives_each_concurrent_request_its_generate_tokens(exported, name, tmp_path):
    """`serve` over a model with experts, each form (Granite's MoE kernel, Nemotron-H's dense
    experts that the step gathers per row): 16 concurrent requests, prompts of 1 to 40 tokens,
    greedy and seeded sampling, rows joining and leaving a batch of 4 at different positions;
    each answer is generate()'s for its prompt alone."""
    _, m, folder = exported(name)
    rng = np.random.default_rng(3)
    todo = [{"prompt": rng.integers(3, VOCAB, int(rng.integers(1, 41))).tolist(), "max_tokens": 2 + (7 * i) % 19,
             "temperature": 0.8 if i % 3 == 1 else 0.0, "seed": 100 + i, "ignore_eos": True} for i in range(16)]
    with ServerProcess(folder, "--no-ray", "--threads", "1", "--max-rows", "4", log=tmp_path / "log") as server:
        def ask(body):
            r = requests.post(server.url + "/v1/completions", json=body, timeout=120)
            assert r.status_code == 200, r.text
            return r.json()["choices"][0]["token_ids"]

        with ThreadPoolExecutor(16) as pool:
            answers = list(pool.map(ask, todo))
    for body, answer in zip(todo, answers):
        options = rt.SearchOptions(max_new_tokens=body["max_tokens"], eos_id=-1, do_sample=body["temperature"] > 0,
                                   seed=body["seed"], temperature=body["temperature"] or 1.0)
        assert answer == rt.generate(m, [body["prompt"]], options)[0], body
