"""Generation over the step API: greedy, sampling, beam search, streaming.

The loop a user writes, in the spirit of onnxruntime-genai:

    gen = Generator(model, SearchOptions(max_new_tokens=20))
    gen.append_tokens(prompts)          # transformer: source sequences; mamba: prompts
    while not gen.is_done():
        new = gen.generate_next_token() # (b,) the token each row just produced
    gen.sequences                       # per row, the generated ids (eos excluded)

`generate(model, prompts, options)` does all of it in one call. A batch of
prompts of unequal length gives each prompt the tokens it gets alone: the
transformer masks source padding; Mamba prefills rows of equal length together
and then steps the whole batch. Each call keeps its own state, so one loaded
model serves concurrent calls from several threads.
"""

import math
from collections.abc import Callable, Iterator
from dataclasses import dataclass

import numpy as np

from seqexport.errors import ArtifactError, InputError, UsageError
from seqexport.generation_config import rule_ids, unknown_id
from seqexport.runtime.base import RuntimeModel, State
from seqexport.runtime.penalties import Seen, penalized

DEFAULT_NEW_TOKENS = 32  # a decode's new tokens where nothing sets them
CUTOFFS = ("typical_p", "epsilon_cutoff", "eta_cutoff")  # transformers' sampling cutoffs after min_p


@dataclass(frozen=True)
class SearchOptions:
    # stop a row after this many new tokens (None: 32, or max_length where that is set)
    max_new_tokens: int | None = None
    do_sample: bool = False  # False: greedy (argmax)
    temperature: float = 1.0  # sampling: logits / temperature
    top_k: int = 0  # sampling: keep the k most likely tokens (0: all)
    top_p: float = 1.0  # sampling: keep the smallest set with this much probability
    min_p: float = 0.0  # sampling: drop tokens below min_p x the most likely one's probability (0: off)
    # sampling, after min_p in transformers' order: locally typical sampling (the tokens whose
    # information is nearest the entropy, this much probability; 1: off), epsilon sampling (drop
    # tokens below this probability; 0: off), eta sampling (below min(eta, sqrt(eta) exp(-entropy)); 0: off)
    typical_p: float = 1.0
    epsilon_cutoff: float = 0.0
    eta_cutoff: float = 0.0
    min_new_tokens: int = 0  # no eos before this many new tokens (transformers' min_new_tokens, vLLM's min_tokens)
    seed: int | None = None  # sampling: seed of the random generator (reproducible)
    num_beams: int = 1  # beam search width; 1 = greedy
    length_penalty: float = 1.0  # beam score = sum log p / length ** length_penalty
    # beam search ends a prompt's search (as transformers): True at num_beams finished hypotheses;
    # False once no running beam can beat the worst of them at its current length; "never" the
    # same at the longest length (where length_penalty > 0)
    early_stopping: bool | str = False
    repetition_penalty: float = 1.0  # a seen token's score / this (x this where negative); 1: off
    presence_penalty: float = 0.0  # OpenAI's: minus this for each token generated already
    frequency_penalty: float = 0.0  # OpenAI's: minus this times each token's count so far
    # stop a row at this token, or at any of these (default: the tokenizer's eos_ids; -1 or (): never)
    eos_id: int | tuple[int, ...] | None = None
    start_id: int | None = None  # an encoder-decoder's decoder start (default: tokenizer bos, else 1)
    # OpenAI's logit_bias (transformers' sequence_bias of one-token sequences): token id -> a
    # number added to its score before anything else (the penalties, temperature, the pick);
    # -100 bans a token in practice, -inf outright. A dict, or (id, bias) pairs; kept sorted
    logit_bias: tuple[tuple[int, float], ...] = ()
    # transformers' token rules (its generate's arguments of the same names, applied in its order;
    # seqexport.runtime.penalties): token sequences -> a bias on the last where the row's ids end
    # with the rest ([ids], bias) pairs or {(ids): bias}; sequences that never come out; no
    # n-gram twice (0: off); no eos before the row's ids (a language model's prompt included, an
    # encoder-decoder's decoder start) number min_length; the first new token of a one-token start
    # forced; the last new token forced (an id or several); ids never picked; ids not picked first
    sequence_bias: tuple[tuple[tuple[int, ...], float], ...] = ()
    bad_words_ids: tuple[tuple[int, ...], ...] = ()
    no_repeat_ngram_size: int = 0
    min_length: int = 0
    forced_bos_token_id: int | None = None
    forced_eos_token_id: int | tuple[int, ...] | None = None
    suppress_tokens: tuple[int, ...] = ()
    begin_suppress_tokens: tuple[int, ...] = ()
    # transformers' max_length: stop a row once its ids number this many (a language model's
    # prompt and new tokens; an encoder-decoder's decoder start and new tokens); where
    # max_new_tokens is set too, the tighter holds (None: off)
    max_length: int | None = None

    def __post_init__(self):
        _lengths(self)
        if not isinstance(self.do_sample, bool | np.bool_):
            raise UsageError(f"do_sample must be True or False, got {self.do_sample!r}")
        _real("temperature", self.temperature, "> 0", lambda v: v > 0)
        _integer("top_k", self.top_k, 0)
        _real("top_p", self.top_p, "in (0, 1]", lambda v: 0 < v <= 1)
        _real("min_p", self.min_p, "in [0, 1]", lambda v: 0 <= v <= 1)
        _cutoffs(self)
        if self.seed is not None:
            _integer("seed", self.seed, 0)
        _integer("num_beams", self.num_beams, 1)
        _integer("min_new_tokens", self.min_new_tokens, 0)
        _real("length_penalty", self.length_penalty, "finite", lambda v: True)
        if not (isinstance(self.early_stopping, bool | np.bool_) or self.early_stopping == "never"):
            raise UsageError(f"early_stopping must be true, false or \"never\", got {self.early_stopping!r}")
        _real("repetition_penalty", self.repetition_penalty, "> 0", lambda v: v > 0)
        _real("presence_penalty", self.presence_penalty, "in [-2, 2]", lambda v: -2 <= v <= 2)
        _real("frequency_penalty", self.frequency_penalty, "in [-2, 2]", lambda v: -2 <= v <= 2)
        if self.start_id is not None:
            _integer("start_id", self.start_id, 0)
        if isinstance(self.eos_id, list | tuple):
            object.__setattr__(self, "eos_id", tuple(self.eos_id))  # frozen: hashable, as given
            for i, value in enumerate(self.eos_id):
                _integer(f"eos_id[{i}]", value, -1)
        elif self.eos_id is not None:
            _integer("eos_id", self.eos_id, -1)  # -1: an eos that never matches
        if self.num_beams > 1 and self.do_sample:
            raise UsageError("beam search and sampling cannot be combined")
        object.__setattr__(self, "logit_bias", _bias_pairs(self.logit_bias))
        _token_rules(self)

    def new_tokens(self, begin: int) -> int:
        """The most new tokens a row whose ids number `begin` before its first new one may make
        (< 1: its ids reach max_length already)."""
        if self.max_length is None:
            return self.max_new_tokens
        return min(self.max_new_tokens, self.max_length - begin)


