"""Hand-built stateful graphs for the foreign-artifact tests: a tiny random transformers
MambaForCausalLM exported by `seqexport export mamba`, its prefill graph then rewired with
onnx.helper into another project's IO conventions (names, a k-1 conv window, a transposed SSM
state), its weights inline, no manifest: a folder only an adapter or an --io-map can read."""

import fcntl
from pathlib import Path

import numpy as np
import onnx
import torch
import transformers
from click.testing import CliRunner
from onnx import TensorProto, helper, numpy_helper

from seqexport.cli import cli

LAYERS, D_INNER, D_STATE, K = 2, 64, 8, 4


def shared_root(tmp_path_factory, worker_id, name) -> Path:
    """A folder every xdist worker of this session shares (their temporary folders' parent)."""
    root = tmp_path_factory.getbasetemp()
    root = (root.parent if worker_id != "master" else root) / name
    root.mkdir(exist_ok=True)
    return root


def mamba_checkpoint(folder: Path) -> Path:
    torch.manual_seed(0)
    config = transformers.MambaConfig(vocab_size=96, hidden_size=32, state_size=D_STATE, num_hidden_layers=LAYERS,
                                      conv_kernel=K, intermediate_size=D_INNER, time_step_rank=4)
    model = transformers.MambaForCausalLM(config).eval()
    with torch.no_grad():  # a wider spread than the init's: logits that tell a wrong weight apart
        for name, p in model.named_parameters():
            if p.dim() == 2 and "embeddings" not in name:
                p.normal_(0, 0.3)
    model.save_pretrained(folder)
    return folder


