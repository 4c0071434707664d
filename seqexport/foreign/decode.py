"""A foreign artifact's decode, driven by its ModelMap: the encoder once (if any), then the
decoder graphs call after call with the state fed back by role. numpy + the runner only.

    model = ForeignModel(folder, choose(folder))
    ctx = model.begin(batch=2, src=src_ids)        # src only for an encoder-decoder
    logits = model.step(tokens, ctx)               # (b, n, vocab); ctx.state and ctx.past advance
"""

from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from seqexport.errors import ArtifactError
from seqexport.foreign.adapter import GraphMap, ModelMap
from seqexport.foreign.runner import open_graph, zeros_for


@dataclass
class Context:
    batch: int
    past: int = 0  # positions already decoded
    state: dict = field(default_factory=dict)  # past input name -> array
    encoder: dict = field(default_factory=dict)  # role -> array (encoder_hidden_states, encoder_attention_mask)


class ForeignModel:
    def __init__(self, folder, model_map: ModelMap, runtime: str = "onnxruntime", provider: str = "auto",
                 threads: int | None = None):
        self.folder = Path(folder)
        self.map = model_map
        self.runners = {g.file: open_graph(self.folder / g.file, runtime, provider, threads) for g in model_map.graphs}
        self.roles = {s.input: s for g in model_map.graphs for s in g.state}  # past input -> its StateRole
        self.provider = next(iter(self.runners.values())).provider
        bits = [r.quant_bits for r in self.runners.values() if r.quant_bits]
        self.quant_bits = min(bits) if bits else None
        logits = self.runners[model_map.step.file].outputs.get(model_map.step.outputs.get("logits"))
        self.dtype = logits.dtype if logits is not None else "float32"

    def max_tokens(self, past: int) -> int | None:
        """Tokens the graph for a call at this past takes (None: any number)."""
        return self.graph(past).max_tokens

    def graph(self, past: int) -> GraphMap:
        return self.map.first if past == 0 and self.map.first is not None else self.map.step

    def begin(self, batch: int, src: np.ndarray | None = None) -> Context:
        ctx = Context(batch)
        if self.map.encoder is not None:
            if src is None:
                raise ArtifactError(f"{self.folder}: an encoder-decoder artifact needs source tokens")
            mask = np.ones_like(src)
            outs = self._run(self.map.encoder, {"input_ids": src, "attention_mask": mask}, ctx)
            ctx.encoder = {"encoder_hidden_states": outs[self.map.encoder.outputs["encoder_hidden_states"]],
                           "encoder_attention_mask": mask}
        return ctx

    def step(self, tokens: np.ndarray, ctx: Context) -> np.ndarray:
        """Feed tokens (b, n) after ctx.past positions; returns logits (b, n, vocab)."""
        g = self.graph(ctx.past)
        b, n = tokens.shape
        if g.max_tokens is not None and n > g.max_tokens:
            raise ArtifactError(f"{g.file} takes at most {g.max_tokens} tokens a call, {n} given")
        if g.chunk_rows and b > g.chunk_rows and n > 1 and ctx.past:
            return self._rows_apart(tokens, ctx, g.chunk_rows)
        by_role = {"input_ids": tokens,
                   "attention_mask": np.ones((b, ctx.past + n), np.int64),  # no padding: every slot valid
                   "position_ids": np.broadcast_to(np.arange(ctx.past, ctx.past + n), (b, n)),
                   "use_cache_branch": np.array([ctx.past > 0])} | ctx.encoder
        outs = self._run(g, by_role, ctx)
        for name, role in self.roles.items():
            if role.kind == "static" and name in ctx.state:
                continue  # computed once (a merged decoder's with-past branch returns placeholders)
            if role.output in outs:
                ctx.state[name] = outs[role.output]
            elif role.kind != "static" and g is self.map.step and name in self.runners[g.file].inputs:
                raise ArtifactError(f"{g.file}: no output {role.output!r} to feed {name!r} next call")
        ctx.past += n
        return outs[g.outputs["logits"]]

    def _rows_apart(self, tokens: np.ndarray, ctx: Context, rows: int) -> np.ndarray:
        """The call in slices of `rows` rows (every state and encoder value sliced on axis 0),
        joined back: for a graph that takes several tokens after a past only for fewer rows."""
        logits, parts = [], []
        for r in range(0, ctx.batch, rows):
            part = Context(min(rows, ctx.batch - r), ctx.past, {k: v[r: r + rows] for k, v in ctx.state.items()},
                           {k: v[r: r + rows] for k, v in ctx.encoder.items()})
            logits.append(self.step(tokens[r: r + rows], part))  # (rows, n, vocab)
            parts.append(part)
        ctx.state = {k: np.concatenate([p.state[k] for p in parts]) for k in parts[0].state}
        ctx.past += tokens.shape[1]
        return np.concatenate(logits)

    def _run(self, g: GraphMap, by_role: dict, ctx: Context) -> dict:
        runner = self.runners[g.file]
        names = {name: role for role, name in g.inputs.items()}
        feeds = {}
        for name, tensor in runner.inputs.items():
            if name in names:
                value = by_role[names[name]]
            elif name in self.roles:
                value = ctx.state.get(name)
                value = zeros_for(tensor, ctx.batch, g.dims) if value is None else value
            else:
                raise ArtifactError(f"{g.file}: input {name!r} has no role in the {self.map.adapter} map; "
                                    "name it in an --io-map file")
            feeds[name] = np.ascontiguousarray(value, dtype=np.dtype(tensor.dtype) if tensor.dtype != "bfloat16"
                                               else None)
        self.last_feeds = feeds  # what the last call was fed (localize re-runs it)
        return runner.run(feeds)
