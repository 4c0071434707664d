"""A checkpoint's generation defaults (transformers' generation_config.json) as the manifest's
`generation` record, and the rules both sides check it by. Torch-free: the runtime reads it.

    record = generation_record(data, "ckpt/generation_config.json")  # None when it sets nothing we keep
    {"file": "generation_config.json", "defaults": {"do_sample": true, "temperature": 0.6, "top_p": 0.9},
     "not_applied": {"typical_p": 0.9}}

transformers' `model.generate()` decodes with these values when a call gives none, and vLLM
takes temperature, top_p, top_k, repetition_penalty and max_new_tokens as the defaults of its requests: a model
served without them answers differently from the one its authors tuned. Only the keys the file
sets are kept (as vLLM does): a key it leaves out keeps seqexport's default (top_k off, where
transformers' generate would add its own top_k 50). Keys that change the tokens and that
seqexport does not implement are kept as `not_applied`, and every command that decodes says so.
"""

import math

from seqexport.errors import shown


def _bool(v) -> bool:
    return isinstance(v, bool)


def _int(least: int):
    return lambda v: isinstance(v, int) and not isinstance(v, bool) and v >= least


def _ids(least: int):
    """A list of at least `least` token ids."""
    return lambda v: isinstance(v, list) and len(v) >= least and all(map(_int(0), v))


def _list(v, ok) -> bool:
    return isinstance(v, list) and all(map(ok, v))


def _biased(pair) -> bool:
    """A sequence_bias pair [[ids], bias] (bias a number, or -inf, which JSON cannot hold)."""
    return (isinstance(pair, list) and len(pair) == 2 and _ids(1)(pair[0]) and isinstance(pair[1], int | float)
            and not isinstance(pair[1], bool) and not math.isnan(pair[1]) and pair[1] != math.inf)


def _real(ok):
    return lambda v: (isinstance(v, int | float) and not isinstance(v, bool) and math.isfinite(v) and ok(v))


# key -> (its check, what is expected): what seqexport applies (SearchOptions' fields)
APPLIED = {
    "do_sample": (_bool, "true or false"),
    "temperature": (_real(lambda v: v >= 0), "a number >= 0"),
    "top_k": (_int(0), "an integer >= 0 (0: off)"),
    "top_p": (_real(lambda v: 0 < v <= 1), "a number in (0, 1]"),
    "min_p": (_real(lambda v: 0 <= v <= 1), "a number in [0, 1]"),
    "typical_p": (_real(lambda v: 0 < v <= 1), "a number in (0, 1]"),
    "epsilon_cutoff": (_real(lambda v: 0 <= v < 1), "a number in [0, 1)"),
    "eta_cutoff": (_real(lambda v: 0 <= v < 1), "a number in [0, 1)"),
    "max_new_tokens": (_int(1), "an integer >= 1"),
    "max_length": (_int(1), "an integer >= 1"),  # a row's ids in all (max_new_tokens, where set, wins)
    "min_new_tokens": (_int(0), "an integer >= 0"),
    "num_beams": (_int(1), "an integer >= 1"),
    "length_penalty": (_real(lambda v: True), "a finite number"),
    "repetition_penalty": (_real(lambda v: v > 0), "a number > 0"),
    "early_stopping": (lambda v: isinstance(v, bool) or v == "never", 'true, false or "never"'),
    # transformers' token rules (seqexport.runtime.penalties)
    "no_repeat_ngram_size": (_int(0), "an integer >= 0 (0: off)"),
    "min_length": (_int(0), "an integer >= 0"),
    "bad_words_ids": (lambda v: _list(v, _ids(1)), "a list of token-id lists"),
    "sequence_bias": (lambda v: _list(v, _biased), "a list of [token ids, bias] pairs"),
    "suppress_tokens": (_ids(0), "a list of token ids"),
    "begin_suppress_tokens": (_ids(0), "a list of token ids"),
    "forced_bos_token_id": (_int(0), "a token id"),
    "forced_eos_token_id": (lambda v: _int(0)(v) or _ids(1)(v), "a token id or a list of them"),
}
# the keys an older seqexport kept as not applied and this one applies (current_record)
NOW_APPLIED = ("no_repeat_ngram_size", "min_length", "bad_words_ids", "sequence_bias", "suppress_tokens",
               "begin_suppress_tokens", "forced_bos_token_id", "forced_eos_token_id", "typical_p", "epsilon_cutoff",
               "eta_cutoff")
# the values of those at which they change nothing (a file may write them out)
NEUTRAL = {"no_repeat_ngram_size": 0, "min_length": 0, "bad_words_ids": [], "sequence_bias": [],
           "suppress_tokens": [], "begin_suppress_tokens": [], "typical_p": 1.0, "epsilon_cutoff": 0.0,
           "eta_cutoff": 0.0}
# keys that change which tokens come out, with the values at which they change nothing: any
# other value is not applied here, and said so
NOT_APPLIED = {
    "encoder_repetition_penalty": (1, 1.0), "encoder_no_repeat_ngram_size": (0,), "diversity_penalty": (0, 0.0),
    "num_beam_groups": (1,), "penalty_alpha": (None,), "exponential_decay_length_penalty": (None,),
    "guidance_scale": (None, 1, 1.0), "top_h": (None,), "dola_layers": (None,),
}