def our_prefill(root: Path) -> tuple[Path, Path]:
    """(checkpoint, our export of it), made once per session under a lock."""
    ckpt, out = root / "mamba-ckpt", root / "mamba-ours"
    with open(root / ".lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not (out / "manifest.json").is_file():
            mamba_checkpoint(ckpt)
            result = CliRunner().invoke(cli, ["export", "mamba", "--checkpoint", str(ckpt), "--out", str(out),
                                              "--overwrite"])
            assert result.exit_code == 0, result.output
    return ckpt, out


def rewire(prefill: Path, out: Path, names: dict, conv_window: int = K - 1, transpose_ssm: bool = True) -> Path:
    """Write out/model.onnx: our prefill graph with its IO renamed by `names` (keys: input_ids,
    logits, conv_in/conv_out/ssm_in/ssm_out as format strings of the layer), attention_mask and
    logits_to_keep made internal, the conv state cut to its last `conv_window` positions and the
    SSM state transposed ([b, d_state, d_inner]) when asked."""
    model = onnx.load(str(prefill))  # with its external weights: saved inline below
    g = model.graph
    nodes = [helper.make_node("Shape", ["ids"], ["ids_shape"]),
             helper.make_node("ConstantOfShape", ["ids_shape"], ["attention_mask"],
                              value=helper.make_tensor("one", TensorProto.INT64, [1], [1]))]
    g.initializer.append(numpy_helper.from_array(np.zeros(1, np.int64), "logits_to_keep"))  # 0: every position
    inputs = [helper.make_tensor_value_info(names["input_ids"], TensorProto.INT64, ["batch", "seq_len"])]
    nodes.insert(0, helper.make_node("Identity", [names["input_ids"]], ["ids"]))
    rename = {"input_ids": "ids"}
    outputs = []
    pad = numpy_helper.from_array(np.array([0, 0, K - conv_window, 0, 0, 0], np.int64), "conv_pad")
    start = numpy_helper.from_array(np.array([K - conv_window], np.int64), "conv_start")
    end = numpy_helper.from_array(np.array([K], np.int64), "conv_end")
    axis = numpy_helper.from_array(np.array([2], np.int64), "conv_axis")
    g.initializer.extend([pad, start, end, axis])
    for i in range(LAYERS):
        conv_in, ssm_in = names["conv_in"].format(i), names["ssm_in"].format(i)
        conv_out, ssm_out = names["conv_out"].format(i), names["ssm_out"].format(i)
        inputs.append(helper.make_tensor_value_info(conv_in, TensorProto.FLOAT, ["batch", D_INNER, conv_window]))
        nodes.append(helper.make_node("Pad", [conv_in, "conv_pad"], [f"past_conv_state.{i}"]))  # oldest column unread
        ssm_dims = [D_STATE, D_INNER] if transpose_ssm else [D_INNER, D_STATE]
        inputs.append(helper.make_tensor_value_info(ssm_in, TensorProto.FLOAT, ["batch", *ssm_dims]))
        nodes.append(helper.make_node("Transpose" if transpose_ssm else "Identity", [ssm_in],
                                      [f"past_ssm_state.{i}"], **({"perm": [0, 2, 1]} if transpose_ssm else {})))
        for old in (f"past_conv_state.{i}", f"past_ssm_state.{i}"):
            rename[old] = old  # produced by the nodes above now
    tail = [helper.make_node("Identity", ["logits"], [names["logits"]])] if names["logits"] != "logits" else []
    outputs.append(helper.make_tensor_value_info(names["logits"], TensorProto.FLOAT, ["batch", "seq_len", 96]))
    for i in range(LAYERS):
        conv_out, ssm_out = names["conv_out"].format(i), names["ssm_out"].format(i)
        tail.append(helper.make_node("Slice", [f"present_conv_state.{i}", "conv_start", "conv_end", "conv_axis"],
                                     [conv_out]))
        tail.append(helper.make_node("Transpose" if transpose_ssm else "Identity", [f"present_ssm_state.{i}"],
                                     [ssm_out], **({"perm": [0, 2, 1]} if transpose_ssm else {})))
        outputs.append(helper.make_tensor_value_info(conv_out, TensorProto.FLOAT, ["batch", D_INNER, conv_window]))
        ssm_dims = [D_STATE, D_INNER] if transpose_ssm else [D_INNER, D_STATE]
        outputs.append(helper.make_tensor_value_info(ssm_out, TensorProto.FLOAT, ["batch", *ssm_dims]))
    old_nodes = list(g.node)
    for n in old_nodes:  # our input_ids becomes an internal value of the same data
        n.input[:] = [rename.get(x, x) if x == "input_ids" else x for x in n.input]
    del g.node[:]
    g.node.extend(nodes + old_nodes + tail)
    del g.input[:]
    g.input.extend(inputs)
    del g.output[:]
    g.output.extend(outputs)
    out.mkdir(parents=True, exist_ok=True)
    onnx.save(model, str(out / "model.onnx"))
    onnx.checker.check_model(str(out / "model.onnx"))
    return out


TRANSFORMERS_JS = {"input_ids": "input_ids", "logits": "logits", "conv_in": "past_conv.{}", "conv_out": "present_conv.{}",
                   "ssm_in": "past_ssm.{}", "ssm_out": "present_ssm.{}"}
OPAQUE = {"input_ids": "tokens", "logits": "scores", "conv_in": "state{}_conv_in", "conv_out": "state{}_conv_out",
          "ssm_in": "state{}_ssm_in", "ssm_out": "state{}_ssm_out"}


def perturbed_copy(folder: Path, out: Path, delta: float = 1e-2) -> Path:
    """A copy of folder/model.onnx with the first 2-D weight a MatMul reads moved by +-delta."""
    model = onnx.load(str(folder / "model.onnx"))
    weights = {i.name: i for i in model.graph.initializer if len(i.dims) == 2}
    name = next(n.input[1] for n in model.graph.node if n.op_type == "MatMul" and n.input[1] in weights)
    w = numpy_helper.to_array(weights[name])
    signs = np.random.default_rng(0).choice([-1, 1], w.shape).astype(w.dtype)
    weights[name].CopyFrom(numpy_helper.from_array(w + signs * np.float32(delta), name))
    out.mkdir(parents=True, exist_ok=True)
    for f in folder.iterdir():
        if f.name != "model.onnx":
            (out / f.name).write_bytes(f.read_bytes())
    onnx.save(model, str(out / "model.onnx"))
    return out
