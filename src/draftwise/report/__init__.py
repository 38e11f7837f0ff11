"""Derived outputs: plots (and later the report), computed from run folders' summaries."""
