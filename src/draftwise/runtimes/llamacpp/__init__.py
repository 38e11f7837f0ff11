"""The llama.cpp runtime: libllama through llama-cpp-python (`lm.py`: `LlamaCppLM`, run where a native fault costs one
call, not the process), loading targets and drafters as GGUF files at their own quantization (`load.py`, which
registers it), and the build set-up makes and smoke-tests for this CPU (`build.py`)."""