def _cutoffs(options: SearchOptions) -> None:
    """typical_p, epsilon_cutoff and eta_cutoff checked as transformers' warpers check them."""
    _real("typical_p", options.typical_p, "in (0, 1]", lambda v: 0 < v <= 1)
    _real("epsilon_cutoff", options.epsilon_cutoff, "in [0, 1)", lambda v: 0 <= v < 1)
    _real("eta_cutoff", options.eta_cutoff, "in [0, 1)", lambda v: 0 <= v < 1)


def _lengths(options: SearchOptions) -> None:
    """max_new_tokens (None: max_length where that is set, else 32) and max_length checked."""
    if options.max_length is not None:
        _integer("max_length", options.max_length, 1)
    if options.max_new_tokens is None:  # (a row's ids number one at least: max_length stays the tighter)
        object.__setattr__(options, "max_new_tokens", DEFAULT_NEW_TOKENS if options.max_length is None
                           else options.max_length)
    _integer("max_new_tokens", options.max_new_tokens, 1)


def _integer(name: str, value, least: int, below: int = 2**63) -> None:
    """A plain integer (not a bool, not a float that happens to be whole) in [least, below)."""
    if isinstance(value, bool | np.bool_) or not isinstance(value, int | np.integer):
        raise UsageError(f"{name} must be an integer, got {value!r} ({type(value).__name__})")
    if not least <= value < below:
        raise UsageError(f"{name} must be >= {least}" + (f" and < {below}" if below != 2**63 else "")
                         + f", got {value}")


