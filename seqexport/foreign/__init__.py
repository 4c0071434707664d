"""Validate artifacts other tools made (Optimum, transformers.js-style graphs, anything with an
--io-map): an adapter maps a foreign folder's graph inputs and outputs to roles, state kinds and
layouts (`adapter.ModelMap`), and one set of checks (`foreign.validate`) runs any of them against
transformers' own model class loaded from the reference checkpoint."""
