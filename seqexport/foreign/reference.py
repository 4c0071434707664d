"""The judge: the eager model of a checkpoint in its public layout, through transformers' own
classes (AutoModelForSeq2SeqLM / AutoModelForCausalLM / the class the config names), loaded
from the local folder only — independent of the artifact under test.

    ref = Reference.load("tiny-marian")
    ref.logits(tgt, src)          # (b, T, vocab): one full forward, no cache
    ref.cache(tgt, src)           # {(layer, part): array} after the same sequence, in transformers' layout
"""

import warnings
from pathlib import Path

import numpy as np
import torch

from seqexport.errors import CheckpointError


class Reference:
    def __init__(self, model, path: Path):
        self.model = model
        self.path = path
        self.config = model.config
        self.encoder_decoder = bool(getattr(self.config, "is_encoder_decoder", False))

    @classmethod
    def load(cls, checkpoint) -> "Reference":
        import transformers

        path = Path(checkpoint)
        if not (path / "config.json").is_file():
            raise CheckpointError(f"--reference {path}: expected a folder with config.json and the weights "
                                  "(a transformers checkpoint, as save_pretrained writes it)")
        try:
            config = transformers.AutoConfig.from_pretrained(path, local_files_only=True)
        except (OSError, ValueError, KeyError) as e:
            raise CheckpointError(f"--reference {path}: transformers cannot read its config.json: {e}") from None
        named = [getattr(transformers, a, None) for a in (config.architectures or [])]
        auto = transformers.AutoModelForSeq2SeqLM if config.is_encoder_decoder else transformers.AutoModelForCausalLM
        model_class = next((c for c in named if c is not None), None)
        transformers.utils.logging.disable_progress_bar()  # its loading bar on stderr, per load
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            try:
                model = (model_class or auto).from_pretrained(path, local_files_only=True, dtype=torch.float32)
            except (OSError, ValueError, KeyError, RuntimeError) as e:
                raise CheckpointError(f"--reference {path}: transformers cannot load it "
                                      f"({(model_class or auto).__name__}): {str(e).splitlines()[0]}") from None
        return cls(model.eval(), path)

    @property
    def vocab_size(self) -> int:
        return int(self.model.get_output_embeddings().weight.shape[0])

    @property
    def start_id(self) -> int | None:
        """The token an encoder-decoder's decoder starts from (its config's decoder_start_token_id)."""
        if not self.encoder_decoder:
            return None
        # transformers 5 keeps generation's ids in the generation config; older configs carry them
        start = self.config.to_dict().get("decoder_start_token_id")
        generation = self.model.generation_config  # None for a model that cannot generate
        if start is None and generation is not None:
            start = generation.decoder_start_token_id
        return start if start is not None else self.config.pad_token_id

    def _forward(self, tokens: np.ndarray, src: np.ndarray | None, use_cache: bool):
        ids = torch.from_numpy(np.ascontiguousarray(tokens, np.int64))
        with torch.no_grad():
            if self.encoder_decoder:
                s = torch.from_numpy(np.ascontiguousarray(src, np.int64))
                return self.model(input_ids=s, attention_mask=torch.ones_like(s), decoder_input_ids=ids,
                                  use_cache=use_cache)
            return self.model(input_ids=ids, attention_mask=torch.ones_like(ids), use_cache=use_cache)

    def logits(self, tokens: np.ndarray, src: np.ndarray | None = None) -> np.ndarray:
        """(b, T, vocab) logits of every position: one forward over the whole sequence, no cache."""
        return self._forward(tokens, src, use_cache=False).logits.float().numpy()

    def cache(self, tokens: np.ndarray, src: np.ndarray | None = None) -> dict:
        """{(layer, part): array} of the model's cache after the whole sequence in one call."""
        out = self._forward(tokens, src, use_cache=True)
        cache = getattr(out, "past_key_values", None)
        if cache is None:
            cache = getattr(out, "cache_params", None)
        found = {}
        if hasattr(cache, "self_attention_cache"):  # EncoderDecoderCache
            found |= _layers(cache.self_attention_cache, "")
            found |= _layers(cache.cross_attention_cache, "cross_")
        elif cache is not None:
            found |= _layers(cache, "")
        return found


def _layers(cache, prefix: str) -> dict:
    """transformers 5's caches: a DynamicLayer (keys/values) per attention layer, a
    LinearAttentionLayer (conv and recurrent state) per Mamba-like layer."""
    found = {}
    for i, layer in enumerate(getattr(cache, "layers", [])):
        keys = getattr(layer, "keys", None)
        if isinstance(keys, torch.Tensor) and keys.numel():
            found[(i, prefix + "key")] = keys.float().numpy()
            found[(i, prefix + "value")] = layer.values.float().numpy()
        if hasattr(cache, "get_conv_state") and getattr(layer, "conv_states", None):
            conv, ssm = cache.get_conv_state(i), cache.get_recurrent_state(i)
            if conv is not None:
                found[(i, "conv")] = conv.float().numpy()
            if ssm is not None:
                found[(i, "ssm")] = ssm.float().numpy()
    return found
