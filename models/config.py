"""What the models' configs share: each is a dataclass that config.json stores as a plain dict."""

from dataclasses import asdict, fields
from typing import Self


class DictConfig:
    """`to_dict` / `from_dict` of a config dataclass (subclass it under `@dataclass`)."""

    def to_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: dict) -> Self:
        """Our own config dict; unknown keys raise ValueError naming them (a misspelt field in
        config.json is an error, not a silent default)."""
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(d) - known)
        if unknown:
            raise ValueError(f"unknown {cls.__name__} keys {unknown}; expected some of {sorted(known)}")
        return cls(**d)
