"""Reading a JSON object a user gave us (config.json, manifest.json) with one typed error."""

import json
from pathlib import Path

from seqexport.errors import SeqexportError


def read_json_object(path: Path, error: type[SeqexportError], missing: str) -> dict:
    """The object in `path`; `error(missing)` when the file is absent, `error` naming the
    file when it is not valid JSON (corrupt) or holds something other than an object."""
    try:
        data = json.loads(Path(path).read_text())
    except FileNotFoundError:
        raise error(missing) from None
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise error(f"{path} is corrupt (not valid JSON: {e})") from None
    if not isinstance(data, dict):
        raise error(f"{path} must hold a JSON object, found {type(data).__name__}")
    return data
