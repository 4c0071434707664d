"""Train the bundled date-normalisation models on a CPU in minutes, and score them.

Two tasks over `seqexport.training.dates` pairs ("5 March 2021" -> "2021-03-05"),
both with the byte tokenizer (pad 0, bos 1, eos 2, byte b -> b + 3):

- transformer (encoder-decoder): src = input + eos, tgt = bos + output + eos.
  Teacher forcing on tgt[:, :-1] -> tgt[:, 1:]; src padding hidden by
  `padding_mask` (as src_mask and memory_mask), `generate_mask` as tgt_mask.
- mamba (decoder-only LM): bos + "<input> = <output>" + eos; the loss covers only
  the output bytes and the eos (the prompt is given at decode time).

Both: Adam, linear warm-up then cosine decay, gradient clipping, cross-entropy
that ignores pad, a fixed seed, fresh training pairs for every batch (no epoch
repeats) and a progress line every `log_every` steps.

Evaluation is eager greedy decoding, stopping on eos or after `max_new` tokens,
scored by exact match on the held-out ("test") dates, which never occur in
training. The transformer runs the full forward at every step (no cache); the
mamba model reads the prompt bos + input + " = " in one forward, then steps.

Dimension letters: b batch, s source length, t target / sequence length, v vocabulary.
"""

import math
import random
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from seqexport.checkpoints.io import save_checkpoint
from seqexport.models.mamba import MambaConfig, MambaLM
from seqexport.models.transformer import Transformer, TransformerConfig, generate_mask, padding_mask
from seqexport.runtime.tokenizer import ByteTokenizer
from seqexport.training.dates import make_split

FAMILIES = ("transformer", "mamba")
SEPARATOR = " = "  # between input and output in the mamba task
MAX_NEW = 16  # greedy decoding stops after this many new tokens (outputs are 10 bytes + eos)

Log = Callable[[str], None]


@dataclass
class TrainConfig:
    steps: int = 3000  # optimiser steps
    batch_size: int = 64  # pairs per step
    lr: float = 1e-3  # peak Adam learning rate
    warmup: int = 100  # linear warm-up steps, then cosine decay to min_lr_ratio * lr
    min_lr_ratio: float = 0.05  # final learning rate / peak
    clip: float = 1.0  # max global gradient norm
    seed: int = 0  # torch init, batch data and evaluation data
    log_every: int = 100  # a progress line every this many steps
    threads: int = 1  # torch intra-op threads: on a shared 2-core machine 2 threads ran 6x slower
    bucket: int = 16  # sort each run of this many batches by length (less padding); 1 = off


# The shapes of the bundled models (each checkpoint is a few MB).
TRANSFORMER_CONFIG = TransformerConfig(
    src_vocab_size=259, tgt_vocab_size=259, d_model=128, n_heads=4, d_ff=256,
    num_layers=2, dropout=0.0, max_len=64, pad_id=0,
)  # fmt: skip
MAMBA_CONFIG = MambaConfig(d_model=128, n_layer=4, vocab_size=259, d_state=16)
TRAIN_CONFIGS = {
    "transformer": TrainConfig(steps=3000, lr=1e-3),
    "mamba": TrainConfig(steps=1000, lr=2e-3),
}


def pad_batch(rows: Sequence[Sequence[int]], pad_id: int) -> Tensor:
    """Right-pad lists of ids to one (b, t) int64 tensor."""
    width = max(len(r) for r in rows)
    return torch.tensor([list(r) + [pad_id] * (width - len(r)) for r in rows], dtype=torch.long)


# ---------------------------------------------------------------- transformer


def transformer_batch(pairs: Sequence[tuple[str, str]], tok: ByteTokenizer) -> tuple[Tensor, Tensor]:
    """pairs -> src (b, s) = input + eos, tgt (b, t) = bos + output + eos, both right-padded."""
    src = pad_batch([tok.encode(x, add_eos=True) for x, _ in pairs], tok.pad_id)
    tgt = pad_batch([tok.encode(y, add_bos=True, add_eos=True) for _, y in pairs], tok.pad_id)
    return src, tgt


