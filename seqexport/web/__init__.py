"""Exported models in the browser: `seqexport web DIR... --out SITE` writes a static site whose
page decodes them client-side with onnxruntime-web (WASM, or WebGPU where the browser has it).

The JavaScript runtime (`static/seqexport.mjs`) is `seqexport.runtime`'s contract in the browser:
it reads manifest.json's graph specs (roles, feeds, appends), never the family's name. See
docs/web.md.
"""

from seqexport.web.site import build_site, find_node_modules, summary

__all__ = ["build_site", "find_node_modules", "summary"]
