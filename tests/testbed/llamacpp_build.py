"""Build llama.cpp's `llama-server` into a test bed venv, from the llama.cpp sources that PyPI's llama-cpp-python
sdist ships (vendor/llama.cpp): run with the venv's Python by tests/testbed/cache.py, never imported by pytest.

    python tests/testbed/llamacpp_build.py VENV_DIR

Why not llama-cpp-python's own server (`python -m llama_cpp.server`): it has no /metrics and no /health, so it
cannot stand for the llama-server a Spark runs. The sdist is fetched by pip (`pip download --no-binary :all:`),
and only the server's target is built, with the cheapest flags that still serve the tiny model (docs/TESTBED.md:
no optimisation, no -march=native, no OpenMP, static, no tests/examples/web UI, no curl/OpenSSL). The binary goes to
VENV_DIR/bin/llama-server; the build's figures to VENV_DIR/llama-server-build.json.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tarfile
import time
from pathlib import Path

LLAMA_CPP_PYTHON = "0.3.36"
CMAKE_FLAGS = (
    "-G", "Ninja",
    # "Custom": a build type llama.cpp does not know, so it adds no -O3 (its Release default): -O0 compiles the
    # ~200 sources in about a third of the CPU time, and the tiny model still decodes at ~1,300 tokens/s.
    "-DCMAKE_BUILD_TYPE=Custom",
    "-DBUILD_SHARED_LIBS=OFF", "-DGGML_NATIVE=OFF", "-DGGML_OPENMP=OFF",
    "-DLLAMA_CURL=OFF", "-DLLAMA_OPENSSL=OFF", "-DLLAMA_BUILD_TESTS=OFF", "-DLLAMA_BUILD_EXAMPLES=OFF",
    "-DLLAMA_BUILD_TOOLS=ON", "-DLLAMA_BUILD_SERVER=ON", "-DLLAMA_BUILD_UI=OFF", "-DLLAMA_USE_PREBUILT_UI=OFF",
)


def run(argv: list[str], **kw) -> None:
    print("$", " ".join(argv), flush=True)
    subprocess.run(argv, check=True, **kw)


def main(argv: list[str]) -> int:
    venv = Path(argv[1]).resolve()
    work = venv / "llama-cpp-build"
    shutil.rmtree(work, ignore_errors=True)
    work.mkdir()
    started = time.monotonic()
    run([sys.executable, "-m", "pip", "--disable-pip-version-check", "download", "--no-deps", "--no-binary", ":all:",
         "-d", str(work), f"llama-cpp-python=={LLAMA_CPP_PYTHON}"])
    sdist = next(work.glob("llama_cpp_python-*.tar.gz"))
    top = f"llama_cpp_python-{LLAMA_CPP_PYTHON}/vendor/llama.cpp/"
    with tarfile.open(sdist) as tar:
        members = [m for m in tar.getmembers() if m.name.startswith(top)]
        tar.extractall(work, members=members, filter="data")
    src, build = work / top, work / "build"
    fetched = time.monotonic()
    run(["cmake", "-S", str(src), "-B", str(build), *CMAKE_FLAGS], stdout=subprocess.DEVNULL)
    configured = time.monotonic()
    jobs = str(max(1, os.cpu_count() or 1))
    run(["cmake", "--build", str(build), "--target", "llama-server", "-j", jobs], stdout=subprocess.DEVNULL)
    built = time.monotonic()
    shutil.copy2(build / "bin" / "llama-server", venv / "bin" / "llama-server")
    (venv / "llama-server-build.json").write_text(json.dumps({
        "llama_cpp_python": LLAMA_CPP_PYTHON, "flags": CMAKE_FLAGS, "jobs": int(jobs),
        "fetch_s": round(fetched - started, 1), "configure_s": round(configured - fetched, 1),
        "build_s": round(built - configured, 1)}, indent=1))
    shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
