"""What `seqexport generate` does: parse prompts, generate, print as text or ids, streaming."""

import sys

import numpy as np

from seqexport.errors import UsageError
from seqexport.runtime.generate import SearchOptions, generate
from seqexport.runtime.models import load
from seqexport.runtime.tokenizer import encode_prompt


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
        prompts = [encode_prompt(model.manifest["tokenizer"], model.prompt_frame, t) for t in texts]
    else:
        prompts = [parse_ids(s) for s in ids]
    show = tok.decode if tok else (lambda seq: " ".join(map(str, seq)))
    if len(prompts) == 1 and options.num_beams == 1:
        seq: list[int] = []
        printed = ""

        def on_token(tokens: np.ndarray):  # stream what each new token adds
            nonlocal printed
            t = int(tokens[0])
            if t < 0 or (tok is not None and t == tok.eos_id):
                return
            seq.append(t)
            if tok is None:
                out.write(f"{t} ")
            else:
                now = tok.decode(seq)
                if now.endswith("\ufffd"):  # wait until a multi-byte character is complete
                    return
                out.write(now[len(printed):])
                printed = now
            out.flush()

        result = generate(model, prompts, options, on_token=on_token)
        out.write("\n")
        return result
    result = generate(model, prompts, options)
    for seq in result:
        out.write(show(seq) + "\n")
    return result
