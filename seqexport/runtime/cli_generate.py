"""What `seqexport generate` does: parse prompts, generate, print as text or ids, streaming."""

import sys

import numpy as np

from seqexport.errors import UsageError
from seqexport.runtime.generate import SearchOptions, generate
from seqexport.runtime.models import load
from seqexport.runtime.tokenizer import TextStream, encode_prompt


def parse_ids(s: str) -> list[int]:
    try:
        ids = [int(x) for x in s.replace(",", " ").split()]
    except ValueError:
        raise UsageError(f"--ids {s!r}: expected integers separated by spaces") from None
    if not ids:
        raise UsageError(f"--ids {s!r}: expected at least one token id")
    return ids


def run_generate(folder, texts, ids, *, provider="auto", out=None, log=None, **search) -> list[list[int]]:
    """`log` (e.g. stderr) hears which provider runs; `out` gets the text or ids."""
    out = out or sys.stdout
    if bool(texts) == bool(ids):
        raise UsageError("give the prompt as --text or as --ids (one of them)")
    for i, t in enumerate(texts):
        if not t.strip():
            raise UsageError(f"--text #{i + 1} is empty; expected a prompt")
    options = SearchOptions(**search)  # checked before the model loads
    model = load(folder, provider=provider)
    if log:
        log(f"{model.family} from {folder} on {model.provider}")
    tok = model.tokenizer
    if texts:
        if tok is None:
            raise UsageError(f"{folder} has no tokenizer in its manifest; give the prompt as --ids")
        prompts = [encode_prompt(tok, model.prompt_frame, t, model.manifest["tokenizer"]) for t in texts]
    else:
        prompts = [parse_ids(s) for s in ids]
    # rows already end where generation stopped them (eos excluded; --eos-id may differ)
    show = (lambda seq: tok.decode(seq, stop_at_eos=False)) if tok else (lambda seq: " ".join(map(str, seq)))
    eos = options.eos_id if options.eos_id is not None else (tok.eos_id if tok else None)
    if len(prompts) == 1 and options.num_beams == 1:
        text = TextStream(tok) if tok else None

        def on_token(tokens: np.ndarray):  # stream what each new token adds
            t = int(tokens[0])
            if t < 0 or t == eos:
                return
            out.write(text.push(t) if text else f"{t} ")
            out.flush()

        result = generate(model, prompts, options, on_token=on_token)
        out.write("\n")
        return result
    result = generate(model, prompts, options)
    for seq in result:
        out.write(show(seq) + "\n")
    return result