def _bias_pairs(bias) -> tuple[tuple[int, float], ...]:
    """logit_bias as sorted (id, bias) pairs: ids integers >= 0, each once; biases numbers, not
    NaN nor +inf (-inf bans the token); None as none."""
    items = list(bias.items()) if isinstance(bias, dict) else () if bias is None else bias
    if not isinstance(items, list | tuple):
        raise UsageError(f"logit_bias must be a dict of token id -> bias, got {bias!r} ({type(bias).__name__})")
    pairs = {}
    for item in items:
        if not (isinstance(item, list | tuple) and len(item) == 2):
            raise UsageError(f"logit_bias: expected (token id, bias) pairs, got {item!r}")
        token, value = item
        _integer("a logit_bias token id", token, 0)
        if not (isinstance(value, float | np.floating) and value == -math.inf):  # -inf: banned
            _real(f"logit_bias[{token}]", value, "a finite number or -inf", lambda v: True)
        if int(token) in pairs:
            raise UsageError(f"logit_bias: token id {token} given twice")
        pairs[int(token)] = float(value)
    return tuple(sorted(pairs.items()))


def _token_rules(options: "SearchOptions") -> None:
    """transformers' token rules checked, each held as tuples (what JSON gives as lists)."""
    object.__setattr__(options, "sequence_bias", _sequence_bias(options.sequence_bias))
    words = options.bad_words_ids
    if not isinstance(words, list | tuple):
        raise UsageError(f"bad_words_ids must be a list of token-id lists, got {words!r}")
    object.__setattr__(options, "bad_words_ids", tuple(_ids(f"bad_words_ids[{i}]", w, 1) for i, w in enumerate(words)))
    _integer("no_repeat_ngram_size", options.no_repeat_ngram_size, 0)
    _integer("min_length", options.min_length, 0)
    if options.forced_bos_token_id is not None:
        _integer("forced_bos_token_id", options.forced_bos_token_id, 0)
    forced = options.forced_eos_token_id
    if isinstance(forced, list | tuple):
        object.__setattr__(options, "forced_eos_token_id", _ids("forced_eos_token_id", forced, 1))
    elif forced is not None:
        _integer("forced_eos_token_id", forced, 0)
    for name in ("suppress_tokens", "begin_suppress_tokens"):
        object.__setattr__(options, name, _ids(name, getattr(options, name)))


def _ids(name: str, value, least_length: int = 0) -> tuple[int, ...]:
    """A list of token ids (integers >= 0) as a tuple; UsageError naming what is not one."""
    if not isinstance(value, list | tuple) or len(value) < least_length:
        raise UsageError(f"{name} must be a list of token ids" + (" (at least one)" if least_length else "")
                         + f", got {value!r}")
    for i, t in enumerate(value):
        _integer(f"{name}[{i}]", t, 0)
    return tuple(int(t) for t in value)


def _sequence_bias(bias) -> tuple[tuple[tuple[int, ...], float], ...]:
    """sequence_bias as (ids, bias) pairs: transformers' [[ids], bias] list or {(ids): bias};
    each sequence once; biases finite numbers or -inf."""
    items = list(bias.items()) if isinstance(bias, dict) else bias
    if not isinstance(items, list | tuple):
        raise UsageError(f"sequence_bias must be a list of [token ids, bias] pairs, got {bias!r}")
    pairs = {}
    for i, item in enumerate(items):
        if not (isinstance(item, list | tuple) and len(item) == 2):
            raise UsageError(f"sequence_bias[{i}]: expected a [token ids, bias] pair, got {item!r}")
        seq = _ids(f"sequence_bias[{i}] token ids", item[0], 1)
        if not (isinstance(item[1], float | np.floating) and item[1] == -math.inf):  # -inf: never
            _real(f"sequence_bias[{i}] bias", item[1], "a finite number or -inf", lambda v: True)
        if seq in pairs:
            raise UsageError(f"sequence_bias: the sequence {list(seq)} is given twice")
        pairs[seq] = float(item[1])
    return tuple(pairs.items())


def _real(name: str, value, rule: str, ok) -> None:
    if isinstance(value, bool | np.bool_) or not isinstance(value, int | float | np.integer | np.floating):
        raise UsageError(f"{name} must be a number, got {value!r} ({type(value).__name__})")
    try:
        finite = math.isfinite(float(value))
    except OverflowError:  # an integer too large for a float
        finite = False
    if not finite or not ok(value):
        raise UsageError(f"{name} must be {rule}, got {value}")


