"""draftwise: design and benchmark drafter models for speculative decoding (SD) on your own hardware."""

__version__ = "0.1.0"
