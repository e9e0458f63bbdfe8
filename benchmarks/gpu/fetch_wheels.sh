#!/usr/bin/env bash
# Download the wheels of benchmarks/gpu/wheels.txt for the GPU machine (CPython 3.12, x86-64 manylinux) into .whl/
# at the repository root, replacing what is there. run.sh installs them when .whl/ exists; a device call carries it
# with carry=[".whl"]. .whl/ is ignored through .git/info/exclude (added here if missing).
#
#   bash benchmarks/gpu/fetch_wheels.sh          # env: PYTHON (default python3)
set -euo pipefail
cd "$(dirname "$0")/../.."
PY="${PYTHON:-python3}"
grep -qxF '/.whl/' .git/info/exclude 2>/dev/null || echo '/.whl/' >> .git/info/exclude
rm -rf .whl
mkdir -p .whl
PLATFORMS=()
for p in manylinux_2_28_x86_64 manylinux_2_27_x86_64 manylinux_2_24_x86_64 manylinux_2_17_x86_64 \
         manylinux2014_x86_64 manylinux1_x86_64; do
    PLATFORMS+=(--platform "$p")
done
# the local pip constraints (a cap on torch here) are no concern of these wheels
PIP_CONSTRAINT= "$PY" -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
    "${PLATFORMS[@]}" -d .whl -r benchmarks/gpu/wheels.txt
# one version of each distribution, every pinned one present, and every Requires-Dist met by the set or by the
# image (its package list: /work/.library/device/KINDS.md, "Python packages already there")
"$PY" - <<'PY'
import re, sys, zipfile
from email.parser import Parser
from pathlib import Path

from packaging.requirements import Requirement

IMAGE = set("""accelerate anyio attrs certifi charset-normalizer click einops filelock fsspec h11 hf-xet httpcore httpx
huggingface-hub hypothesis idna jinja2 markupsafe numpy packaging pyyaml regex requests safetensors sentencepiece
tiktoken tokenizers torch tqdm transformers triton typing-extensions urllib3 annotated-doc""".split())
norm = lambda s: re.sub(r"[-_.]+", "-", s).lower()
env = {"python_version": "3.12", "python_full_version": "3.12.3", "sys_platform": "linux", "platform_system": "Linux",
       "platform_machine": "x86_64", "os_name": "posix", "implementation_name": "cpython", "extra": ""}
wanted = {}
for line in Path("benchmarks/gpu/wheels.txt").read_text().splitlines():
    line = line.split("#")[0].strip()
    if line:
        name, version = line.split("==")
        wanted[norm(name)] = version
have, bad = {}, []
for whl in sorted(Path(".whl").glob("*.whl")):
    name, version = whl.name.split("-")[:2]
    have.setdefault(norm(name), []).append((version, whl))
bad += [f"{n}: {[v for v, _ in vs]}" for n, vs in have.items() if len(vs) != 1 or n not in wanted]
bad += [f"{n}=={v} missing" for n, v in wanted.items() if n not in have]
for n, [(version, whl)] in ((n, vs) for n, vs in have.items() if len(vs) == 1):
    with zipfile.ZipFile(whl) as z:
        meta = next(f for f in z.namelist() if f.endswith(".dist-info/METADATA"))
        for spec in Parser().parsestr(z.read(meta).decode()).get_all("Requires-Dist") or []:
            req = Requirement(spec)
            if req.marker is not None and not req.marker.evaluate(env):
                continue  # an extra, or another platform
            dep = norm(req.name)
            if dep in have:
                if not req.specifier.contains(have[dep][0][0], prereleases=True):
                    bad.append(f"{n} needs {spec}, the set has {have[dep][0][0]}")
            elif dep not in IMAGE:
                bad.append(f"{n} needs {spec}: neither in the set nor in the image")
size = sum(w.stat().st_size for w in Path(".whl").glob("*.whl"))
print(f"{sum(map(len, have.values()))} wheels, {size / 2**20:.1f} MiB in .whl/")
if bad:
    sys.exit("wheel set is wrong: " + "; ".join(bad))
PY
