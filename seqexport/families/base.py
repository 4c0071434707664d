"""What a model family declares: one `Family` per model kind, registered in `seqexport.families`.

The declaration itself is torch-free (the runtime and the CLI read it). Everything that needs
torch lives in sibling modules of the family's package, imported only when asked for:

    seqexport/families/<name>/
      __init__.py     FAMILY = Family(...)         names, graphs, presets, detection, CLI options
      specs.py        graph I/O names and GraphSpecs (torch-free)
      runtime.py      the runtime model: start/step over the graphs (numpy + onnxruntime)
      checkpoints.py  config from config.json, model from config, public weight layouts
      export.py       graph wrappers and the export of one checkpoint
      eager.py        the eager model behind the runtime's step API (the one eager decoder)
      parity.py       what `validate` feeds and compares
      bench.py        what `bench` times
      training.py     the date task framed for this family (bundled checkpoints)
"""

import importlib
from collections.abc import Callable
from dataclasses import dataclass, field
from types import ModuleType


class _Part:
    """A family part, the sibling module of the same name, imported when first read."""

    def __set_name__(self, owner, name):
        self.module = name

    def __get__(self, family, owner=None):
        return self if family is None else family.part(self.module)


@dataclass(frozen=True)
class Family:
    name: str  # the "family" of config.json and manifest.json; the `seqexport export <name>` command
    package: str  # the package holding the parts listed above
    graphs: tuple[str, ...]  # graph names, in export order (each is <name>.onnx)
    presets: dict[str, dict]  # preset name -> config fields (random weights of a named shape)
    # config fields the torch-free side reads (specs, runtime) -> their least value; the
    # manifest is refused when one is missing or malformed
    config_fields: dict[str, int] = field(default_factory=dict)
    bundled: str | None = None  # trained checkpoint folder under models/pretrained, if any
    # weight MatMuls that `seqexport quantize` keeps float32 (globs over eager module paths), or
    # a function of the manifest's config giving them (where they depend on the layers a model has)
    int8_keep_float: tuple[str, ...] | Callable[[dict], tuple[str, ...]] = ()
    detect: Callable[[dict], bool] = lambda config: False  # a config.json without "family" is ours?
    # a bare weights file (no config.json, e.g. BlinkDL's RWKV .pth) is ours, by its tensor names?
    # (then `checkpoints.config_from_weights(state)` infers the config from the shapes)
    detect_weights: Callable[[set[str]], bool] = lambda keys: False
    # what `detect` / `detect_weights` take, in words: an unrecognised checkpoint's error lists them
    public_layouts: str = ""
    # the tokenizer record of a checkpoint that carries none (config fields -> record or None)
    default_tokenizer: Callable[[dict], dict | None] = lambda config: None
    # tokenizer record types of the family's own (beside byte and hf), each read by
    # `<package>.tokenizer.from_record(record, folder)` (torch-free), e.g. RWKV World's
    tokenizer_types: tuple[str, ...] = ()
    export_options: tuple = ()  # click options of `seqexport export <name>` beyond the common ones
    # exported/<default name><suffix>: e.g. the Mamba scan lowering
    out_suffix: Callable[[dict], str] = lambda options: ""
    summary: str = ""  # one line for --help

    def keep_float(self, config: dict) -> tuple[str, ...]:
        """The globs of `int8_keep_float` for a model of this config."""
        rule = self.int8_keep_float
        return tuple(rule(config) if callable(rule) else rule)

    def part(self, name: str) -> ModuleType:
        return importlib.import_module(f"{self.package}.{name}")

    # The parts, each imported on first use: `family.export.export(...)`, `family.runtime.Model`.
    specs = _Part()  # torch-free
    runtime = _Part()  # torch-free
    checkpoints = _Part()
    export = _Part()
    eager = _Part()
    parity = _Part()
    bench = _Part()
    training = _Part()
