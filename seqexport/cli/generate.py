"""`seqexport generate`: parse prompts, decode from an exported folder with the torch-free runtime,
print as text or ids, streaming."""

import re
import sys

import click
import numpy as np

from seqexport.cli.group import cli
from seqexport.errors import UsageError


@cli.command()
@click.argument("folder", type=click.Path(file_okay=False))
@click.option("--text", multiple=True, help="Prompt text (repeat for a batch); needs a tokenizer in the manifest.")
@click.option("--ids", multiple=True, help='Prompt token ids, e.g. "1 2 3" or "1,2,3" (repeat for a batch).')
@click.option("--chat", is_flag=True, help="Each --text is a user's message, put through the model's chat template "
              "(as POST /v1/chat/completions does).")
@click.option("--system", help="With --chat: a system message before each user message.")
@click.option("--max-new-tokens", type=click.IntRange(min=1),
              help="Stop after this many new tokens [the model's generation default, else 32].")
@click.option("--max-length", type=click.IntRange(min=1),
              help="Stop a row once its ids number this many (a language model's prompt included; an "
                   "encoder-decoder's decoder start), as transformers' max_length; --max-new-tokens wins "
                   "[the model's generation default, where it sets no max_new_tokens].")
@click.option("--min-new-tokens", type=click.IntRange(min=0),
              help="No eos before this many new tokens [the model's generation default, else 0].")
@click.option("--greedy/--sample", default=None,
              help="Greedy decoding or sampling [the model's generation default (do_sample), else greedy].")
@click.option("--temperature", type=click.FloatRange(min=0, min_open=True),
              help="Sampling temperature [the model's generation default, else 1.0].")
@click.option("--top-k", type=click.IntRange(min=0), help="Sampling: top-k (0: off) [the model's, else 0].")
@click.option("--top-p", type=click.FloatRange(0, 1, min_open=True),
              help="Sampling: nucleus probability [the model's, else 1.0].")
@click.option("--min-p", type=click.FloatRange(0, 1),
              help="Sampling: drop tokens below this x the most likely one's probability [the model's, else 0: off].")
@click.option("--seed", type=click.IntRange(min=0), help="Sampling seed (reproducible output).")
@click.option("--repetition-penalty", type=click.FloatRange(min=0, min_open=True),
              help="A token already in the prompt or the answer: its logit / this (x this where negative), as "
                   "transformers' [the model's generation default, else 1: off].")
@click.option("--presence-penalty", type=click.FloatRange(-2, 2),
              help="OpenAI's: minus this from each token already generated [0].")
@click.option("--frequency-penalty", type=click.FloatRange(-2, 2),
              help="OpenAI's: minus this times each token's count in the answer so far [0].")
@click.option("--logit-bias", multiple=True, metavar="ID=BIAS",
              help="Add BIAS to token ID's score before anything else (OpenAI's logit_bias; -100 bans it in "
                   "practice, -inf outright; repeat for several).")
@click.option("--no-repeat-ngram-size", type=click.IntRange(min=0),
              help="No n-gram of this many tokens twice in a row's ids (a language model's prompt included), as "
                   "transformers' [the model's generation default, else 0: off].")
@click.option("--beams", type=click.IntRange(min=1),
              help="Beam search width (every family; 1: greedy) [the model's generation default, else 1].")
@click.option("--early-stopping", type=click.Choice(["true", "false", "never"]),
              help="Beam search: end at --beams finished hypotheses (true), once no running beam can beat "
                   "them (false), or that at the longest length (never), as transformers "
                   "[the model's generation default, else false].")
@click.option("--eos-id", type=click.IntRange(min=-1), multiple=True,
              help="Stop a row at this token (repeat for several; -1: never) [the tokenizer's eos ids].")
@click.option("--provider", type=click.Choice(["auto", "cpu", "cuda"]), default="auto", show_default=True,
              help="ONNX Runtime execution provider.")
def generate(folder, text, ids, chat, system, max_new_tokens, max_length, min_new_tokens, greedy, temperature, top_k, top_p, min_p, seed,
             repetition_penalty, presence_penalty, frequency_penalty, logit_bias, no_repeat_ngram_size, beams,
             early_stopping, eos_id, provider):
    """Generate from an exported FOLDER with the torch-free runtime, streaming the tokens.

    Options not given take the model's generation defaults (its checkpoint's
    generation_config.json, as transformers' generate does), else greedy decoding of 32 tokens."""
    if system is not None and not chat:
        raise UsageError("--system is a chat's system message: add --chat")
    if chat and ids:
        raise UsageError("--chat takes the user's message as --text, not --ids")
    def conversation(t: str) -> list[dict]:
        first = [{"role": "system", "content": system}] if system is not None else []
        return first + [{"role": "user", "content": t}]

    run_generate(folder, text, ids, max_new_tokens=max_new_tokens, max_length=max_length, min_new_tokens=min_new_tokens,
                 do_sample=None if greedy is None else not greedy,
                 num_beams=beams, temperature=temperature, top_k=top_k, top_p=top_p, min_p=min_p, seed=seed,
                 repetition_penalty=repetition_penalty, presence_penalty=presence_penalty,
                 frequency_penalty=frequency_penalty, logit_bias=parse_logit_bias(logit_bias) or None,
                 no_repeat_ngram_size=no_repeat_ngram_size,
                 early_stopping={"true": True, "false": False}.get(early_stopping, early_stopping),
                 eos_id=eos_id or None, provider=provider, log=lambda msg: click.echo(msg, err=True),
                 conversation=conversation if chat else None)


