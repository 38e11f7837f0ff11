"""The runtimes a model runs on, one package each behind the `Runtime` Protocol (`base.py`), registered in
`registry.RUNTIMES`:

  lean          draftwise's own forward at fp32 / bf16 / fp16, int8 or a GGUF file's q4 blocks, with its C kernels
                (`lean/`)
  transformers  the fallback for architectures the lean forward does not cover, and the baselines' models (`hf/`)
  llama.cpp     libllama through llama-cpp-python on a GGUF file at its own quantization, and its build (`llamacpp/`)

`load(spec, options)` gives a `Model` on the runtime `options.backend` names (`auto`: lean where the architecture
allows, else transformers); `load_drafter(spec, target, options)` a drafter for `target` on the target's runtime,
checked to speak its vocabulary. A new runtime is one package whose module calls `register` (its name becomes a
backend); the stages ask a runtime's fields (`runtime(name)`), never its name.
"""
