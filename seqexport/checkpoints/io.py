"""Checkpoint folders: `config.json` (naming the family) + `model.safetensors`.

Sharded weights (`model.safetensors.index.json` and its shards, as `save_pretrained` writes a
big model) are read too (`checkpoints.shards`). `pytorch_model.bin` (whole or sharded) is also
read, always with `torch.load(weights_only=True)`, so
a pickle that carries code is refused. Mamba checkpoints are also read in the
original state-spaces and the Hugging Face layouts (see `families/mamba/layouts.py`):
each family's `checkpoints` module reads its layouts. A bare weights file with no config.json
(BlinkDL's RWKV-7 `.pth`) is read by the family that recognises its tensor names.
"""

import hashlib
import json
import pickle
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
from safetensors import SafetensorError, safe_open
from safetensors.torch import load_file, save_file
from torch import nn

from seqexport import families
from seqexport.checkpoints import shards
from seqexport.errors import CheckpointError, listed
from seqexport.jsonfile import read_json_object

CONFIG_FILE = "config.json"
# in the order transformers looks for them: one file before its sharded form, safetensors first
WEIGHT_FILES = ("model.safetensors", shards.INDEX_FILES[0], "pytorch_model.bin", shards.INDEX_FILES[1])
# model.safetensors metadata: parameters kept in the weights file of the export around it
REFS_KEY = "seqexport.weights_refs"


@dataclass(frozen=True)
class Checkpoint:
    family: str
    config: Any  # TransformerConfig | MambaConfig
    model: nn.Module  # in eval mode, float32
    path: Path
    sha256: str


def family_of(config: dict) -> str:
    """Which model family a config.json describes: its "family" key, else a public layout."""
    name = config.get("family")
    if name is not None:
        return families.get(name, CheckpointError, where="config.json").name
    found = families.detect(config)
    if found is None:
        layouts = "; ".join(f"{f.name}: {f.public_layouts}" for f in families.REGISTRY.values() if f.public_layouts)
        seen = f"model_type {config['model_type']!r}" if "model_type" in config else f"keys {sorted(config)[:12]}"
        raise CheckpointError(
            f"config.json ({seen}) is no layout seqexport reads: expected a 'family' key (one of "
            f"{families.names()}) or a public layout ({layouts})"
        )
    return found.name


def config_from_dict(family: str, d: dict):
    # Keys our own config.json adds beside the model's fields.
    d = {k: v for k, v in d.items() if k not in ("family", "tokenizer", "eval")}
    try:
        return families.get(family).checkpoints.config_from_dict(d)
    except (TypeError, ValueError) as e:
        raise CheckpointError(f"invalid {family} config: {e}") from None


def build_model(family: str, config) -> nn.Module:
    return families.get(family).checkpoints.build_model(config)


def checkpoint_extra(ckpt: "Checkpoint", key: str):
    """A record config.json carries beside the model config ("tokenizer", "eval"), or None."""
    if ckpt.path is None or not Path(ckpt.path).is_dir():  # a preset, or a bare weights file
        return None
    return json.loads((Path(ckpt.path) / CONFIG_FILE).read_text()).get(key)


def checkpoint_sha256(path: str | Path) -> str:
    """One digest over config.json and the weights file (a sharded one's index and every
    shard), to notice a changed checkpoint."""
    path = Path(path)
    h = hashlib.sha256()
    files = [path] if path.is_file() else [path / CONFIG_FILE, _weights_file(path)]
    if shards.is_index(files[-1]):
        files += shards.shard_paths(files[-1])
    for name in files:
        with open(name, "rb") as f:
            for block in iter(lambda: f.read(1 << 20), b""):
                h.update(block)
    return h.hexdigest()


def save_checkpoint(model: nn.Module, config, family: str, path: str | Path, extra: dict | None = None,
                    shared=None) -> Path:
    """Write config.json + model.safetensors; tied weights are stored once.

    `extra` adds records beside the config (e.g. "tokenizer", "eval" accuracy). `shared`: the
    weights file of the export this checkpoint sits in (`export.weights.Weights`, one folder
    up). Each parameter it holds bit for bit, as is or transposed, is recorded as a reference
    into it (in the safetensors metadata, so the checkpoint's sha256 covers it) instead of a
    second copy; the others are stored as usual.
    """
    path = Path(path)
    path.mkdir(parents=True, exist_ok=True)
    tensors, refs, seen = {}, {}, set()
    for name, t in model.state_dict().items():
        if t.data_ptr() in seen:  # tied (e.g. lm_head = embedding): the loader restores it
            continue
        seen.add(t.data_ptr())
        t = t.detach().contiguous().cpu()
        found = shared.find(t.numpy()) if shared is not None else None
        if found is None:
            tensors[name] = t
        else:
            refs[name] = shared.index[found[0]] | {"tensor": found[0], "transposed": found[1], "shape": list(t.shape)}
    metadata = {"family": family}
    if refs:
        metadata[REFS_KEY] = json.dumps({"file": f"../{shared.file}", "sha256": shared.sha256, "tensors": refs})
    save_file(tensors, str(path / "model.safetensors"), metadata=metadata)
    (path / CONFIG_FILE).write_text(json.dumps({"family": family, **config.to_dict(), **(extra or {})}, indent=2) + "\n")
    return path