def model_options(model, **given) -> SearchOptions:
    """SearchOptions where each field given as None (or not given) takes the model's generation
    default (its checkpoint's generation_config.json: `model.generation_defaults`), else
    SearchOptions' own, as transformers' `generate` does with a model's generation_config.

    Sampling asked for (do_sample=True) keeps the model's beam width out, and a beam width
    asked for keeps its do_sample out: the two cannot be combined, and what was asked wins."""
    defaults = dict(model.generation_defaults)
    if given.get("max_new_tokens") is not None or "max_new_tokens" in defaults:
        defaults.pop("max_length", None)  # max_new_tokens, asked for or the model's, wins (as transformers)
    if given.get("do_sample") is not None or (given.get("num_beams") or 1) > 1:
        defaults.pop("num_beams", None)
        defaults.pop("do_sample", None)
    do_sample = given["do_sample"] if given.get("do_sample") is not None else defaults.get("do_sample", False)
    if not do_sample and defaults.get("temperature") == 0:  # greedy's temperature: 0 says greedy, not a divisor
        defaults.pop("temperature")
    fields = SearchOptions.__dataclass_fields__
    unknown = sorted(set(given) - set(fields))
    if unknown:
        raise UsageError(f"unknown search option(s) {unknown}; expected among {sorted(fields)}")
    return SearchOptions(**({k: v for k, v in defaults.items() if k in fields}
                            | {k: v for k, v in given.items() if v is not None}))


def checked_options(options, model) -> SearchOptions:
    """The options given (a dict's keys would otherwise fail as a bare AttributeError deep in
    the decode), or for None the model's generation defaults (model_options); a token id in a
    bias or rule that the model cannot pick refused by name."""
    if options is None:
        options = model_options(model)
    if not isinstance(options, SearchOptions):
        raise UsageError(f"options: expected SearchOptions (or None), got {type(options).__name__}"
                         + (": use SearchOptions(**options)" if isinstance(options, dict) else ""))
    check_token_ids(options, model.vocab_size)
    return options


def check_token_ids(options: SearchOptions, vocab_size: int) -> None:
    """UsageError naming an id of logit_bias or of a token rule that the model cannot pick
    (transformers refuses them in a sequence bias or bad word, and fails on a forced one)."""
    message = unknown_id([("logit_bias token", [t for t, _ in options.logit_bias]), *rule_ids(options)], vocab_size)
    if message:
        raise UsageError(message)


def row_budget(model, options: SearchOptions, prompt: list[int]) -> int:
    """The most new tokens a row of `prompt` may make: max_new_tokens, or fewer where max_length
    counts the row's ids (a language model's prompt; an encoder-decoder's decoder start), within
    what the model holds; InputError where the prompt leaves none (transformers refuses it too)
    or the model cannot hold them."""
    begin = 1 if model.takes_start_id else len(prompt)
    budget = options.new_tokens(begin)
    if budget < 1:
        ids = "its decoder start" if model.takes_start_id else f"the prompt's {begin} tokens"
        raise InputError(f"max_length {options.max_length} leaves no new token after {ids}: expected a "
                         "max_length above them, or max_new_tokens")
    limit = model.max_new_tokens_limit
    if limit is not None and budget > limit:
        asked = f"max_new_tokens {budget}" if budget == options.max_new_tokens else \
            f"max_length {options.max_length} ({budget} new tokens)"
        raise InputError(f"{asked} exceeds what the model can hold: its decoder has {limit} positions")
    return budget


def eos_for(model, options: SearchOptions) -> tuple[int, ...]:
    """The tokens that end a row: the options' eos_id(s), else the tokenizer's eos_ids (a
    checkpoint may list several, e.g. end of text and end of turn); () for none."""
    if options.eos_id is not None:
        eos = options.eos_id if isinstance(options.eos_id, tuple) else (options.eos_id,)
        for e in eos:  # an id the model cannot pick would never end a row: a decode to max_new_tokens
            if e >= model.vocab_size:
                raise UsageError(f"eos_id {e} is not a token id of this model: expected -1 (never) "
                                 f"or an id in [0, {model.vocab_size})")
        return eos
    return tuple(model.tokenizer.eos_ids) if model.tokenizer else ()


def check_start_id(model, start_id: int | None) -> None:
    """A decoder start token only where the model has a decoder that takes one (ignored
    silently, it would look as if it had been used), and only an id the decoder can embed."""
    if start_id is None:
        return
    if not model.takes_start_id:
        raise UsageError(f"start_id {start_id} does not apply to this {model.family or 'decoder-only'} model: "
                         "it continues the prompt (put the token first in the prompt instead)")
    if start_id >= model.vocab_size:
        raise UsageError(f"start_id {start_id} is not a token id of this model: expected an id in "
                         f"[0, {model.vocab_size})")


def pick_tokens(logits: np.ndarray, options: SearchOptions, rng: np.random.Generator) -> np.ndarray:
    """(b, v) logits -> (b,) token ids: argmax, or a sample after temperature / top-k / top-p / min-p."""
    if not options.do_sample:
        return logits.argmax(-1)
    return np.array([_sample(row, options, rng) for row in logits], np.int64)


