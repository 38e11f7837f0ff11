"""GGUF files: reading them without their weights (`read.py`: a file cut short, its quantization, the note beside a
file draftwise wrote), writing a config and a state dict as one (`write.py`), the model a spec names written as one
with its target's tokenizer, cached (`export.py`), and the vocabulary a file carries (`vocab.py`)."""