def load_checkpoint(path: str | Path, family: str | None = None) -> Checkpoint:
    """Read a checkpoint folder into an eval-mode float32 model.

    Raises CheckpointError for a missing or corrupt folder, a family other than
    `family` (when given), or weights that do not fit the config (listing the
    missing, unexpected and mis-shaped keys).
    """
    path = Path(path)
    if path.is_file() and path.suffix in (".safetensors", ".bin", ".json") and (path.parent / CONFIG_FILE).is_file():
        # weights, a shard or the index of a checkpoint folder: read alone, without their config.json
        raise CheckpointError(f"checkpoint {str(path)!r} is one file of the checkpoint folder {str(path.parent)!r}: "
                              "give the folder")
    if path.is_file():
        return load_weights_file(path, family)
    if not path.is_dir():
        raise CheckpointError(f"checkpoint {str(path)!r} is not a folder (expected config.json + model.safetensors)")
    raw = read_json_object(path / CONFIG_FILE, CheckpointError, f"checkpoint {str(path)!r} has no {CONFIG_FILE}")
    found = family_of(raw)
    if family is not None and found != family:
        raise CheckpointError(f"checkpoint {str(path)!r} holds a {found} model; expected a {family} model")
    config = config_from_dict(found, raw)
    state = read_weights(path)
    try:
        state = families.get(found).checkpoints.convert_state_dict(state, config)
    except ValueError as e:
        raise CheckpointError(f"weights in {path} do not fit their config.json: {e}") from None
    return _checkpoint(found, config, state, path)


def _checkpoint(family: str, config, state: dict[str, torch.Tensor], path: Path) -> Checkpoint:
    check_state_dict(_shapes_only(family, config, state, str(path)), state, where=str(path))
    model = build_model(family, config)  # now known to be the size of its weights
    model.load_state_dict(state, strict=True)
    model.float().eval()
    return Checkpoint(family, config, model, path, checkpoint_sha256(path))


def load_weights_file(path: Path, family: str | None = None) -> Checkpoint:
    """A bare weights file without config.json (e.g. BlinkDL's RWKV-7 `.pth`): the family that
    recognises its tensor names (`Family.detect_weights`) infers the config from their shapes."""
    state = read_weights_file(path)
    found = [f for f in families.REGISTRY.values() if f.detect_weights(set(state))]
    if family is not None:
        found = [f for f in found if f.name == family]
    if len(found) != 1:
        which = f"a {family} model" if family else f"a model of one of {families.names()}"
        raise CheckpointError(f"checkpoint {str(path)!r} is a bare weights file whose tensor names are not "
                              f"those of {which}; give a folder with config.json + model.safetensors")
    parts = found[0].checkpoints
    try:
        config = parts.config_from_weights(state)
        state = parts.convert_state_dict(state, config)
    except (TypeError, ValueError) as e:
        raise CheckpointError(f"cannot read {path} as a {found[0].name} checkpoint: {e}") from None
    return _checkpoint(found[0].name, config, state, path)


def read_weights(path: Path) -> dict[str, torch.Tensor]:
    weights = _weights_file(path)
    if shards.is_index(weights):
        return shards.read_sharded(weights, read_weights_file)
    return read_weights_file(weights)


def read_weights_file(weights: Path) -> dict[str, torch.Tensor]:
    """A safetensors file, or a torch pickle read with weights_only=True (never code)."""
    try:
        if weights.suffix == ".safetensors":
            return load_file(str(weights)) | _read_refs(weights)
        _check_torch_file(weights)
        with warnings.catch_warnings():  # torch's note on a pickle protocol it did not write: noise here
            warnings.filterwarnings("ignore", message="Detected pickle protocol", category=UserWarning)
            state = torch.load(weights, map_location="cpu", weights_only=True)
    except CheckpointError:  # (a ValueError: the clause below would wrap it again)
        raise
    except (SafetensorError, OSError, RuntimeError, EOFError) as e:
        raise CheckpointError(f"cannot read weights {weights}: {e}") from None
    except (KeyError, ValueError) as e:  # what torch.load raises for bytes that are no pickle at all
        raise CheckpointError(f"cannot read weights {weights}: not a torch pickle ({type(e).__name__}: {e})") from None
    except pickle.UnpicklingError as e:
        first = str(e).strip().splitlines()[0] if str(e).strip() else "unpickling failed"
        raise CheckpointError(
            f"refused {weights}: it is not a plain tensor pickle (weights_only=True load failed: {first}). "
            "A pickle that carries code is never executed; convert the checkpoint to safetensors."
        ) from None
    if isinstance(state, dict) and "state_dict" in state and isinstance(state["state_dict"], dict):
        state = state["state_dict"]
    if not isinstance(state, dict) or not all(isinstance(v, torch.Tensor) for v in state.values()):
        raise CheckpointError(f"{weights} does not hold a flat mapping of names to tensors")
    return state


