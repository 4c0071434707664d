"""seqexport validate on real graphs of onnxruntime's mobius: `mobius build` (in its venv,
.venv-peers/mobius, built on first use by scripts/peers.sh; through scripts/mobius_build.py, which
maps transformers 5's layer-type names back to mobius 0.1's) makes model.onnx offline from tiny
random transformers checkpoints of Mamba-2 and two hybrids, Bamba (attention with positions) and
NemotronH (attention without positions, an MLP-only layer); each is judged against transformers'
own class. The state is compared through the adapter's layouts: mobius keeps k - 1 conv positions
(transformers k) and the SSM state as [b, heads, d_state, head_dim] (transformers [b, heads,
head_dim, d_state]; head_dim 8 != d_state 16 here, so a wrong layout cannot pass)."""

import pytest
import torch
import transformers
from click.testing import CliRunner

from seqexport.cli import cli
from tests.foreign_peers import (
    ROOT,
    failing,
    figures,
    made_once,
    peer_python,
    perturbed,
    run_peer,
    validate,
)

MAMBA = dict(hidden_size=64, vocab_size=128)  # 16 heads of 8, d_state 16, conv 4, one group
CONFIGS = {
    "mamba2": lambda: transformers.Mamba2Config(
        **MAMBA, num_hidden_layers=2, num_heads=16, head_dim=8, state_size=16, expand=2, n_groups=1,
        conv_kernel=4, chunk_size=16, tie_word_embeddings=True),
    "bamba": lambda: transformers.BambaConfig(
        **MAMBA, num_hidden_layers=3, attn_layer_indices=[1], num_attention_heads=4, num_key_value_heads=2,
        intermediate_size=96, mamba_n_heads=16, mamba_d_head=8, mamba_d_state=16, mamba_n_groups=1,
        mamba_expand=2, mamba_d_conv=4, mamba_chunk_size=16, max_position_embeddings=256),
    "nemotronh": lambda: transformers.NemotronHConfig(
        **MAMBA, layers_block_type=["linear_attention", "full_attention", "linear_attention", "mlp"],
        num_attention_heads=4, num_key_value_heads=2, head_dim=16, intermediate_size=96, mamba_num_heads=16,
        mamba_head_dim=8, ssm_state_size=16, n_groups=1, expand=2, conv_kernel=4, chunk_size=16,
        max_position_embeddings=256),
}
# each layer's state parts in mobius' graph (NemotronH's layer 3 is an MLP: no state)
PARTS = {"mamba2": {0: ("conv_state", "ssm_state"), 1: ("conv_state", "ssm_state")},
         "bamba": {0: ("conv_state", "ssm_state"), 1: ("key", "value"), 2: ("conv_state", "ssm_state")}}
PARTS["nemotronh"] = PARTS["bamba"]


def checkpoint(name: str, folder) -> None:
    torch.manual_seed(0)
    model = transformers.AutoModelForCausalLM.from_config(CONFIGS[name]())
    with torch.no_grad():  # larger than the init's 0.02: logits that tell a wrong weight apart
        for p in model.parameters():
            if p.dim() == 2:
                p.normal_(0, 0.2)
    model.eval().save_pretrained(folder)


@pytest.fixture(scope="session")
def mobius(tmp_path_factory, worker_id):
    """{name: (checkpoint, mobius' build)}, made once for all workers."""
    with made_once(tmp_path_factory, worker_id, "mobius-builds") as (root, done):
        if not done:
            python = peer_python("mobius")
            for name in CONFIGS:
                checkpoint(name, root / f"{name}-checkpoint")
                run_peer([python, ROOT / "scripts" / "mobius_build.py", "build", "--model",
                          root / f"{name}-checkpoint", root / name], f"mobius build {name}")
            (root / "done").write_text("")
    return {name: (root / f"{name}-checkpoint", root / name) for name in CONFIGS}


@pytest.mark.parametrize("name", list(CONFIGS))
def test_mobius_build_passes_against_transformers(mobius, tmp_path, name):
    ckpt, folder = mobius[name]
    result, report = validate(folder, ckpt, tmp_path)
    assert result.exit_code == 0, result.output
    assert report["adapter"] == "mobius"
    assert type(transformers.AutoModelForCausalLM.from_config(CONFIGS[name]())).__name__ in report["family"]
    prefix = "past_states" if name == "mamba2" else "past_key_values"
    outs = figures(report)
    compared = {k for k in outs if k.startswith("final ")}
    assert compared == {f"final {prefix}.{i}.{part}" for i, parts in PARTS[name].items() for part in parts}
    assert "calls [3, 1, 4, 1, 2, 3" in report["checks"]["teacher_forced"]["cases"][0]["label"]
    print(f"mobius {name}", outs)


def test_mamba2_build_with_a_moved_weight_fails(mobius, tmp_path):
    """Layer 0's out_proj moved by +-1e-2: layer 0's conv and SSM state (made before it) agree,
    layer 1's do not, nor the logits from position 0."""
    ckpt, folder = mobius["mamba2"]
    bad = perturbed(folder, tmp_path / "moved", "backbone.layers.0.mixer.out_proj.weight_t")
    result, report = validate(bad, ckpt, tmp_path)
    assert result.exit_code == 1, result.output
    failed = failing(report)
    assert "logits position 0" in failed
    assert "final past_states.1.ssm_state" in failed and "final past_states.0.ssm_state" not in failed
    assert "first diverging position 0: call 0" in result.output
    assert "first layer whose state diverges: layer 1" in result.output
    print("mobius mamba2 moved", figures(report))


def test_hybrid_build_with_a_moved_weight_fails(mobius, tmp_path):
    """Bamba's layer-0 MLP moved: layer 0's Mamba-2 state agrees, layer 1's attention K/V (after
    it) are the first state to diverge."""
    ckpt, folder = mobius["bamba"]
    bad = perturbed(folder, tmp_path / "moved", "model.layers.0.feed_forward.down_proj.weight_t")
    result, report = validate(bad, ckpt, tmp_path)
    assert result.exit_code == 1, result.output
    failed = failing(report)
    assert {"logits position 0", "final past_key_values.1.key", "final past_key_values.2.ssm_state"} <= set(failed)
    assert not any(n.startswith("final past_key_values.0.") for n in failed)
    assert "first layer whose state diverges: layer 1" in result.output
    print("mobius bamba moved", figures(report))


def test_inspect_shows_the_mobius_map(mobius):
    result = CliRunner().invoke(cli, ["inspect", str(mobius["nemotronh"][1])])
    assert result.exit_code == 0, result.output
    assert "adapter mobius (decoder)" in result.output
    assert "past_key_values.0.ssm_state <- present.0.ssm_state (replaced, ssm_transposed)" in result.output
    assert "past_key_values.2.conv_state <- present.2.conv_state (replaced, conv_window)" in result.output
    assert "past_key_values.1.key <- present.1.key (appended)" in result.output


def test_openvino_refuses_mobius_fused_ops_by_name(mobius):
    pytest.importorskip("openvino")
    ckpt, folder = mobius["mamba2"]
    result = CliRunner().invoke(cli, ["validate", str(folder), "--reference", str(ckpt), "--runtime", "openvino"])
    assert result.exit_code == 2, result.output
    assert "com.microsoft.CausalConvWithState" in result.output and "--runtime onnxruntime" in result.output