def transformer_loss(model: Transformer, batch: tuple[Tensor, Tensor], pad_id: int) -> Tensor:
    src, tgt = batch
    tgt_in, tgt_out = tgt[:, :-1], tgt[:, 1:]  # (b, t - 1) each
    src_mask = padding_mask(src, pad_id)  # (b, 1, 1, s)
    logits = model(src, tgt_in, src_mask, generate_mask(tgt_in.size(1)), src_mask)  # (b, t - 1, v)
    return F.cross_entropy(logits.flatten(0, 1), tgt_out.flatten(), ignore_index=pad_id)


@torch.no_grad()
def greedy_transformer(model: Transformer, tok: ByteTokenizer, inputs: Sequence[str], max_new: int = MAX_NEW) -> list[str]:
    """Greedy decode a batch: full forward over the whole prefix at every step, no cache.

    Rows are independent (source padding is masked, target rows are left-aligned
    and cut at their first eos), so batching does not change any row's result.
    """
    model.eval()
    src = pad_batch([tok.encode(x, add_eos=True) for x in inputs], tok.pad_id)  # (b, s)
    src_mask = padding_mask(src, tok.pad_id)  # (b, 1, 1, s)
    ys = torch.full((len(inputs), 1), tok.bos_id, dtype=torch.long)  # (b, 1)
    done = torch.zeros(len(inputs), dtype=torch.bool)
    for _ in range(max_new):
        logits = model(src, ys, src_mask, generate_mask(ys.size(1)), src_mask)  # (b, t, v)
        nxt = logits[:, -1].argmax(-1)  # (b,)
        ys = torch.cat([ys, nxt[:, None]], dim=1)
        done |= nxt == tok.eos_id
        if done.all():
            break
    return [tok.decode(row[1:].tolist()) for row in ys]


# ---------------------------------------------------------------------- mamba


def mamba_prompt(text: str, tok: ByteTokenizer) -> list[int]:
    """The ids the model is given at decode time: bos + input + " = "."""
    return tok.encode(text + SEPARATOR, add_bos=True)


def mamba_batch(pairs: Sequence[tuple[str, str]], tok: ByteTokenizer) -> tuple[Tensor, Tensor]:
    """pairs -> ids (b, t) and targets (b, t): targets are the next ids, pad over the prompt."""
    ids, targets = [], []
    for x, y in pairs:
        prompt = mamba_prompt(x, tok)
        answer = tok.encode(y, add_eos=True)
        seq = prompt + answer
        ids.append(seq[:-1])
        targets.append([tok.pad_id] * (len(prompt) - 1) + answer)
    return pad_batch(ids, tok.pad_id), pad_batch(targets, tok.pad_id)


def mamba_loss(model: MambaLM, batch: tuple[Tensor, Tensor], pad_id: int) -> Tensor:
    ids, targets = batch
    logits, _ = model(ids)  # (b, t, v)
    return F.cross_entropy(logits.flatten(0, 1), targets.flatten(), ignore_index=pad_id)


