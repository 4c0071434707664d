"""Exported models at run time: the step API over the graphs, with the state in plain sight.

    model = seqexport.runtime.load("exported/transformer-tiny")
    state = model.start(src_ids)                   # transformer: runs the encoder
    logits, state = model.step(tokens, state)      # state.arrays: graph input name -> array

    model = seqexport.runtime.load("exported/mamba-tiny-loop")
    state = model.start(batch_size)                # zero conv/SSM states
    logits, state = model.step(prompt_ids, state)  # several tokens go through the prefill graph

Every graph I/O name comes from manifest.json (via the specs it stores).
"""

from dataclasses import dataclass
from pathlib import Path

import numpy as np

from seqexport import specs as S
from seqexport.errors import InputError
from seqexport.manifest import graph_specs, read_manifest
from seqexport.runtime.session import NP_DTYPES, Graph, check_token_ids, shape_and_dtype, to_numpy


@dataclass
class State:
    """What the next step feeds: graph input name -> array, plus tokens consumed so far.

    On CPU the arrays are numpy arrays. With IO binding (the default on CUDA) the
    cache stays on the device as onnxruntime OrtValues between steps; `numpy()`
    gives a host copy.
    """

    arrays: dict[str, np.ndarray]
    length: int = 0

    @property
    def batch_size(self) -> int:
        return shape_and_dtype("state", next(iter(self.arrays.values())))[0][0]

    @property
    def nbytes(self) -> int:
        total = 0
        for k, v in self.arrays.items():
            shape, dtype = shape_and_dtype(k, v)
            total += int(np.prod(shape)) * np.dtype(dtype).itemsize
        return total

    def numpy(self) -> "State":
        return State({k: to_numpy(v) for k, v in self.arrays.items()}, self.length)

    def select(self, rows) -> "State":
        """The state of the given batch rows (in that order), e.g. to reorder beams."""
        rows = np.asarray(rows)
        return State({k: to_numpy(v)[rows] for k, v in self.arrays.items()}, self.length)

    @staticmethod
    def concat(states: list["State"]) -> "State":
        """One batch from several (e.g. Mamba prompts of different lengths prefilled apart)."""
        keys = states[0].arrays.keys()
        return State({k: np.concatenate([to_numpy(s.arrays[k]) for s in states]) for k in keys},
                     max(s.length for s in states))


def tokens_2d(tokens) -> tuple[np.ndarray, bool]:
    """(b,) or (b, t) tokens -> (b, t) and whether the caller gave one token per row."""
    a = np.asarray(tokens)
    return (a[:, None], True) if a.ndim == 1 else (a, False)


class RuntimeModel:
    """Common part: manifest, graphs, tokenizer, provider."""

    family = ""

    def __init__(self, folder: str | Path, provider: str = "auto", verify: bool = True, threads: int | None = None,
                 io_binding: bool | None = None):
        self.folder = Path(folder)
        self.manifest = read_manifest(self.folder, verify=verify)
        self.config = self.manifest["config"]
        self.specs = graph_specs(self.manifest)
        self.graphs = {name: Graph(self.folder / self.manifest["graphs"][name]["file"], spec, provider, threads)
                       for name, spec in self.specs.items()}
        self.provider = next(iter(self.graphs.values())).provider
        self._pairs = {g: S.state_pairs(spec) for g, spec in self.specs.items()}
        self._keep = {g: {n for n in spec.output_names if n.startswith("present")} for g, spec in self.specs.items()}
        # Keep the cache on the device between steps where there is one (no host round trip).
        self.io_binding = self.provider == "CUDAExecutionProvider" if io_binding is None else io_binding
        self.tokenizer = None
        if self.manifest.get("tokenizer"):
            from seqexport.runtime.tokenizer import ByteTokenizer

            self.tokenizer = ByteTokenizer.from_dict(self.manifest["tokenizer"])

    def _run(self, graph: str, feeds: dict) -> dict:
        g = self.graphs[graph]
        if not self.io_binding:
            return g.run(feeds)
        return g.run_bound(feeds, keep=self._keep[graph])

    def _feed_back(self, graph: str, outputs: dict, arrays: dict) -> dict:
        """Next step's arrays: each present.* output under its past.* input name."""
        new = dict(arrays)
        for out, inp in self._pairs[graph]:
            new[inp] = outputs[out]
        return new


