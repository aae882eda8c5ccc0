#!/usr/bin/env bash
# All the GPU work of a session in one call of the device tool:
#
#   bash tools/gpu_check.sh fetch-wheels      # here (with network): the packages the GPU machine lacks -> .whl/
#   run(command="bash tools/gpu_check.sh", carry=[".whl"])   # there: everything below, results under $OUT
#
# On the GPU machine it installs the carried wheels (xdsl, lark, cuda-python, nvmath-python, the
# cuDNN frontend, ...) into /tmp/site, installs modeldsl itself without dependencies, builds the
# CUDA kernels (mdsl-build-kernels), runs the GPU tests (pytest -m gpu) and the training-step
# benchmark (tools/bench.py, modeldsl vs transformers eager vs torch.compile), and writes
# $OUT/results.json (each step's exit status and seconds, the benchmark rows) beside the logs
# (nvidia-smi.txt, install.log, build.log, pytest_gpu.log, bench.log, bench.json). A failing step
# is recorded and the later ones still run; the script exits with the first failure's status.
set -uo pipefail
cd "$(dirname "$0")/.."

# the packages the GPU image lacks (it has torch, transformers, numpy, ml_dtypes, safetensors, tokenizers,
# tqdm and cupy); versions pinned so one set of wheels installs without a resolver
WHEELS=(xdsl==0.74.0 lark==1.2.2 immutabledict==4.2.1 typing-extensions==4.15.0 ordered-set==4.1.0
        cuda-python==13.0.1 cuda-bindings==13.0.1 cuda-core==0.3.2 cuda-pathfinder==1.2.3
        nvmath-python==0.5.0 nvidia-cudnn-frontend==1.14.0 filecheck==1.0.1 lit==18.1.8)

if [[ "${1:-}" == "fetch-wheels" ]]; then
    mkdir -p .whl
    mkdir -p .git/info && { grep -qx '/.whl/' .git/info/exclude 2>/dev/null || echo '/.whl/' >> .git/info/exclude; }
    for spec in "${WHEELS[@]}"; do
        python3 -m pip download --quiet --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
            --platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64 --platform manylinux_2_17_x86_64 \
            --platform manylinux2014_x86_64 --platform manylinux1_x86_64 --platform any -d .whl "$spec" \
            || echo "could not fetch $spec (pin another version above)" >&2
    done
    ls -la .whl
    exit 0
fi

OUT=${OUT:-out/gpu_check}
mkdir -p "$OUT"
PYTHON=${PYTHON:-python3}
STEPS="$OUT/steps.tsv"
: > "$STEPS"
first_failure=0

step() {  # step NAME LOG COMMAND...: run it, log it, record its status and time
    local name=$1 log=$2
    shift 2
    local start=$SECONDS
    echo "== $name: $*" | tee -a "$OUT/gpu_check.log"
    "$@" > "$OUT/$log" 2>&1
    local rc=$?
    printf '%s\t%d\t%d\t%s\n' "$name" "$rc" $((SECONDS - start)) "$log" >> "$STEPS"
    echo "   exit $rc after $((SECONDS - start)) s (log: $log)" | tee -a "$OUT/gpu_check.log"
    if [[ $rc -ne 0 && $first_failure -eq 0 ]]; then first_failure=$rc; fi
    return 0
}

install() {
    if compgen -G ".whl/*.whl" > /dev/null; then
        "$PYTHON" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site \
            .whl/*.whl || return 1
    fi
    "$PYTHON" -m pip install -q --no-deps --no-build-isolation --no-index -e . || return 1
    "$PYTHON" -c "import modeldsl, xdsl, lark; print('modeldsl imports')"
}

export PYTHONPATH=/tmp/site${PYTHONPATH:+:$PYTHONPATH}
export PATH=/tmp/site/bin:$PATH
export PYTHONUNBUFFERED=1
step nvidia-smi nvidia-smi.txt nvidia-smi
step install install.log install
step build-kernels build.log "$PYTHON" -m modeldsl.tools.build_kernels --jobs 16
step pytest-gpu pytest_gpu.log "$PYTHON" -m pytest -m gpu -q -rs tests/gpu --junitxml="$OUT/pytest_gpu.xml"
step bench bench.log "$PYTHON" -m modeldsl.tools.bench --device cuda --recompute annotated,full --fuse on,off --json "$OUT/bench.json"

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