# Sampling a row of a 50,280-token vocabulary took 0.42 ms (top_k 50: 0.84, top_p 0.9: 1.58), on
# the engine thread for every sampled row of every round: numpy's Generator.choice checks its p
# (more work than the draw), top_k sorted the whole row and top_p argsorted it. Now the draw is
# choice's own inverse CDF without the checks (the same token for the same seed), the k-th
# largest comes from a partition, and top_p sorts only the most likely tokens, as many as it
# needs: 0.31 ms (0.54, 0.67).


def _sample(z: np.ndarray, options: SearchOptions, rng: np.random.Generator) -> int:
    """One token from a row (v,) of logits, drawn from `sampled_distribution`."""
    cdf = sampled_distribution(z, options).cumsum()  # as Generator.choice(v, p=p) draws, one rng.random() a row
    cdf /= cdf[-1]
    return int(cdf.searchsorted(rng.random(), side="right"))


def sampled_distribution(z: np.ndarray, options: SearchOptions) -> np.ndarray:
    """(v,) float64 what a row (v,) of logits is sampled from, up to a factor: softmax(z / T),
    then top-k, top-p, min-p, typical, epsilon and eta sampling, in transformers' order."""
    z = z.astype(np.float64) / options.temperature
    k = options.top_k
    if k and k < z.size:
        z = np.where(z < np.partition(z, -k)[-k], -np.inf, z)  # below the k-th largest: out
    p = np.exp(z - z.max())
    p /= p.sum()
    if options.top_p < 1:
        p = _nucleus(p, options.top_p)
    if options.min_p > 0:  # after top-k and top-p, as transformers' and vLLM's samplers order them
        p = np.where(p < options.min_p * p.max(), 0.0, p)  # (the most likely stays: p.max() >= min_p x it)
    if options.typical_p < 1 or options.epsilon_cutoff > 0 or options.eta_cutoff > 0:
        p = _cut(p / p.sum(), options)
    return p


def _cut(p: np.ndarray, options: SearchOptions) -> np.ndarray:
    """p (v,), summing to 1, through transformers' TypicalLogitsWarper, EpsilonLogitsWarper and
    EtaLogitsWarper in its order (the most likely token always kept), renormalised after each."""
    if options.typical_p < 1:
        p = _typical(p, options.typical_p)
    if options.epsilon_cutoff > 0:
        p = _below(p, options.epsilon_cutoff)
    if options.eta_cutoff > 0:  # (its entropy: of what epsilon left)
        e = options.eta_cutoff
        p = _below(p, min(e, math.sqrt(e) * math.exp(-_entropy(p))))
    return p


def _typical(p: np.ndarray, mass: float) -> np.ndarray:
    """p (v,) cut to the tokens whose information (-log p) is nearest the entropy, taken in that
    order while the probability before each is below `mass` (the nearest always), renormalised.
    Only the m nearest are sorted, m growing fourfold until the cut falls inside them (a full
    sort of a 50,280-token row cost ~9 ms a token); ties at the cut are all kept, so their
    order does not matter."""
    with np.errstate(divide="ignore", invalid="ignore"):
        info = -np.log(p)  # (v,) inf where p is 0
        entropy = float(np.sum(p * info, where=p > 0))  # (one log of the row, not two: a sampled token's hot path)
        shifted = np.abs(info - entropy)
    m = 64
    while True:
        if m >= p.size:
            order = np.argsort(shifted, kind="stable")
        else:
            order = np.argpartition(shifted, m)[:m]
            order = order[np.argsort(shifted[order], kind="stable")]
        cum = np.cumsum(p[order])  # (m,)
        if m >= p.size or cum[-1] >= mass:
            break
        m *= 4
    last = min(int((cum < mass).sum()), p.size - 1)
    keep = shifted <= shifted[order[last]]
    keep[order[0]] = True
    p = np.where(keep, p, 0.0)
    return p / p.sum()


def _below(p: np.ndarray, cutoff: float) -> np.ndarray:
    """p without the tokens below `cutoff` (the most likely kept), renormalised."""
    p = np.where((p < cutoff) & (p < p.max()), 0.0, p)
    return p / p.sum()


def _entropy(p: np.ndarray) -> float:
    """-sum p log p over p's nonzero entries (torch's nansum and Categorical's entropy)."""
    nz = p[p > 0]
    return float(-(nz * np.log(nz)).sum())


