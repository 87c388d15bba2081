#!/usr/bin/env python3
"""The dependencies of a vllm wheel that its CPU-side import needs.

Usage: vllm-wheel-deps.py WHEEL
       vllm-wheel-deps.py --requires FILE
       vllm-wheel-deps.py substitute REQUIREMENT VERSION...

Reads the wheel's Requires-Dist (its METADATA; or FILE, the Requires-Dist
lines of one, as tests/fixtures/vllm-wheel-requires/ stores them), evaluates each marker for
the running interpreter (run it with the target venv's python), drops the
optional extras' requirements, and sorts what is left into three kinds,
printed one requirement a line:

    torch <pin>        the torch requirement (installed first, on its own)
    dep <requirement>  a light dependency, installed with its dependencies
                       and extras (`fastapi[standard]` brings uvloop, which
                       vLLM imports)
    nodeps <req>       imported by vLLM's model registry or attention
                       backends, but its own dependencies are GPU-only:
                       installed with --no-deps
    skip <req> (why)   not installed (on stderr)

The filter (what a CPU machine running vLLM's Python functions, not its
kernels, leaves out): the torch family besides torch itself (torchvision,
torchaudio, torchcodec), CUDA and NVIDIA libraries (nvidia-*, cuda-*,
cupy-*, PyNvVideoCodec, nvtx), GPU kernels and their compilers (triton,
xformers, tilelang, apache-tvm-ffi, quack-kernels, tokenspeed-mla,
humming-kernels, deep-gemm, b12x, helion), ray, numba, the GPU tensor
loaders (fastsafetensors, instanttensor), and the image stack
(mistral_common, opencv-python-headless). flashinfer-python and
compressed-tensors are installed at the wheel's pins without their
dependencies. Always added: pytest (the project's tests), loguru and
nvidia-ml-py (imported by the model registry and the FlashInfer backend
module, though the metadata does not list them).

`substitute NAME==V VERSION...` picks the version to install when the
package index lacks the pin V (VERSIONS: what the index has, as pip's
"from versions:" lists them): the highest final release with V's
major.minor, else the lowest final release newer than V. It prints
`NAME==CHOSEN`, or exits 1 when no version qualifies (a requirement that is
no exact pin, or nothing newer). 0.34.0 pins flashinfer-python==0.7.3, which
the index never had; 0.7.4 is installed in its place.
"""

import re
import sys
import zipfile

try:
    from packaging.requirements import Requirement
    from packaging.version import InvalidVersion, Version
except ImportError:  # a fresh venv has only pip's copy
    from pip._vendor.packaging.requirements import Requirement
    from pip._vendor.packaging.version import InvalidVersion, Version

SKIP = [
    (r"torchvision|torchaudio|torchcodec", "torch family, not imported by the connector"),
    (r"nvidia-.*|cuda-.*|cupy.*|pynvvideocodec|nvtx", "CUDA / NVIDIA library"),
    (
        r"triton.*|xformers|tilelang|apache-tvm-ffi|quack-kernels|tokenspeed-mla|humming-kernels|deep-gemm|deep-ep|b12x|helion",
        "GPU kernels",
    ),
    (r"ray", "distributed executor"),
    (r"numba", "JIT compiler, used by GPU-side code"),
    (r"fastsafetensors|instanttensor", "GPU tensor loader"),
    (r"mistral-common|opencv-python-headless", "image stack (opencv)"),
]
NO_DEPS = {"flashinfer-python", "compressed-tensors"}
ALWAYS = ["pytest", "loguru", "nvidia-ml-py"]


def canonical(name):
    return re.sub(r"[-_.]+", "-", name).lower()


def requirements(wheel):
    if not zipfile.is_zipfile(wheel):
        raise SystemExit(f"vllm-wheel-deps: {wheel} is not a wheel (a zip file)")
    with zipfile.ZipFile(wheel) as z:
        names = [n for n in z.namelist() if re.fullmatch(r"vllm-[^/]*\.dist-info/METADATA", n)]
        if not names:
            raise SystemExit(f"vllm-wheel-deps: {wheel} has no vllm-*.dist-info/METADATA")
        text = z.read(names[0]).decode()
    return [line.split(":", 1)[1].strip() for line in text.splitlines() if line.startswith("Requires-Dist:")]


def stored_requirements(path):
    """The requirements of a file of `Requires-Dist: ...` lines (`#` lines
    are comments)."""
    with open(path) as f:
        lines = [line.strip() for line in f]
    reqs = [line.split(":", 1)[1].strip() for line in lines if line.startswith("Requires-Dist:")]
    if not reqs:
        raise SystemExit(f"vllm-wheel-deps: {path} has no Requires-Dist: lines")
    return reqs


def substitute(requirement, available):
    """`NAME==CHOSEN` for an exact pin the index lacks, or None (see the
    module's doc)."""
    req = Requirement(requirement)
    pins = [s for s in req.specifier if s.operator == "=="]
    if len(pins) != 1 or "*" in pins[0].version or len(req.specifier) != 1:
        return None
    wanted = Version(pins[0].version)
    finals = []
    for text in available:
        try:
            v = Version(text.strip())
        except InvalidVersion:
            continue
        if not v.is_prerelease and not v.is_devrelease:
            finals.append(v)
    same_minor = [v for v in finals if v.release[:2] == wanted.release[:2]]
    if same_minor:
        chosen = max(same_minor)
    else:
        newer = [v for v in finals if v > wanted]
        if not newer:
            return None
        chosen = min(newer)
    return f"{req.name}=={chosen}"


def main(argv):
    if len(argv) >= 3 and argv[1] == "substitute":
        chosen = substitute(argv[2], argv[3:])
        if chosen is None:
            return 1
        print(chosen)
        return 0
    if len(argv) == 3 and argv[1] == "--requires":
        lines = stored_requirements(argv[2])
    elif len(argv) == 2 and not argv[1].startswith("-"):
        lines = requirements(argv[1])
    else:
        print(__doc__.split("\n\n")[1], file=sys.stderr)
        return 2
    seen = set()
    for line in lines:
        req = Requirement(line)
        if req.marker is not None and not req.marker.evaluate({"extra": ""}):
            continue  # another platform's, or an extra's
        name = canonical(req.name)
        extras = f"[{','.join(sorted(req.extras))}]" if req.extras else ""
        plain = f"{req.name}{extras}{req.specifier}"
        why = next((w for pattern, w in SKIP if re.fullmatch(pattern, name)), None)
        if name == "torch":
            print(f"torch {plain}")
        elif why is not None:
            print(f"skip {plain} ({why})", file=sys.stderr)
        elif name in NO_DEPS:
            print(f"nodeps {plain}")
        else:
            print(f"dep {plain}")
        seen.add(name)
    for name in ALWAYS:
        if name not in seen:
            print(f"dep {name}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
