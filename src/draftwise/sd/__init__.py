"""Speculative decoding: sampling (distributions and draws), verify (the acceptance rule and its glossary) and
engine (the loop, shared with plain autoregressive decoding)."""