SAMPLING_FLAGS = ("temperature", "top_k", "top_p", "min_p", "seed")


def _check_given(given: dict):
    """The options given (None: not given) checked before a model loads, as SearchOptions checks them."""
    from seqexport.runtime.generate import SearchOptions

    SearchOptions(**{k: v for k, v in given.items() if v is not None})


def _say_defaults(model, given: dict, options, log) -> None:
    """Tell which of the model's generation defaults this decode took, and what it cannot apply;
    warn of sampling flags that a greedy decode ignores."""
    from seqexport.generation_config import not_applied_note

    taken = {k: v for k, v in model.generation_defaults.items()
             if given.get(k) is None and _same(getattr(options, k, None), v)}
    if taken:
        log("using the model's generation defaults (" + model.generation["file"] + "): "
            + ", ".join(f"{k} {v}" for k, v in taken.items()) + " (options given override them)")
    if note := not_applied_note(model.generation):
        log(f"warning: {note}")
    flags = [f"--{k.replace('_', '-')}" for k in SAMPLING_FLAGS if given.get(k) is not None]
    if flags and not options.do_sample:
        log(f"warning: {', '.join(flags)} apply to sampling only; add --sample (decoding greedily)")


def _same(option, default) -> bool:
    """Whether an option holds the generation default (tuples as the file's lists)."""
    listed = lambda v: [listed(x) for x in v] if isinstance(v, list | tuple) else v  # noqa: E731
    return listed(option) == listed(default)


def parse_logit_bias(items) -> dict[int, float]:
    """--logit-bias ID=BIAS items -> {id: bias}; UsageError naming the item."""
    bias = {}
    for item in items:
        token, sep, value = item.partition("=")
        try:
            if not sep:
                raise ValueError
            token_id, number = int(token), float(value)
        except ValueError:
            raise UsageError(f"--logit-bias {item!r}: expected ID=BIAS, a token id and a number (e.g. 50256=-100)") \
                from None
        if token_id in bias:
            raise UsageError(f"--logit-bias: token id {token_id} given twice")
        bias[token_id] = number
    return bias


def parse_ids(s: str) -> list[int]:
    items = re.split(r"\s*,\s*|\s+", s.strip()) if s.strip() else []
    if "" in items:  # "1,,2" or "1, 2,": an id left out, not a separator doubled
        raise UsageError(f"--ids {s!r}: an empty item between commas; expected integers separated by spaces or commas")
    try:
        ids = [int(x) for x in items]
    except ValueError:
        raise UsageError(f"--ids {s!r}: expected integers separated by spaces or commas") from None
    if not ids:
        raise UsageError(f"--ids {s!r}: expected at least one token id")
    if min(ids) < 0:
        raise UsageError(f"--ids {s!r}: token id {min(ids)} is negative; expected ids >= 0")
    return ids


def _check_in_vocabulary(prompts: list[list[int]], vocab_size: int) -> None:
    """--ids beyond the model's vocabulary, named by the option (the graph would name its input)."""
    for i, row in enumerate(prompts):
        for x in row:
            if x >= vocab_size:
                raise UsageError(f"--ids #{i + 1}: token id {x} is outside this model's vocabulary [0, {vocab_size})")


def run_generate(folder, texts, ids, *, provider="auto", out=None, log=None, conversation=None,
                 **search) -> list[list[int]]:
    """`log` (e.g. stderr) hears which provider runs and the generation defaults taken; `out`
    gets the text or ids; `conversation` (text -> messages) puts each text through the model's
    chat template; `search`: SearchOptions' fields, None for the model's default."""
    out = out or sys.stdout
    if bool(texts) == bool(ids):
        raise UsageError("give the prompt as --text or as --ids (one of them)")
    for i, t in enumerate(texts):
        if not t.strip():
            raise UsageError(f"--text #{i + 1} is empty; expected a prompt")
    from seqexport.runtime.generate import eos_for, generate, model_options
    from seqexport.runtime.models import load

    _check_given(search)  # before the model loads
    prompts = [parse_ids(s) for s in ids]
    model = load(folder, provider=provider)
    options = model_options(model, **search)
    if log:
        log(f"{model.family} from {folder} on {model.provider}")
        _say_defaults(model, search, options, log)
    tok = model.tokenizer
    if texts:
        if tok is None:
            raise UsageError(f"{folder} has no tokenizer in its manifest; give the prompt as --ids")
        prompts = [model.encode_chat(conversation(t)) if conversation else model.encode(t) for t in texts]
    else:
        _check_in_vocabulary(prompts, model.vocab_size)
    # rows already end where generation stopped them (eos excluded; --eos-id may differ)
    show = (lambda seq: tok.decode(seq, stop_at_eos=False)) if tok else (lambda seq: " ".join(map(str, seq)))
    if len(prompts) == 1 and options.num_beams == 1:
        result = generate(model, prompts, options, on_token=_streamer(tok, eos_for(model, options), out))
        out.write("\n")
        return result
    result = generate(model, prompts, options)
    for seq in result:
        out.write(show(seq) + "\n")
    return result


def _streamer(tok, eos: tuple[int, ...], out):
    """generate()'s on_token for one row: writes what each new token adds (text, or ids)."""
    from seqexport.runtime.tokenizer import TextStream

    text = TextStream(tok) if tok else None

    def on_token(tokens: np.ndarray):  # (1,)
        t = int(tokens[0])
        if t < 0 or t in eos:
            return
        out.write(text.push(t) if text else f"{t} ")
        out.flush()

    return on_token
