"""Speculative decoding: proposals (prompt lookup here; draft models inside runners) and exact verification."""