def _check_torch_file(weights: Path) -> None:
    """What torch.save writes starts as a zip archive (or, before torch 1.6, a pickle): an empty
    file gave torch's bare EOFError (an empty message), and a text file "not a plain tensor
    pickle ... a pickle that carries code", as if it were one."""
    with open(weights, "rb") as f:
        head = f.read(4)
    if not head:
        raise CheckpointError(f"cannot read weights {weights}: the file is empty")
    if head != b"PK\x03\x04" and head[0] != 0x80:
        raise CheckpointError(f"cannot read weights {weights}: not a torch checkpoint (neither the zip archive "
                              f"torch.save writes nor a pickle; it starts {head!r})")


def _read_refs(weights: Path) -> dict[str, torch.Tensor]:
    """The parameters a checkpoint inside an export keeps in the export's weights file."""
    with safe_open(str(weights), "pt") as f:
        refs = (f.metadata() or {}).get(REFS_KEY)
    if refs is None:
        return {}
    try:
        refs = json.loads(refs)
        data = np.memmap(weights.parent / refs["file"], dtype=np.uint8, mode="r")
        state = {}
        for name, r in refs["tensors"].items():
            a = data[r["offset"]: r["offset"] + r["length"]].view(np.dtype(r["dtype"])).reshape(r["dims"])
            if r["transposed"]:
                a = a.T  # stored as the graphs multiply with it
            state[name] = torch.from_numpy(np.array(a).reshape(r["shape"]))
    except (OSError, KeyError, TypeError, ValueError) as e:
        raise CheckpointError(f"cannot read the weights {weights} refers to in its export: {e}") from None
    return state


class _TooManyTensors(Exception):
    pass


def _shapes_only(family: str, config, state: dict[str, torch.Tensor], where: str) -> nn.Module:
    """The model of this config built on the meta device (shapes, no memory), to check the
    weights against before anything is allocated: a config.json claiming d_model 100000 would
    otherwise ask for 160 GB. The build stops once it has registered more tensors than the
    weights could fill, so a claimed 10^6 layers is refused in milliseconds, not minutes."""
    limit = 2 * len(state) + 64  # tied weights register twice; a few buffers are not stored
    count = 0

    def counted(module, name, tensor):
        nonlocal count
        count += 1
        if count > limit:
            raise _TooManyTensors

    hooks = [torch.nn.modules.module.register_module_parameter_registration_hook(counted),
             torch.nn.modules.module.register_module_buffer_registration_hook(counted)]
    try:
        with torch.device("meta"):
            return build_model(family, config)
    except _TooManyTensors:
        raise CheckpointError(f"weights in {where} do not fit their config.json: it describes a model of more "
                              f"than {limit} tensors, the weights hold {len(state)} (check its layer counts "
                              "and sizes)") from None
    finally:
        for hook in hooks:
            hook.remove()


def check_state_dict(model: nn.Module, state: dict[str, torch.Tensor], where: str) -> None:
    """Raise one CheckpointError listing every missing, unexpected and mis-shaped key."""
    expected = model.state_dict()
    missing = sorted(set(expected) - set(state))
    unexpected = sorted(set(state) - set(expected))
    misshaped = [
        f"{k} {tuple(state[k].shape)} (expected {tuple(v.shape)})"
        for k, v in expected.items()
        if k in state and tuple(state[k].shape) != tuple(v.shape)
    ]
    problems = []
    if missing:
        problems.append(f"missing keys: {listed(missing)}")
    if unexpected:
        problems.append(f"unexpected keys: {listed(unexpected)}")
    if misshaped:
        problems.append(f"mis-shaped keys: {listed(misshaped)}")
    if problems:
        raise CheckpointError(f"weights in {where} do not fit their config.json; " + "; ".join(problems))


def _weights_file(path: Path) -> Path:
    for name in WEIGHT_FILES:
        if (path / name).is_file():
            return path / name
    raise CheckpointError(f"checkpoint {str(path)!r} has no weights file (expected one of {WEIGHT_FILES})")
