"""Workflow records and admission proofs (RFC 0024): the writer (``crucible.proof.writer``)
and the independent reader (``crucible.proof.reader``). ``crucible.proof.layout`` holds
the bundle's file-layout constants, the only module the two sides share besides core."""