@torch.no_grad()
def greedy_mamba(model: MambaLM, tok: ByteTokenizer, inputs: Sequence[str], max_new: int = MAX_NEW) -> list[str]:
    """Greedy decode: one forward over the prompt, then one `step` per new token.

    Prompts of equal length are decoded together (no padding ever enters the
    recurrent state), so each row gets exactly its single-sequence result.
    """
    model.eval()
    out: list[str] = [""] * len(inputs)
    by_len: dict[int, list[int]] = {}
    prompts = [mamba_prompt(x, tok) for x in inputs]
    for i, p in enumerate(prompts):
        by_len.setdefault(len(p), []).append(i)
    for rows in by_len.values():
        ids = torch.tensor([prompts[i] for i in rows], dtype=torch.long)  # (b, t)
        logits, state = model(ids)  # (b, t, v)
        nxt = logits[:, -1].argmax(-1)  # (b,)
        generated = [nxt]
        done = nxt == tok.eos_id
        for _ in range(max_new - 1):
            if done.all():
                break
            logits, state = model.step(nxt, state)  # (b, v)
            nxt = logits.argmax(-1)
            generated.append(nxt)
            done |= nxt == tok.eos_id
        gen = torch.stack(generated, dim=1)  # (b, new)
        for i, row in zip(rows, gen):
            out[i] = tok.decode(row.tolist())
    return out


# ------------------------------------------------------------------- training

TASKS = {
    "transformer": (Transformer, transformer_batch, transformer_loss, greedy_transformer),
    "mamba": (MambaLM, mamba_batch, mamba_loss, greedy_mamba),
}


def lr_at(step: int, cfg: TrainConfig) -> float:
    """Linear warm-up to cfg.lr, then cosine decay to cfg.min_lr_ratio * cfg.lr."""
    if step < cfg.warmup:
        return cfg.lr * (step + 1) / cfg.warmup
    progress = (step - cfg.warmup) / max(1, cfg.steps - cfg.warmup)
    ratio = cfg.min_lr_ratio + (1 - cfg.min_lr_ratio) * 0.5 * (1 + math.cos(math.pi * min(1.0, progress)))
    return cfg.lr * ratio


def bucket_by_length(pairs: list[tuple[str, str]], cfg: TrainConfig) -> list[tuple[str, str]]:
    """Reorder pairs so each batch holds inputs of similar length (cheaper padding).

    Runs of cfg.bucket batches are sorted by input length, cut into batches, and
    the batches of a run shuffled (seeded), so long and short batches alternate.
    """
    if cfg.bucket <= 1:
        return pairs
    rng = random.Random(cfg.seed)
    run, out = cfg.bucket * cfg.batch_size, []
    for i in range(0, len(pairs), run):
        chunk = sorted(pairs[i : i + run], key=lambda p: len(p[0]))
        batches = [chunk[j : j + cfg.batch_size] for j in range(0, len(chunk), cfg.batch_size)]
        rng.shuffle(batches)
        out += [p for b in batches for p in b]
    return out


def train(family: str, model_config, cfg: TrainConfig, log: Log = print) -> nn.Module:
    """Build a `family` model of `model_config` (seeded) and train it on the dates task."""
    if family not in TASKS:
        raise ValueError(f"unknown model family {family!r}; expected one of {FAMILIES}")
    if cfg.steps < 1:
        raise ValueError(f"steps must be >= 1, got {cfg.steps}")
    model_cls, make_batch, loss_fn, _ = TASKS[family]
    torch.set_num_threads(cfg.threads)
    torch.manual_seed(cfg.seed)
    tok = ByteTokenizer()
    model = model_cls(model_config).float().train()
    opt = torch.optim.Adam(model.parameters(), lr=cfg.lr)
    # Every step sees fresh pairs: the whole stream is drawn up front (fast: stdlib only).
    pairs = bucket_by_length(make_split("train", cfg.steps * cfg.batch_size, seed=cfg.seed), cfg)
    n_params = sum(p.numel() for p in model.parameters())
    log(f"{family}: {n_params:,} parameters, {cfg.steps} steps of {cfg.batch_size} pairs")
    start, running = time.perf_counter(), 0.0
    for step in range(cfg.steps):
        for group in opt.param_groups:
            group["lr"] = lr_at(step, cfg)
        batch = make_batch(pairs[step * cfg.batch_size : (step + 1) * cfg.batch_size], tok)
        loss = loss_fn(model, batch, tok.pad_id)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        nn.utils.clip_grad_norm_(model.parameters(), cfg.clip)
        opt.step()
        running += loss.item()
        if (step + 1) % cfg.log_every == 0 or step + 1 == cfg.steps:
            seen = (step % cfg.log_every) + 1
            log(
                f"step {step + 1:5d}/{cfg.steps}  loss {running / seen:.4f}  "
                f"lr {lr_at(step, cfg):.2e}  {time.perf_counter() - start:6.1f}s"
            )
            running = 0.0
    return model.eval()