def _nucleus(p: np.ndarray, top_p: float) -> np.ndarray:
    """p (v,) cut to the most likely tokens whose probability before them (in descending order)
    is below top_p (so the top one always), renormalised. Only the m most likely are sorted,
    m growing fourfold until the cut falls inside them (the m-th is past it)."""
    m = 64
    while True:
        if m >= p.size:
            top = np.argsort(-p)
        else:
            top = np.argpartition(-p, m)[:m]
            top = top[np.argsort(-p[top])]
        ranked = p[top]
        keep = np.cumsum(ranked) - ranked < top_p  # (m,) a prefix: True then False
        if m >= p.size or not keep[-1]:
            break
        m *= 4
    kept = np.zeros_like(p)
    kept[top[keep]] = p[top[keep]]
    return kept / kept.sum()


def as_rows(prompts) -> list[list[int]]:
    """A batch of prompts (2-D integer array, or sequences of integers of any lengths) as lists
    of Python ints; InputError naming the first element that is not a token id."""
    if isinstance(prompts, np.ndarray):
        if prompts.ndim != 2:
            raise InputError(f"prompts: expected a 2-D array (batch, length), got shape {prompts.shape}")
        if prompts.dtype.kind not in "iu":
            raise InputError(f"prompts: token ids must be integers, got dtype {prompts.dtype}")
    elif isinstance(prompts, str | bytes) or not hasattr(prompts, "__iter__"):
        raise InputError(f"prompts: expected a batch of token-id sequences, got {type(prompts).__name__}")
    rows = [_as_row(i, p) for i, p in enumerate(prompts)]
    if not rows:
        raise InputError("prompts: empty batch; expected at least one prompt")
    return rows


def _as_row(i: int, prompt) -> list[int]:
    """prompts[i] as a list of Python ints (InputError naming the element that is not a token id)."""
    if isinstance(prompt, str | bytes) or not hasattr(prompt, "__iter__"):
        raise InputError(f"prompts[{i}]: expected a sequence of token ids, got {prompt!r}")
    row = []
    for j, x in enumerate(prompt):
        if isinstance(x, bool | np.bool_) or not isinstance(x, int | np.integer):
            raise InputError(f"prompts[{i}][{j}]: token ids must be integers, got {x!r} ({type(x).__name__})")
        if not 0 <= x < 2**63:
            raise InputError(f"prompts[{i}][{j}]: token id {x} is negative or beyond int64")
        row.append(int(x))
    if not row:
        raise InputError(f"prompts[{i}]: empty prompt; expected at least one token")
    return row


class Generator:
    """Step-by-step generation of a batch; the state stays visible as `self.state`."""

    def __init__(self, model: RuntimeModel, options: SearchOptions | None = None):
        self.model = model
        self.options = checked_options(options, model)
        check_start_id(model, self.options.start_id)  # (beam search's Generator checks it for it)
        if self.options.num_beams > 1:
            raise UsageError("Generator does greedy or sampling; use generate(..., num_beams=N) for beam search")
        self.rng = np.random.default_rng(self.options.seed)
        self.eos = eos_for(model, self.options)
        self._eos_ids = np.array(self.eos, np.int64)  # (k,): compared with each step's picks
        self.state: State | None = None
        self.sequences: list[list[int]] = []
        self._logits = None
        self._done: np.ndarray | None = None
        self._steps = 0  # tokens picked so far (every unfinished row has this many)
        self._seen: list[Seen] | None = None  # per row, for the penalties (None: no penalty asked)
        self._budget: np.ndarray | None = None  # (b,) per row, the most new tokens it may make

    def append_tokens(self, prompts) -> None:
        """Start the batch: transformer prompts are source sequences, Mamba prompts are prefixes."""
        rows = as_rows(prompts)
        self._budget = np.array([row_budget(self.model, self.options, r) for r in rows])  # (b,) new tokens a row may make
        self._logits, self.state = self.model.begin(rows, self.options.start_id)
        if penalized(self.options):
            self._seen = [row_seen(self.model, self.options, r, self.eos) for r in rows]
        self.sequences = [[] for _ in rows]
        self._done = np.zeros(len(rows), bool)
        self._steps = 0

    def is_done(self) -> bool:
        if self._done is None:
            return False
        return bool(self._done.all())

    def _scores(self) -> np.ndarray:
        """(b, v) what the rows pick from: the last logits, after each row's penalties and rules
        (which hold eos back before min_new_tokens), else with the eos ids at -inf before it."""
        if self._seen is not None:
            return np.stack([seen.apply(row) for seen, row in zip(self._seen, self._logits)])
        if self._steps < self.options.min_new_tokens:
            return without(self._logits, self.eos)
        return self._logits

    def generate_next_token(self) -> np.ndarray:
        """Pick each row's next token from the last logits and feed it; returns (b,) tokens.

        Finished rows get -1 and keep stepping harmlessly (they are not read again).
        """
        if self._done is None:
            raise UsageError("append_tokens() first")
        if self.is_done():
            raise UsageError("generation is done")
        if not np.isfinite(self._logits).all():
            raise ArtifactError(f"the model produced NaN/Inf logits after {self._steps} new tokens; "
                                "run `seqexport validate` on this export")
        tokens = pick_tokens(self._scores(), self.options, self.rng).astype(np.int64)
        tokens[self._done] = -1
        if self._seen is not None:
            for seen, t in zip(self._seen, tokens.tolist()):
                if t >= 0:  # (a finished row's -1 is no token)
                    seen.add(t)
        # (b, k) -> (b,): a comparison, not np.isin (which costs ~10 us a decode step)
        ended = (tokens[:, None] == self._eos_ids).any(-1) & ~self._done  # finished rows' -1 is no eos
        for i in np.flatnonzero(~self._done & ~ended):
            self.sequences[i].append(int(tokens[i]))
        self._steps += 1
        self._done |= ended | (self._steps >= self._budget)
        if not self.is_done():
            feed = np.where(tokens < 0, 0, tokens)  # any valid id for finished rows
            self._logits, self.state = self.model.step(feed, self.state)
        return tokens


