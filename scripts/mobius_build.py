"""`mobius build` (onnxruntime's mobius 0.1) with transformers 5's layer-type names mapped back
to the ones mobius reads, run by the mobius venv's python (scripts/peers_genai_mobius.sh):

    HF_HUB_OFFLINE=1 PEER/bin/python scripts/mobius_build.py build --model HF_DIR OUT

transformers 5 names a Mamba-2 layer "linear_attention" and an attention layer "full_attention"
(Bamba's and NemotronH's `layers_block_type`); mobius 0.1 maps only the older "mamba" /
"attention", so it builds a Bamba attention layer as Mamba-2 and takes a NemotronH Mamba-2 layer
for a DeltaNet one, and both builds fail."""

import sys

import mobius._configs._base as configs
from mobius.__main__ import main

OLDER_NAMES = {"linear_attention": "mamba", "full_attention": "attention"}


class OlderLayerNames:
    """A transformers config read through, its `layers_block_type` in the names mobius knows."""

    def __init__(self, config):
        self._config = config

    def __getattr__(self, name):
        value = getattr(self._config, name)
        if name == "layers_block_type" and value:
            return [OLDER_NAMES.get(t, t) for t in value]
        return value


def older_names(from_transformers):
    def read(cls, config, parent_config=None):
        return from_transformers(cls, OlderLayerNames(config), parent_config)
    return classmethod(read)


for hybrid in (configs.BambaConfig, configs.NemotronHConfig):
    hybrid.from_transformers = older_names(hybrid.from_transformers.__func__)

if __name__ == "__main__":
    sys.exit(main())