def decode(family: str, model: nn.Module, inputs: Sequence[str], batch_size: int = 256) -> list[str]:
    """Eager greedy decoding of `inputs` with a trained `family` model."""
    greedy = TASKS[family][3]
    tok = ByteTokenizer()
    out: list[str] = []
    for i in range(0, len(inputs), batch_size):
        out += greedy(model, tok, inputs[i : i + batch_size])
    return out


def evaluate(family: str, model: nn.Module, n: int, seed: int = 0) -> dict:
    """Exact match of greedy decoding on the first n held-out pairs of `seed`.

    Returns the record stored in the checkpoint: {"exact_match", "n", "split", "seed"}.
    """
    pairs = make_split("test", n, seed=seed)
    preds = decode(family, model, [x for x, _ in pairs])
    correct = sum(p == y for p, (_, y) in zip(preds, pairs, strict=True))
    return {"exact_match": correct / max(1, n), "n": n, "split": "test", "seed": seed}


def train_and_save(
    family: str,
    out: str | Path,
    steps: int | None = None,
    eval_n: int = 1000,
    seed: int = 0,
    log: Log = print,
) -> dict:
    """Train the bundled shape of `family`, score it on held-out dates, save the checkpoint.

    The checkpoint's config.json carries "tokenizer" and "eval" beside the model
    config (the only extra keys `load_checkpoint` accepts). Returns the eval record.
    """
    if family not in TASKS:
        raise ValueError(f"unknown model family {family!r}; expected one of {FAMILIES}")
    model_config = TRANSFORMER_CONFIG if family == "transformer" else MAMBA_CONFIG
    cfg = TrainConfig(**{**asdict(TRAIN_CONFIGS[family]), "seed": seed})
    if steps is not None:
        cfg.steps = steps
        cfg.warmup = min(cfg.warmup, max(1, steps // 10))
    start = time.perf_counter()
    model = train(family, model_config, cfg, log)
    train_s = time.perf_counter() - start
    record = evaluate(family, model, eval_n, seed=seed)
    log(f"held-out exact match {record['exact_match']:.4f} on {eval_n} pairs (trained in {train_s:.0f}s)")
    tokenizer = ByteTokenizer().to_dict()
    if family == "mamba":  # how the runtime frames a prompt (seqexport.runtime.tokenizer.encode_prompt)
        tokenizer["prompt"] = {"bos": True, "suffix": SEPARATOR, "eos": False}
    extra = {"tokenizer": tokenizer, "eval": record}
    path = save_checkpoint(model, model_config, family, out, extra=extra)
    log(f"saved {path}")
    return record


def main(family: str, argv=None) -> int:
    """Command line of scripts/train_<family>.py: train, score on held-out dates, save."""
    import argparse

    parser = argparse.ArgumentParser(description=f"Train the bundled {family} date normaliser on the CPU, "
                                                 "score it on held-out dates, save it.")
    parser.add_argument("--steps", type=int, default=TRAIN_CONFIGS[family].steps, help="optimiser steps")
    parser.add_argument("--out", default=f"models/pretrained/{family}-dates", help="checkpoint folder to write")
    parser.add_argument("--eval-n", type=int, default=1000, help="held-out pairs to score")
    parser.add_argument("--seed", type=int, default=0, help="seed of init, training data and eval data")
    args = parser.parse_args(argv)
    train_and_save(family, args.out, steps=args.steps, eval_n=args.eval_n, seed=args.seed)
    return 0
