#!/usr/bin/env bash
# Make DIR (default .venv) a virtual environment whose pip runs, repairing what an interrupted set-up left: a venv
# killed while `python3 -m venv` ran has a python but no pip (what `python3 -m venv --without-pip` makes), or not even
# a python that starts. Whatever is installed in it already (torch, the llama.cpp build under DIR/llama.cpp) is kept:
# `python3 -m venv` over an existing folder rewrites its interpreter links and reinstalls pip, and deletes nothing.
set -euo pipefail
dir="${1:-.venv}"
if ! "$dir/bin/python" -c "" 2>/dev/null; then
    python3 -m venv "$dir"
fi
if ! "$dir/bin/python" -m pip --version >/dev/null 2>&1; then
    "$dir/bin/python" -m ensurepip --upgrade >/dev/null 2>&1 || python3 -m venv "$dir"
fi
"$dir/bin/python" -m pip --version >/dev/null
