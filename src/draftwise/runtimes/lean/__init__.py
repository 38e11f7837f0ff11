"""The lean runtime: draftwise's own forward (`forward.py`: `LeanLM`, one class for every family `targets.family`
describes), its precisions (fp32 / bf16 / fp16; `int8.py`: int8 weights; `q4.py`: a GGUF file's own 4-bit blocks),
packs of a built int8 / q4 model (`packed.py`), the C kernels and their build (`kernels.py`, `cpu_*.c`),
reduced-vocabulary heads (`reduced.py`) and the feature head a feature drafter trains (`feature_head.py`).
`runtime.py` registers it; its loader is shared with transformers (`runtimes.checkpoint`)."""
