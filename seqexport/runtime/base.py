"""What every exported model has at run time: its graphs, its state, and the step API's
common part. Each family's runtime model (`seqexport/families/<name>/runtime.py`) builds on
`RuntimeModel`; every graph I/O name comes from the specs stored in manifest.json.
"""

from pathlib import Path

import numpy as np

from seqexport.errors import ArtifactError, InputError, UsageError
from seqexport.manifest import MANIFEST, graph_specs, read_manifest
from seqexport.runtime.capabilities import StepModel
from seqexport.runtime.chat import load_chat_template
from seqexport.runtime.runners import open_graph
from seqexport.runtime.session import SharedWeights
from seqexport.runtime.tokenizer import encode_prompt, load_tokenizer
from seqexport.state.rows import checked_rows, retain_rows
from seqexport.state.state import State, physical_memory, zero_state

__all__ = ["RuntimeModel", "State", "physical_memory", "retain_rows", "tokens_2d", "zero_state"]


def tokens_2d(tokens) -> tuple[np.ndarray, bool]:
    """(b,) or (b, t) tokens -> (b, t) and whether the caller gave one token per row."""
    try:
        a = np.asarray(tokens)
    except (ValueError, OverflowError, TypeError) as e:  # ragged rows, ids beyond int64
        raise InputError(f"tokens: expected a (batch,) or (batch, length) array of token ids: {e}") from None
    return (a[:, None], True) if a.ndim == 1 else (a, False)


class RuntimeModel(StepModel):
    """Common part: manifest, graphs, tokenizer, provider, feeding outputs back as state.

    A family's model adds `vocab_size`, `start(...)`, `step(tokens, state)` and
    `begin(prompts)` (what generation calls first; see `seqexport.runtime.generate`).
    """


    def __init__(self, folder: str | Path, provider: str = "auto", verify: bool = True, threads: int | None = None,
                 io_binding: bool | None = None, manifest: dict | None = None, runtime: str = "onnxruntime"):
        self.folder = Path(folder)
        self.runtime = runtime  # what runs the graphs (seqexport.runtime.runners.RUNTIMES)
        self.manifest = manifest if manifest is not None else read_manifest(self.folder, verify=verify)
        self.config = self.manifest["config"]
        self.specs = graph_specs(self.manifest)
        # One copy of the weights in memory for all graphs (exports with a shared weights file).
        weights = self.manifest.get("weights")
        self.shared_weights = SharedWeights(self.folder, weights) if weights else None
        if self.shared_weights:
            self.shared_weights.index(self.folder / g["file"] for g in self.manifest["graphs"].values())
        self.graphs = {name: open_graph(runtime, self.folder / self.manifest["graphs"][name]["file"], spec, provider,
                                        threads, self.shared_weights)
                       for name, spec in self.specs.items()}
        self.provider = next(iter(self.graphs.values())).provider
        self._keep = {g: {out for out, _ in spec.feeds} for g, spec in self.specs.items()}
        # Keep the cache on the device between steps where there is one (no host round trip).
        self.io_binding = self.provider == "CUDAExecutionProvider" if io_binding is None else io_binding
        record = self.manifest.get("tokenizer")
        try:
            self.tokenizer = load_tokenizer(record, self.folder)
            self.chat_template = load_chat_template(record, self.folder)
        except ArtifactError as e:
            raise ArtifactError(f"{self.folder / MANIFEST}: field 'tokenizer': {e}") from None
        # the checkpoint's decode defaults (generation_config.json): what generate() and a served
        # request use where they give no value; the record keeps what is not applied too
        self.generation = self.manifest.get("generation")
        self.generation_defaults = dict((self.generation or {}).get("defaults") or {})

    def encode(self, text: str) -> list[int]:
        """`text` as the prompt ids generation takes, framed as the model was trained (bos,
        suffix, eos: the manifest's tokenizer record, else the family's `prompt_frame`).
        UsageError for an export without a tokenizer (give it token ids instead), InputError
        for anything but a non-empty string."""
        if self.tokenizer is None:
            raise UsageError(f"{self.folder} has no tokenizer in its manifest; give the prompt as token ids")
        return encode_prompt(self.tokenizer, self.prompt_frame, text, self.manifest.get("tokenizer"))

    def encode_chat(self, messages, variables: dict | None = None) -> list[int]:
        """A conversation ([{"role", "content"}, ...]) as prompt ids, through the checkpoint's
        chat template with the assistant's opening, as transformers' `apply_chat_template(...,
        add_generation_prompt=True, tokenize=True, **variables)` gives them. UsageError for an
        export without a chat template, InputError for messages it refuses."""
        if self.chat_template is None:
            raise UsageError(f"{self.folder} has no chat template (its checkpoint had none, or it was exported "
                             "before seqexport kept them); give the prompt as text or token ids")
        return self.tokenizer.encode(self.chat_template.render(messages, variables=variables), special=False)

    # serving: rows join and leave (engine). Defaults for families whose rows are independent
    # along the batch (Mamba, RWKV); a family whose state has another kind overrides join/take
    # (through its StateLayout), or sets continuous_batching False.

    def join(self, states: list[State]) -> State:
        """The rows of several states as one batch, in order."""
        return State.concat(states)

    def take(self, state: State, rows) -> State:
        """The state of these rows, in this order (finished requests leave)."""
        return state.select(rows)

    # The engine's variants consume the running batch's state (it holds no other reference):
    # rows move within its arrays instead of the whole batch being copied.

    def extend(self, state: State, newcomers: list[State], rows: int | None = None) -> State:
        """`state`'s rows, then the newcomers' (join); `state` must not be used again. `rows`:
        the most rows the batch may come to hold (the engine's max_rows), for a model that keeps
        spare rows to write later newcomers into."""
        checked_rows(rows)  # (rows here are independent: a join copies them whatever the room)
        return self.join([state, *newcomers])

    def retain(self, state: State, rows: list[int]) -> State:
        """`take(state, rows)`, moving only the rows that change place when `rows` fills the
        holes left by leavers from the tail (`swap_remove_order`); `state` must not be used again."""
        moved = retain_rows(state.arrays, rows)
        if moved is None:
            return self.take(state, rows)
        return State(moved, state.length).owning()

    def _run(self, graph: str, feeds: dict) -> dict:
        g = self.graphs[graph]
        if not self.io_binding:
            return g.run(feeds)
        return g.run_bound(feeds, keep=self._keep[graph])

    def _fed(self, graph: str, outputs: dict) -> dict:
        """The state inputs a run of `graph` produced: output -> its declared state input."""
        return {inp: outputs[out] for out, inp in self.specs[graph].feeds}

    def _feed_back(self, graph: str, outputs: dict, arrays: dict) -> dict:
        """Next step's arrays: the old ones with every fed state input replaced."""
        return arrays | self._fed(graph, outputs)
