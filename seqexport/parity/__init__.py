"""Parity: proof that an exported folder reproduces the eager model it came from
(`seqexport.parity.validate.validate`, what `seqexport validate` runs)."""