def _neutral(key: str, value) -> bool:
    return any(value is n if n is None or isinstance(value, bool) else value == n for n in NOT_APPLIED[key])


def generation_record(data: dict, where: str, file: str = "generation_config.json") -> dict | None:
    """The manifest record of a generation config's keys (`where` names it in messages);
    ValueError naming the key, its value and the expected form for a value transformers would
    not take either. None when the file sets nothing that changes a decode."""
    defaults = {}
    for key, (ok, expected) in APPLIED.items():
        if data.get(key) is None or (key in NEUTRAL and data[key] == NEUTRAL[key]):
            continue
        if not ok(data[key]):
            raise ValueError(f"{where}: {key} is {shown(data[key])}; expected {expected}")
        defaults[key] = data[key]
    if defaults.get("do_sample") and defaults.get("temperature") == 0:
        raise ValueError(f"{where}: temperature 0 with do_sample true; expected a temperature > 0 "
                         "(transformers refuses it too), or do_sample false for greedy decoding")
    not_applied = {key: data[key] for key in NOT_APPLIED if key in data and not _neutral(key, data[key])}
    if defaults.get("do_sample") and defaults.get("num_beams", 1) > 1:  # transformers' beam sampling
        not_applied["num_beams"] = defaults.pop("num_beams")
    if not defaults and not not_applied:
        return None
    return {"file": file, "defaults": defaults, "not_applied": not_applied}


def rule_ids(rules) -> list[tuple[str, list[int]]]:
    """The token ids a decode's token rules name, each list with its name ("bad_words_ids
    token"): `rules` a generation record's defaults (a dict) or SearchOptions (the same names)."""
    get = rules.get if isinstance(rules, dict) else lambda key: getattr(rules, key)
    forced_bos, forced_eos = get("forced_bos_token_id"), get("forced_eos_token_id")
    return [("sequence_bias token", [t for seq, _ in get("sequence_bias") or () for t in seq]),
            ("bad_words_ids token", [t for w in get("bad_words_ids") or () for t in w]),
            ("forced_bos_token_id", [] if forced_bos is None else [forced_bos]),
            ("forced_eos_token_id", [] if forced_eos is None else
             list(forced_eos) if isinstance(forced_eos, list | tuple) else [forced_eos]),
            ("suppress_tokens token", list(get("suppress_tokens") or ())),
            ("begin_suppress_tokens token", list(get("begin_suppress_tokens") or ()))]


def unknown_id(named: list[tuple[str, list[int]]], vocab_size: int) -> str | None:
    """The first named id the model cannot pick, as "<name> <id> is not a token id of this
    model: expected …", or None."""
    for name, ids in named:
        for token in ids:
            if token >= vocab_size:
                return f"{name} {token} is not a token id of this model: expected an id in [0, {vocab_size})"
    return None


def current_record(record: dict) -> dict:
    """A checked record as this seqexport writes it: a key an older one kept as not applied
    (NOW_APPLIED: the token rules, typical, epsilon and eta sampling) moved to the defaults (where its value is one transformers takes). (Not num_beams:
    beside do_sample it is beam sampling, which stays not applied.)"""
    moved = {k: v for k, v in record["not_applied"].items()
             if k in NOW_APPLIED and k not in record["defaults"] and APPLIED[k][0](v)}
    if not moved:
        return record
    return record | {"defaults": record["defaults"] | moved,
                     "not_applied": {k: v for k, v in record["not_applied"].items() if k not in moved}}


def check_record(record) -> str | None:
    """What is wrong with a manifest's `generation` record (a message), or None."""
    if not isinstance(record, dict) or not isinstance(record.get("file"), str):
        return "an object with 'file', 'defaults' and 'not_applied'"
    defaults, not_applied = record.get("defaults"), record.get("not_applied")
    if not isinstance(defaults, dict) or not isinstance(not_applied, dict):
        return "'defaults' and 'not_applied' objects"
    for key, value in defaults.items():
        if key not in APPLIED:
            return f"defaults among {sorted(APPLIED)}, not {key!r}"
        ok, expected = APPLIED[key]
        if not ok(value):
            return f"defaults.{key} {expected}, not {shown(value)}"
    return None


def not_applied_keys(record: dict | None) -> str | None:
    """The keys seqexport does not apply, with their values ("typical_p 0.9"), or None."""
    skipped = (record or {}).get("not_applied") or {}
    return ", ".join(f"{k} {shown(v, 40)}" for k, v in skipped.items()) or None


def not_applied_note(record: dict | None) -> str | None:
    """One line saying which of the checkpoint's generation keys seqexport does not apply, or None."""
    keys = not_applied_keys(record)
    if keys is None:
        return None
    return (f"the model's {record['file']} sets {keys}, which seqexport does not apply: its tokens can differ "
            "from transformers' generate")


def generation_lines(record: dict | None) -> list[str]:
    """The record as `seqexport inspect` shows it: [] for none."""
    if not record:
        return []
    defaults = ", ".join(f"{k} {shown(v)}" for k, v in record["defaults"].items()) or "none applied"
    lines = [f"generation defaults ({record['file']}): {defaults}"]
    if skipped := not_applied_keys(record):
        lines.append(f"  not applied (tokens can differ from transformers' generate): {skipped}")
    return lines
