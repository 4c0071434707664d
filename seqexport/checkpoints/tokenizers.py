"""The tokenizer a checkpoint folder carries, as the record an export writes into its manifest.

Ours: config.json's "tokenizer" record (the byte tokenizer and its prompt framing). A Hugging
Face checkpoint: tokenizer.json beside the weights, copied into the artifact, with bos / eos /
pad / decoder-start ids from generation_config.json, then config.json, then
tokenizer_config.json and special_tokens_map.json (token strings looked up in the vocabulary).
Where the config lists several eos ids (Llama 3's end of text and end of turn), the first is
the record's `eos_id` and all of them its `eos_ids`: a decode stops at any, as transformers'
`generate` does. Its chat template (chat_template.jinja, else tokenizer_config.json's
"chat_template") goes into the artifact too, with the special tokens' strings it reads.
"""

import json
from pathlib import Path

from seqexport import families
from seqexport.checkpoints.io import Checkpoint, checkpoint_extra
from seqexport.errors import ArtifactError, CheckpointError
from seqexport.runtime.chat import ChatTemplate
from seqexport.runtime.tokenizer import HFTokenizer

HF_FILE = "tokenizer.json"
CHAT_FILE = "chat_template.jinja"  # where transformers (4.50 and later) saves it, and where the artifact keeps it
# the strings transformers hands a chat template (its special_tokens_map)
CHAT_TOKENS = ("bos_token", "eos_token", "unk_token", "sep_token", "pad_token", "cls_token", "mask_token")
# record key -> key in generation_config.json / config.json, and in tokenizer_config.json
IDS = {"bos_id": ("bos_token_id", "bos_token"), "eos_id": ("eos_token_id", "eos_token"),
       "pad_id": ("pad_token_id", "pad_token"), "decoder_start_id": ("decoder_start_token_id", None)}


def checkpoint_tokenizer(ckpt: Checkpoint, vocab_size: int | None = None) -> dict | None:
    """The manifest record of the checkpoint's tokenizer, or None. An "hf" record carries
    "source" (the file to copy); CheckpointError when the tokenizer does not fit the model
    (more tokens than `vocab_size`, or special ids outside it)."""
    default = families.get(ckpt.family).default_tokenizer(ckpt.config.to_dict())  # e.g. RWKV World
    if ckpt.path is None:
        return default
    own = checkpoint_extra(ckpt, "tokenizer")
    if own:
        return own
    path = Path(ckpt.path) / HF_FILE
    if not path.is_file():
        return default
    try:
        tok = HFTokenizer(path)
    except ArtifactError as e:
        raise CheckpointError(str(e)) from None
    record = {"type": "hf", "file": HF_FILE, "source": str(path), "vocab_size": tok.vocab_size,
              **special_ids(Path(ckpt.path), tok)}
    _check_fits(record, path, vocab_size or tok.vocab_size)
    chat = chat_template(Path(ckpt.path))
    if chat is not None:
        record["chat_template"] = chat
    return record


def _check_fits(record: dict, path: Path, limit: int) -> None:
    if record["vocab_size"] > limit:
        raise CheckpointError(f"{path} has {record['vocab_size']} tokens; the model's vocabulary has {limit}")
    for key in IDS:
        if record[key] is not None and not 0 <= record[key] < limit:
            raise CheckpointError(f"{key} {record[key]} of {path.parent} lies outside the vocabulary [0, {limit})")
    for eos in record.get("eos_ids", ()):
        if not 0 <= eos < limit:
            raise CheckpointError(f"eos id {eos} of {path.parent} (one of {record['eos_ids']}) lies outside "
                                  f"the vocabulary [0, {limit})")


def _json(path: Path) -> dict:
    try:
        data = json.loads(path.read_text())
    except FileNotFoundError:
        return {}
    except OSError as e:  # a folder of that name, no permission
        raise CheckpointError(f"{path}: cannot read it ({e.strerror})") from None
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise CheckpointError(f"{path} is not valid JSON: {e}") from None
    return data if isinstance(data, dict) else {}


def _config_ids(configs: list[dict], key: str) -> list[int]:
    """The ids the first config that has any gives for `key` (generation_config may list
    several eos ids); [] where none does."""
    return next((ids for c in configs if (ids := _ids(c.get(key)))), [])


def _ids(value) -> list[int]:
    """A config's id or list of ids as a list of ids, each once, in order (not ids: left out)."""
    listed = value if isinstance(value, list) else [value]
    ids = [v for v in listed if isinstance(v, int) and not isinstance(v, bool)]
    return list(dict.fromkeys(ids))


def _token_maps(folder: Path) -> list[dict]:
    """Where a checkpoint names its special tokens by their strings, in the order transformers
    reads them (older checkpoints keep them in special_tokens_map.json only)."""
    return [_json(folder / "tokenizer_config.json"), _json(folder / "special_tokens_map.json")]


def _token_strings(maps: list[dict], key: str):
    """The strings the maps give for `key` ("bos_token": "<s>" or {"content": "<s>", ...}), in order."""
    for m in maps:
        token = m.get(key)
        token = token.get("content") if isinstance(token, dict) else token
        if isinstance(token, str):
            yield token


def special_ids(folder: Path, tok: HFTokenizer) -> dict:
    configs = [_json(folder / "generation_config.json"), _json(folder / "config.json")]
    token_maps = _token_maps(folder)
    out = {}
    for key, (id_key, token_key) in IDS.items():
        found = next(iter(_config_ids(configs, id_key)), None)
        if found is None and token_key:
            found = next((tok.token_id(t) for t in _token_strings(token_maps, token_key)
                          if tok.token_id(t) is not None), None)
        out[key] = found
    listed = _config_ids(configs, "eos_token_id")  # the first is eos_id
    if len(listed) > 1:
        out["eos_ids"] = listed
    return out


def chat_template(folder: Path) -> dict | None:
    """The record of the folder's chat template ({"file", "text", "special_tokens"}; the
    export writes "text" into the artifact's file), or None. A template that does not compile is
    a CheckpointError naming its file and line."""
    maps = _token_maps(folder)
    found = _template_text(folder, maps[0])
    if found is None:
        return None
    text, where = found
    tokens = {key: token for key in CHAT_TOKENS if (token := next(_token_strings(maps, key), None)) is not None}
    try:
        ChatTemplate(text, tokens, where)
    except ArtifactError as e:
        raise CheckpointError(str(e)) from None
    return {"file": CHAT_FILE, "text": text, "special_tokens": tokens}


def _template_text(folder: Path, config: dict) -> tuple[str, str] | None:
    """(the template's text, where it was read) or None: chat_template.jinja, else
    tokenizer_config.json's "chat_template" (of several named ones, "default", as transformers
    takes it)."""
    path = folder / CHAT_FILE
    if path.is_file():
        try:
            return path.read_text(encoding="utf-8"), str(path)
        except (OSError, UnicodeDecodeError) as e:
            raise CheckpointError(f"{path}: cannot read it ({e})") from None
    text, where = config.get("chat_template"), f"{folder / 'tokenizer_config.json'}: 'chat_template'"
    if isinstance(text, list):
        named = {t.get("name"): t.get("template") for t in text if isinstance(t, dict)}
        text, where = named.get("default"), f"{where} (the one named 'default')"
        if text is None:
            raise CheckpointError(f"{where}: no template named 'default' among {sorted(map(str, named))}")
    if text is None:
        return None
    if not isinstance(text, str):
        raise CheckpointError(f"{where}: expected the template's text, got {type(text).__name__}")
    return text, where
