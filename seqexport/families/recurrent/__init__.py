"""The parts that the recurrent-state language models (`mamba`, `rwkv`) share: a family of this
shape has two graphs, a prefill over any number of tokens and a one-token step, both over a
state of one size whatever the context. Not a family itself (the registry lists none here):
each family's part builds on the module of the same name and says only what differs.

    eager.py     RecurrentEager: the eager model behind the runtime's step API
    parity.py    RecurrentCases: what `validate` feeds and decodes
    bench.py     the step and prefill cases, state bytes and prompts `bench` times
    training.py  the date task framed for a decoder-only LM

Torch-free here; the modules it lists need torch.
"""

# the graphs of such a family, in export order: the shared parts run them by these names
GRAPHS = ("prefill", "step")
