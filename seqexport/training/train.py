"""Train the bundled date-normalisation models on a CPU in minutes, and score them.

The task is `seqexport.training.dates` ("5 March 2021" -> "2021-03-05") with the byte
tokenizer (pad 0, bos 1, eos 2, byte b -> b + 3); each family frames it in its
`training` module (`seqexport/families/<name>/training.py`: the bundled shape, how a
batch and its loss are made, how a prompt is framed).

Adam, linear warm-up then cosine decay, gradient clipping, cross-entropy that ignores
pad, a fixed seed, fresh training pairs for every batch (no epoch repeats) and a
progress line every `log_every` steps.

Evaluation is greedy decoding with the family's eager model (its cached step, through
`seqexport.runtime.generate`: the one eager decoder), stopping on eos or after `max_new`
tokens, scored by exact match on the held-out ("test") dates, which never occur in training.
"""

import math
import random
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

import torch
from torch import nn

from seqexport import families
from seqexport.checkpoints.io import save_checkpoint
from seqexport.errors import UsageError
from seqexport.runtime.generate import SearchOptions, generate
from seqexport.runtime.tokenizer import ByteTokenizer, encode_prompt
from seqexport.training.dates import make_split

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


def task(family: str):
    """The family's framing of the date task (its `training` module)."""
    return families.get(family, UsageError).training


def tokenizer_record(family: str) -> dict:
    """The tokenizer record a checkpoint of `family` carries: byte tokenizer + prompt framing."""
    record = ByteTokenizer().to_dict()
    if task(family).PROMPT:
        record["prompt"] = task(family).PROMPT
    return record


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
    framing = task(family)
    if cfg.steps < 1:
        raise ValueError(f"steps must be >= 1, got {cfg.steps}")
    torch.set_num_threads(cfg.threads)
    torch.manual_seed(cfg.seed)
    tok = ByteTokenizer()
    model = families.get(family).checkpoints.build_model(model_config).float().train()
    opt = torch.optim.Adam(model.parameters(), lr=cfg.lr)
    # Every step sees fresh pairs: the whole stream is drawn up front (fast: stdlib only).
    pairs = bucket_by_length(make_split("train", cfg.steps * cfg.batch_size, seed=cfg.seed), cfg)
    n_params = sum(p.numel() for p in model.parameters())
    log(f"{family}: {n_params:,} parameters, {cfg.steps} steps of {cfg.batch_size} pairs")
    start, running = time.perf_counter(), 0.0
    for step in range(cfg.steps):
        for group in opt.param_groups:
            group["lr"] = lr_at(step, cfg)
        batch = framing.make_batch(pairs[step * cfg.batch_size : (step + 1) * cfg.batch_size], tok)
        loss = framing.loss(model, batch, tok.pad_id)
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
    """Eager greedy decoding of `inputs` with a trained `family` model (stops at eos)."""
    record = tokenizer_record(family)
    tok = ByteTokenizer.from_dict(record)
    eager = families.get(family).eager.Eager(model.eval(), tok)
    prompts = [encode_prompt(tok, eager.prompt_frame, x, record) for x in inputs]
    out: list[list[int]] = []
    with torch.inference_mode():
        for i in range(0, len(prompts), batch_size):
            out += generate(eager, prompts[i : i + batch_size], SearchOptions(max_new_tokens=MAX_NEW))
    return [tok.decode(ids) for ids in out]


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
    framing = task(family)
    model_config = framing.CONFIG
    cfg = TrainConfig(steps=framing.STEPS, lr=framing.LR, seed=seed)
    if steps is not None:
        cfg.steps = steps
        cfg.warmup = min(cfg.warmup, max(1, steps // 10))
    start = time.perf_counter()
    model = train(family, model_config, cfg, log)
    train_s = time.perf_counter() - start
    record = evaluate(family, model, eval_n, seed=seed)
    log(f"held-out exact match {record['exact_match']:.4f} on {eval_n} pairs (trained in {train_s:.0f}s)")
    extra = {"tokenizer": tokenizer_record(family), "eval": record}
    path = save_checkpoint(model, model_config, family, out, extra=extra)
    log(f"saved {path}")
    return record


def main(family: str, argv=None) -> int:
    """Command line of scripts/train_<family>.py: train, score on held-out dates, save."""
    import argparse

    parser = argparse.ArgumentParser(description=f"Train the bundled {family} date normaliser on the CPU, "
                                                 "score it on held-out dates, save it.")
    parser.add_argument("--steps", type=int, default=task(family).STEPS, help="optimiser steps")
    parser.add_argument("--out", default=f"models/pretrained/{family}-dates", help="checkpoint folder to write")
    parser.add_argument("--eval-n", type=int, default=1000, help="held-out pairs to score")
    parser.add_argument("--seed", type=int, default=0, help="seed of init, training data and eval data")
    args = parser.parse_args(argv)
    train_and_save(family, args.out, steps=args.steps, eval_n=args.eval_n, seed=args.seed)
    return 0
