"""The transformers runtime: models built from our checkpoints and run behind the engine's interface (`model.py`:
`HFCausalLM`, the fallback for architectures the lean forward does not cover, and the baselines' models); `runtime.py`
registers it."""
