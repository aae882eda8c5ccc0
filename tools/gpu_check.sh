#!/usr/bin/env bash
# Check modeldsl on a machine with an NVIDIA GPU, in one command, from the repository's root:
#
#   bash tools/gpu_check.sh                  # install, build the kernels, GPU tests, benchmark
#   OUT=/tmp/check bash tools/gpu_check.sh   # the same, results into /tmp/check (default: out/gpu_check)
#   bash tools/gpu_check.sh install          # only the install step
#   bash tools/gpu_check.sh fetch-wheels     # on a machine with internet access: wheels for one without
#
# It needs the NVIDIA driver, the CUDA toolkit's nvcc (12.0 or newer: on the PATH, or MDSL_NVCC or
# CUDA_HOME) and Python 3.11 or newer with pip; run it inside a virtualenv. The steps:
#
#   1. nvidia-smi      the GPU and driver (nvidia-smi.txt)
#   2. install         pip install -e '.[cuda,test]' (install.log); where a .whl/ folder exists, its
#                      wheels instead, with no network (see fetch-wheels below)
#   3. build-kernels   mdsl-build-kernels: every CUDA kernel for sm_80 and sm_90a, cached (build.log)
#   4. pytest-gpu      python -m pytest -m gpu tests/gpu (pytest_gpu.log, pytest_gpu.xml)
#   5. bench           python -m modeldsl.tools.bench: training-step tokens/s and peak memory of modeldsl
#                      against transformers eager and torch.compile, 5 timed steps per row (bench.log,
#                      bench.json)
#
# Each step's output goes to its log under $OUT; results.json there holds each step's exit status and
# seconds and the benchmark's rows. A failing step is recorded and the later ones still run; the
# script exits with the first failure's status. The whole check stops after GPU_CHECK_LIMIT_S seconds
# (default 840, 14 minutes): a step still running then is stopped and recorded with exit status 124,
# and the steps after it are not run.
#
# A GPU machine without internet access: on a machine with it, `bash tools/gpu_check.sh fetch-wheels`
# downloads into .whl/ the wheels of the packages such a machine usually lacks (xdsl, lark,
# cuda-python, nvmath-python, the cuDNN frontend, filecheck, lit; for Python $WHEEL_PYTHON, default
# 3.12, on x86-64 Linux). Copy the repository with .whl/ over; there the install step puts those
# wheels into /tmp/site and expects PyTorch, transformers, numpy, ml_dtypes, safetensors, tokenizers,
# tqdm and CuPy to be installed already.
set -uo pipefail
cd "$(dirname "$0")/.." || exit 1

# the packages an offline GPU machine lacks; versions pinned so one set of wheels installs without a resolver
WHEELS=(xdsl==0.74.0 lark==1.2.2 immutabledict==4.2.1 typing-extensions==4.15.0 ordered-set==4.1.0
        cuda-python==13.0.1 cuda-bindings==13.0.1 cuda-core==0.3.2 cuda-pathfinder==1.2.3
        nvmath-python==0.5.0 nvidia-cudnn-frontend==1.14.0 filecheck==1.0.1 lit==18.1.8)
PYTHON=${PYTHON:-python3}
SITE=/tmp/site  # where the wheels of .whl/ are installed

fetch_wheels() {
    mkdir -p .whl
    mkdir -p .git/info && { grep -qx '/.whl/' .git/info/exclude 2>/dev/null || echo '/.whl/' >> .git/info/exclude; }
    for spec in "${WHEELS[@]}"; do
        "$PYTHON" -m pip download --quiet --no-deps --only-binary=:all: --python-version "${WHEEL_PYTHON:-3.12}" \
            --implementation cp --platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64 \
            --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 --platform manylinux1_x86_64 \
            --platform any -d .whl "$spec" \
            || echo "could not fetch $spec (pin another version above)" >&2
    done
    ls -la .whl
}

carried() {  # whether a .whl/ folder holds wheels to install instead of the network
    compgen -G ".whl/*.whl" > /dev/null
}

install() {
    if carried; then
        "$PYTHON" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target "$SITE" \
            .whl/*.whl || return 1
        "$PYTHON" -m pip install -q --no-deps --no-build-isolation --no-index -e . || return 1
    else
        "$PYTHON" -m pip install -q -e '.[cuda,test]' || return 1
    fi
    "$PYTHON" -c "import modeldsl, xdsl, lark; print('modeldsl imports')"
}

if carried; then
    export PYTHONPATH=$SITE${PYTHONPATH:+:$PYTHONPATH}
    export PATH=$SITE/bin:$PATH
fi
case "${1:-}" in
    fetch-wheels) fetch_wheels; exit $? ;;
    install) install; exit $? ;;
    "") ;;
    *) echo "usage: bash tools/gpu_check.sh [install|fetch-wheels]" >&2; exit 2 ;;
esac

OUT=${OUT:-out/gpu_check}
mkdir -p "$OUT"
STEPS="$OUT/steps.tsv"
: > "$STEPS"
LIMIT=${GPU_CHECK_LIMIT_S:-840}
first_failure=0

step() {  # step NAME LOG COMMAND...: run it within the time left, log it, record its status and time
    local name=$1 log=$2
    shift 2
    local start=$SECONDS left=$((LIMIT - SECONDS)) rc
    echo "== $name: $*" | tee -a "$OUT/gpu_check.log"
    if (( left > 0 )); then
        timeout --kill-after=30 "$left" "$@" > "$OUT/$log" 2>&1
        rc=$?
    else
        echo "not run: the check's $LIMIT s were spent" > "$OUT/$log"
        rc=124
    fi
    printf '%s\t%d\t%d\t%s\n' "$name" "$rc" $((SECONDS - start)) "$log" >> "$STEPS"
    echo "   exit $rc after $((SECONDS - start)) s (log: $log)" | tee -a "$OUT/gpu_check.log"
    if [[ $rc -ne 0 && $first_failure -eq 0 ]]; then first_failure=$rc; fi
    return 0
}

export PYTHONUNBUFFERED=1
step nvidia-smi nvidia-smi.txt nvidia-smi
step install install.log bash tools/gpu_check.sh install
step build-kernels build.log "$PYTHON" -m modeldsl.tools.build_kernels --jobs "$(nproc)"
step pytest-gpu pytest_gpu.log "$PYTHON" -m pytest -m gpu -q -rs tests/gpu --junitxml="$OUT/pytest_gpu.xml"
step bench bench.log "$PYTHON" -m modeldsl.tools.bench --device cuda --recompute annotated,full --fuse on,off \
    --steps 5 --warmup 2 --json "$OUT/bench.json"

"$PYTHON" - "$OUT" <<'EOF'
import json, sys
from pathlib import Path

out = Path(sys.argv[1])
steps = {}
for line in (out / "steps.tsv").read_text().splitlines():
    name, rc, seconds, log = line.split("\t")
    steps[name] = {"exit": int(rc), "seconds": int(seconds), "log": log}
bench = out / "bench.json"
result = {"steps": steps, "bench": json.loads(bench.read_text()) if bench.exists() else None}
(out / "results.json").write_text(json.dumps(result, indent=1))
print(json.dumps(steps, indent=1))
EOF
tail -n 30 "$OUT/bench.log" 2>/dev/null
exit $first_failure