def stream(model, prompts, options: SearchOptions | None = None) -> Iterator[np.ndarray]:
    """Yield each step's (b,) new tokens: eos where a row ends, -1 for rows already finished."""
    gen = Generator(model, options)
    gen.append_tokens(prompts)
    while not gen.is_done():
        yield gen.generate_next_token()


def generate(model, prompts, options: SearchOptions | None = None,
             on_token: Callable[[np.ndarray], None] | None = None) -> list[list[int]]:
    """Generated ids per prompt (eos excluded). `on_token` sees each step's tokens as they come.
    No options: the model's generation defaults (its checkpoint's generation_config.json), else
    SearchOptions' (greedy, 32 new tokens)."""
    options = checked_options(options, model)
    if on_token is not None and not callable(on_token):  # (else a TypeError after the first step)
        raise UsageError(f"on_token: expected a function or None, got {type(on_token).__name__}")
    if options.num_beams > 1:
        return beam_search(model, prompts, options)
    gen = Generator(model, options)
    gen.append_tokens(prompts)
    while not gen.is_done():
        tokens = gen.generate_next_token()
        if on_token:
            on_token(tokens)
    return gen.sequences


def without(scores: np.ndarray, eos: tuple) -> np.ndarray:
    """A copy of (..., v) scores with the eos ids at -inf: before min_new_tokens no row may end
    (ids outside [0, v), e.g. -1 for none, skipped)."""
    ids = [e for e in eos if 0 <= e < scores.shape[-1]]
    out = np.array(scores, copy=True)
    out[..., ids] = -np.inf
    return out


def row_seen(model, options: SearchOptions, prompt: list[int], eos: tuple) -> Seen | None:
    """One row's `Seen` where the options ask for a bias, penalty or token rule, else None. Its
    ids are transformers' input_ids: a language model's prompt; an encoder-decoder's decoder
    start (its decoder_input_ids: the source is another sequence), which the repetition
    penalty counts too, as transformers' does."""
    if not penalized(options):
        return None
    if model.takes_start_id:
        return Seen(options, (model.start_token(options.start_id),), eos=eos)
    return Seen(options, prompt, eos=eos)


def _log_softmax(x: np.ndarray) -> np.ndarray:
    x = x.astype(np.float64)
    x = x - x.max(-1, keepdims=True)
    return x - np.log(np.exp(x).sum(-1, keepdims=True))


def _next_beams(first: int, best: np.ndarray, total: np.ndarray, v: int, k: int, eos: tuple, last: bool,
                seqs: list[list[int]], finished: list | None, lp: float) -> list[tuple[int, int, float]]:
    """One source row's k beams for the next step, as (beam row, token, score), from its 2k best
    (beam, token) candidates `best` (flat indices into `total`, (k * v,)); beams starting at row
    `first`. An ending (eos, or any token at the last step) goes to `finished` as (score /
    length ** lp, tokens) when it ranks among the top k (as HF does; None: none recorded)."""
    chosen = []
    for rank, flat in enumerate(best):
        beam, tok = divmod(int(flat), v)
        score = total[flat]
        if not np.isfinite(score):
            continue
        src = first + beam
        ends = tok in eos
        if ends or last:
            if rank < k and finished is not None:
                hyp = seqs[src] + ([] if ends else [tok])
                finished.append((score / (len(hyp) + ends) ** lp, hyp))
            continue
        chosen.append((src, tok, score))
        if len(chosen) == k:
            break
    return chosen + [(first, 0, -np.inf)] * (k - len(chosen))  # padded with dead beams


