"""What generation, the engine and the server may ask of a model with `start`/`step` (an
exported one or the eager one behind the same API): its capabilities, declared as data with the
default of a model that lacks them, instead of probed for with getattr.

A model also has `tokenizer`, `prompt_frame`, `start`, `step`, `begin`,
`begin_rows`, `feed` and the row operations `join` / `take` / `extend` / `retain`.
"""


class StepModel:
    vocab_size: int  # token ids lie in [0, vocab_size): every model sets it (an attribute or a property)
    family: str = ""  # the registry name
    supports_beams: bool = False  # beam search: rows can be reordered mid-decode (a gather per kind)
    # a decoder that starts from a start token (SearchOptions.start_id; the model's `start_token(start_id)`
    # says which); False: the prompt is the start
    takes_start_id: bool = False
    # rows may join a running batch at any step boundary; False: the engine admits new requests
    # only when the batch is empty (an old transformer decoder whose rows must stay in step)
    continuous_batching: bool = True
    # `begin_rows` runs a graph (a transformer's encoder): the engine's starter thread runs it beside
    # the batched step; otherwise (a zero recurrent state) the starter runs `begin`, the whole prefill
    begin_rows_runs_a_graph: bool = False
    ragged_prefill: bool = False  # prompts of unequal length share one prefill run
    max_new_tokens_limit: int | None = None  # the most tokens one decode can make (a positional table)
    advance = None  # the engine's batched step that consumes the state it steps (RowBuffers), if any
    # the StateLayout of a model that keeps its state by kinds (an appended KV cache among them);
    # None: a model whose state is replaced whole at each step
    layout = None