class TransformerModel(RuntimeModel):
    family = "transformer"

    @property
    def vocab_size(self) -> int:
        return self.config["tgt_vocab_size"]

    @property
    def pad_id(self) -> int:
        return self.config["pad_id"]

    def start(self, src_ids, src_mask=None) -> State:
        """Run the encoder once; the state holds the cross K/V and an empty self-attention cache.

        src_ids (b, s) int; src_mask (b, s) with 1 = token, 0 = padding (default: src_ids != pad_id).
        """
        src = check_token_ids("src_ids", src_ids, self.config["src_vocab_size"])
        if src.shape[1] > self.config["max_len"]:
            raise InputError(f"src_ids: length {src.shape[1]} exceeds the positional table ({self.config['max_len']})")
        mask = (src != self.pad_id) if src_mask is None else np.asarray(src_mask)
        if mask.shape != src.shape:
            raise InputError(f"src_mask: shape {mask.shape} differs from src_ids {src.shape}")
        mask = mask.astype(np.int64)
        enc = self._run("encoder", {S.INPUT_IDS: src, S.ATTENTION_MASK: mask})
        arrays = {S.ENCODER_ATTENTION_MASK: mask}
        dec = self.specs["decoder"]
        b = src.shape[0]
        for t in dec.inputs:
            if t.name.startswith("past_key_values.") and ".encoder." in t.name:
                arrays[t.name] = enc["present." + t.name[len("past_key_values."):]]
            elif t.name.startswith("past_key_values."):
                arrays[t.name] = np.zeros((b, t.dims[1], 0, t.dims[3]), NP_DTYPES[t.dtype])
        return State(arrays, 0)

    def step(self, tokens, state: State) -> tuple[np.ndarray, State]:
        """Feed tokens (b,) or (b, t); return logits (b, vocab) or (b, t, vocab) and the new state."""
        ids, squeeze = tokens_2d(tokens)
        ids = check_token_ids("tokens", ids, self.vocab_size)
        if state.length + ids.shape[1] > self.config["max_len"]:
            raise InputError(
                f"tokens: context of {state.length + ids.shape[1]} exceeds the positional table "
                f"({self.config['max_len']} positions)"
            )
        out = self._run("decoder", {S.INPUT_IDS: ids, **state.arrays})
        logits = out[S.LOGITS]
        new = State(self._feed_back("decoder", out, state.arrays), state.length + ids.shape[1])
        return (logits[:, 0] if squeeze else logits), new


class MambaModel(RuntimeModel):
    family = "mamba"

    @property
    def vocab_size(self) -> int:
        return self.config["vocab_size"]

    @property
    def prefill_len(self) -> int | None:
        """The fixed length of an `unrolled` prefill graph, else None (dynamic)."""
        dim = self.specs["prefill"].input(S.INPUT_IDS).dims[1]
        return dim if isinstance(dim, int) else None

    def start(self, batch_size: int) -> State:
        """Zero conv and SSM states for `batch_size` fresh sequences."""
        if not isinstance(batch_size, int | np.integer) or batch_size < 1:
            raise InputError(f"batch_size: expected a positive integer, got {batch_size!r}")
        arrays = {}
        for t in self.specs["step"].inputs[1:]:
            arrays[t.name] = np.zeros((batch_size, *t.dims[1:]), NP_DTYPES[t.dtype])
        return State(arrays, 0)

    def step(self, tokens, state: State) -> tuple[np.ndarray, State]:
        """Feed tokens (b,) or (b, t); return logits (b, vocab) or (b, t, vocab) and the new state.

        Several tokens go through the prefill graph (in pieces of its fixed length for an
        `unrolled` export, the rest through the step graph).
        """
        ids, squeeze = tokens_2d(tokens)
        ids = check_token_ids("tokens", ids, self.vocab_size)
        pieces = []
        pos = 0
        while pos < ids.shape[1]:
            n = ids.shape[1] - pos
            fixed = self.prefill_len
            if n == 1 or (fixed is not None and n < fixed):
                graph, n = "step", 1
            else:
                graph, n = "prefill", (fixed or n)
            out = self._run(graph, {S.INPUT_IDS: ids[:, pos : pos + n], **state.arrays})
            state = State(self._feed_back(graph, out, state.arrays), state.length + n)
            pieces.append(out[S.LOGITS])
            pos += n
        logits = pieces[0] if len(pieces) == 1 else np.concatenate(pieces, axis=1)
        return (logits[:, 0] if squeeze else logits), state


FAMILIES = {"transformer": TransformerModel, "mamba": MambaModel}


def load(folder: str | Path, provider: str = "auto", verify: bool = True, threads: int | None = None,
         io_binding: bool | None = None) -> TransformerModel | MambaModel:
    """Open an exported folder: reads manifest.json (checking graph hashes unless verify=False).

    provider: auto (CUDA when onnxruntime-gpu can use a GPU, else CPU), cpu or cuda.
    io_binding: keep the cache/state as OrtValues between steps (default: on with CUDA).
    """
    family = read_manifest(folder, verify=False)["family"]
    if family not in FAMILIES:
        from seqexport.errors import ArtifactError

        raise ArtifactError(f"{folder}: unknown family {family!r} in manifest.json; expected {list(FAMILIES)}")
    return FAMILIES[family](folder, provider=provider, verify=verify, threads=threads, io_binding=io_binding)
