"""vLLM's `bad_words` request field: words that never come out, as the token-id sequences
transformers' `bad_words_ids` rule bans (seqexport.runtime.penalties), tokenized as vLLM
tokenizes them.

    bad_words_ids(model.tokenizer, ["Paris", "New York"])  # [[ids], …]; ValueError naming a word that has none
"""

from seqexport.runtime.tokenizer import HFTokenizer


def bad_words_ids(tokenizer, words: list[str]) -> list[list[int]]:
    """Each word's ids as it begins a text and, where a space before it makes another first
    token of as many ids (a word inside a text, for tokenizers that fold the space into the
    word's token), those too: vLLM's SamplingParams.update_from_tokenizer. Each sequence once."""
    out: list[list[int]] = []
    for i, word in enumerate(words):
        alone = _ids(tokenizer, word.lstrip())
        if not alone:
            raise ValueError(f"bad_words[{i}] {word!r} is no token of this model's tokenizer")
        spaced = _ids(tokenizer, " " + word.lstrip())
        variants = [alone] + ([spaced] if spaced and spaced[0] != alone[0] and len(spaced) == len(alone) else [])
        out += [v for v in variants if v not in out]
    return out


def _ids(tokenizer, text: str) -> list[int]:
    """`text`'s ids with no special token around them (vLLM's add_special_tokens=False)."""
    if isinstance(tokenizer, HFTokenizer):
        return tokenizer.encode(text, special=False)
    return tokenizer.encode(text)