def _search_over(finished: list, chosen: list, k: int, t: int, options: SearchOptions, longest: int) -> bool:
    """Whether one prompt's search is over after its t-th token, by transformers' rule: it has k
    finished hypotheses and (early_stopping False) its best running beam, scored at length t, or
    ("never", length_penalty > 0) at the longest length it may reach, cannot beat the worst of the k best."""
    if len(finished) < k:
        return False
    if options.early_stopping is True:
        return True
    worst = sorted((score for score, _ in finished), reverse=True)[k - 1]
    running = max(score for _, _, score in chosen)  # sum log p of the best beam going on
    lp = options.length_penalty
    length = longest if options.early_stopping == "never" and lp > 0 else t
    return running / length ** lp <= worst


def beam_search(model: RuntimeModel, prompts, options: SearchOptions) -> list[list[int]]:
    """Beam search (any family whose state rows can be reordered); each prompt keeps num_beams
    hypotheses.

    Finished hypotheses are scored sum(log p) / length ** length_penalty (length: the tokens
    generated, eos included); a prompt's search ends as `early_stopping` says (transformers'
    rule), so num_beams=1 is greedy.
    """
    if not model.supports_beams:
        raise UsageError(f"beam search is not available for the {model.family} family "
                         "(its state rows cannot be reordered mid-decode); use greedy or sampling")
    k = options.num_beams
    eos = eos_for(model, options)
    rows = as_rows(prompts)
    n = len(rows)
    budget = [row_budget(model, options, r) for r in rows]  # per prompt, the most new tokens (max_length)
    gen = Generator(model, SearchOptions(max_new_tokens=max(budget), eos_id=eos, start_id=options.start_id))
    # each beam's tokens for its penalties, carried along (a copy where a beam splits) as the beams are reordered
    beam_seen = [row_seen(model, options, rows[b // k], eos) for b in range(n * k)] if penalized(options) else None
    gen.append_tokens([r for r in rows for _ in range(k)])  # each source repeated k times
    state, logits = gen.state, gen._logits
    scores = np.tile(np.r_[0.0, np.full(k - 1, -np.inf)], n)  # only beam 0 is live at first
    seqs: list[list[int]] = [[] for _ in range(n * k)]
    finished: list[list[tuple[float, list[int]]]] = [[] for _ in range(n)]
    done = np.zeros(n, bool)
    lp = options.length_penalty
    for step in range(max(budget)):
        logp = _log_softmax(logits)  # (n*k, v)
        if beam_seen is not None:  # on the log-probabilities, as transformers' beam search applies its processors
            logp = np.stack([seen.apply(row) for seen, row in zip(beam_seen, logp)])
        elif step < options.min_new_tokens:  # no hypothesis ends before min_new_tokens (else Seen's rule)
            logp = without(logp, eos)
        v = logp.shape[-1]
        total = (scores[:, None] + logp).reshape(n, k * v)
        # as many candidates as transformers keeps: enough that k go on though each eos ends some
        best = np.argsort(-total, axis=-1, kind="stable")[:, : max(2, 1 + len(eos)) * k]
        new_rows, new_tokens, new_scores = [], [], []
        for r in range(n):
            ending = None if done[r] else finished[r]  # a done row records no more endings
            last = step == budget[r] - 1  # (past it a row is done)
            chosen = _next_beams(r * k, best[r], total[r], v, k, eos, last, seqs, ending, lp)
            done[r] = done[r] or last or _search_over(finished[r], chosen, k, step + 1, options, budget[r])
            for src, tok, score in chosen:
                new_rows.append(src)
                new_tokens.append(tok)
                new_scores.append(score if not done[r] else -np.inf)
        if done.all():
            break
        seqs = [seqs[s] + [t] for s, t in zip(new_rows, new_tokens)]
        if beam_seen is not None:
            beam_seen = [beam_seen[s].copy() for s in new_rows]
            for seen, t in zip(beam_seen, new_tokens):
                seen.add(t)
        scores = np.array(new_scores)
        state = state.select(new_rows)
        logits, state = model.step(np.array(new_tokens, np.int64), state)
    return [max(finished[r], key=lambda f: f[0])[1] if finished[r] else seqs[r * k] for r in range(n)]
