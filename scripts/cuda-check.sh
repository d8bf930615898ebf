#!/usr/bin/env bash
# The CUDA checks, in one call of at most 580 s on a fresh machine with an NVIDIA GPU and no
# Rust toolchain.
#
#   scripts/cuda-check.sh build     # here: the CUDA test binaries and the bench into device-bin/
#                                   # (git-ignored), stripped and gzipped (46 MB on 2026-12-03,
#                                   # 183 MB unpacked; the carry limit is 64 MiB), with
#                                   # mamba_ssm's Python source and ../shared/tools/peer_gpu.py
#                                   # for the peers when MAMBA_GIT names a git directory of
#                                   # state-spaces/mamba
#   scripts/cuda-check.sh run       # there, from the repository root, device-bin/ carried:
#                                   # every step below, the log and summary.json into $OUT
#   scripts/cuda-check.sh dry-run   # here: `run` with stand-in binaries (scripts/cuda_standin.py),
#                                   # the summary printed; checks the script, not the GPU
#
# The steps, each with its time limit (a step that runs over is cut and reported TIMED OUT;
# the rest go on). Each new CubeCL process compiles every kernel it launches once, and the
# figures of 2026-12-04 on an H200 (gpu-notes) were ~95 s before the first step of one
# layer's SSD, mostly NVRTC and matmul autotune. The crate now keeps compiled kernels (PTX) and
# autotune results on disk (`cubecl_setup`) and the scan's products use one fixed kernel, so
# only the first process pays for its kernels; every later one reads them from the cache
# shared by the whole run.
#
#   step                                                        limit   expected
#   1. cold start: one 130m training step (bf16, 8 x 2,048),      100 s    30-90 s
#      empty caches, then the same process again, warm            20 s     5-15 s
#   2. correctness, two processes at once (the lib's fused-scan   120 s    60-100 s
#      tests; the suite's golden cases and path tests on Cuda)
#   3. one 130m layer's SSD, both paths, the fused one with its    45 s     20-40 s
#      intra-chunk products tiled and transient, f32; the same    55 s     25-45 s
#      and the tensor-core tiles, bf16
#   4. the 130m LM, both paths, all three variants, bf16,          90 s     50-80 s
#      8 x 2,048
#      the 130m LM in mixed precision (f32 weights and AdamW      40 s     20-35 s
#      state, bf16 compute: train_lm's GPU recipe), batch 8
#      the 130m LM decoding (the tensor step, greedy), bf16,      30 s     15-25 s
#      batch 1 and 32
#   5. the peers: mamba_ssm's SSD and LM (peer_gpu.py)             80 s     50-75 s
#
# Together 580 s at most (CUDA_CHECK_BUDGET: a step gets what is left when less than its
# limit); a device call of 600 s holds it. The log goes to $OUT/cuda-check.log as it runs; the bench's and the peers' JSON lines
# and each step's status go to $OUT/summary.json at the end (scripts/cuda_summary.py).
set -euo pipefail
cd "$(dirname "$0")/.."
BIN=${CUDA_CHECK_BIN:-device-bin}
BINARIES=(mamba2_burn suite bench)

build() {
    export CUDARC_CUDA_VERSION="${CUDARC_CUDA_VERSION:-13000}"
    mkdir -p "$BIN"
    # the test binaries: cargo prints their paths with --message-format=json
    cargo test --release --features cuda,cuda-tests --no-run --lib --test suite \
        --message-format=json 2>/dev/null \
        | grep -o '"executable":"[^"]*"' | cut -d'"' -f4 \
        | while read -r exe; do
            name=$(basename "$exe" | sed 's/-[0-9a-f]*$//')
            cp "$exe" "$BIN/$name"
        done
    cargo build --release --features cuda --example bench
    cp target/release/examples/bench "$BIN/"
    for b in "${BINARIES[@]}"; do
        strip "$BIN/$b"
        gzip -9 -f "$BIN/$b"
    done
    if [ -n "${MAMBA_GIT:-}" ]; then
        # peer_gpu.py's mamba_ssm: its Python source, with an empty package __init__ (the
        # real one imports CUDA extensions that are not built there)
        rm -rf "$BIN/peer"
        mkdir -p "$BIN/peer"
        git --git-dir="$MAMBA_GIT" archive HEAD mamba_ssm | tar -x -C "$BIN/peer"
        : >"$BIN/peer/mamba_ssm/__init__.py"
        # the peers' script travels with them: ../shared is not carried
        cp ../shared/tools/peer_gpu.py "$BIN/peer/"
    fi
    ls -la "$BIN"
    du -sh "$BIN"
}

# step LIMIT NAME COMMAND...: COMMAND for at most LIMIT seconds (less when the budget has
# less left); its output into the log and into $work/NAME.out; its status into $work/steps.
step() {
    local limit=$1 name=$2
    shift 2
    local left=$((deadline - SECONDS))
    echo "== $name (limit ${limit} s)"
    if ((left < 10)); then
        echo "SKIPPED (the budget is spent): $name"
        echo "$name skipped 0" >>"$work/steps"
        return 0
    fi
    ((limit > left)) && limit=$left
    local start=$SECONDS status=0 result=passed
    timeout --signal=INT --kill-after=5 "$limit" "$@" >"$work/$name.out" 2>&1 || status=$?
    cat "$work/$name.out"
    if ((status == 124 || status == 137)); then
        result=timed_out
        echo "TIMED OUT after ${limit} s: $name"
    elif ((status != 0)); then
        result=failed
        echo "FAILED (exit $status): $name"
    fi
    echo "$name $result $((SECONDS - start))" >>"$work/steps"
    echo "-- $name: $result in $((SECONDS - start)) s"
}

run() {
    out=${OUT:-$BIN}
    mkdir -p "$out"
    log="$out/cuda-check.log"
    work=$(mktemp -d)
    : >"$work/steps"
    deadline=$((SECONDS + ${CUDA_CHECK_BUDGET:-580}))
    # what the H200 machine needed (gpu-notes): NVRTC's headers and the CUDA libraries
    export CUDA_PATH=${CUDA_PATH:-/usr/local/cuda}
    export LD_LIBRARY_PATH=${LD_LIBRARY_PATH:-/usr/local/cuda/lib64:/usr/local/cuda/targets/x86_64-linux/lib}
    export MAMBA2_REFERENCE_DIR=tests/fixtures/reference
    for b in "${BINARIES[@]}"; do
        [ -e "$BIN/$b.gz" ] && gunzip -f "$BIN/$b.gz"
        chmod +x "$BIN/$b"
    done
    local bench=("$BIN/bench" --device cuda)
    local lm=(--preset 130m --dtype bf16)
    # one cache for the whole run; the first step starts it empty
    local cache="$work/cubecl-cache"
    export MAMBA2_BURN_CUBECL_CACHE=$cache
    {
        date -u
        nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv || true
        # 1. the first training step of a fresh process, caches empty, then warm
        step 100 cold_start "${bench[@]}" "${lm[@]}" --batch 8 --mode train --iters 1 \
            --ssd measured --count-kernels
        step 20 warm_start "${bench[@]}" "${lm[@]}" --batch 8 --mode train --iters 1 \
            --ssd measured --count-kernels
        # 2. correctness: the fused scan against the tensor operations and past 2^32 elements
        # (the library's tests), the golden cases and the path tests (the suite's), two
        # processes at once (their kernels compile on separate cores)
        step 120 tests_lib "$BIN/mamba2_burn" cuda --ignored --nocapture &
        local lib_pid=$!
        step 120 tests_suite "$BIN/suite" cuda --ignored --nocapture
        wait "$lib_pid" || true
        # 3. one 130m layer's SSD (batch 8): the cost model, then forward and forward plus
        # backward on both paths, the fused one with each variant of its intra-chunk products
        # (ScanProducts; the tensor-core tiles in bf16 only: f32 operands have none)
        step 45 ssd_f32 "${bench[@]}" --preset 130m --batch 8 --dtype f32 \
            --ssd fused,tensor-ops --scan-products tiled,transient \
            --mode ssd-cost,ssd,ssd-train --iters 5
        step 55 ssd_bf16 "${bench[@]}" --preset 130m --batch 8 --dtype bf16 \
            --ssd fused,tensor-ops --scan-products tiled,transient,tensor-cores \
            --mode ssd-cost,ssd,ssd-train --iters 5
        # 4. the 130m LM, training and forward, both paths and every variant, bf16, batch 8
        step 90 lm_bf16 "${bench[@]}" "${lm[@]}" --batch 8 --ssd fused,tensor-ops \
            --scan-products tiled,transient,tensor-cores --mode train,forward --iters 3
        # the same LM trained as train_lm trains it on a GPU: f32 weights, bf16 compute
        step 40 lm_mixed "${bench[@]}" --preset 130m --dtype f32 --mixed-precision bf16 \
            --batch 8 --ssd measured --mode train --iters 3
        # decoding with the tensor step: per-token latency at batch 1, throughput at 32
        step 30 decode "${bench[@]}" "${lm[@]}" --batch 1,32 --mode decode --iters 3
        # 5. the peers on the same machine in the same call
        if [ -d "$BIN/peer/mamba_ssm" ] && command -v python3 >/dev/null; then
            local peer
            peer=$(cd "$BIN/peer" && pwd)
            step 80 peers env PEER_PY="$peer" python3 "${PEER_TOOL:-$peer/peer_gpu.py}" \
                --parts ssd,lm-mamba_ssm --dtypes bf16 --batches 1,8 --iters 5
        else
            echo "== peers: SKIPPED (no $BIN/peer/mamba_ssm or no python3)"
            echo "peers skipped 0" >>"$work/steps"
        fi
        date -u
    } 2>&1 | tee "$log"
    python3 scripts/cuda_summary.py "$work" >"$out/summary.json" \
        || echo '{"error": "the summary failed"}' >"$out/summary.json"
    cat "$out/summary.json"
}

case "${1:-}" in
build) build ;;
run) run ;;
dry-run)
    # the same run with stand-ins: a bench and test binaries that print what the real ones
    # print (canned lines in their formats) after a short sleep, and a peer tool likewise
    dir=$(mktemp -d)
    for b in "${BINARIES[@]}"; do
        ln -s "$PWD/scripts/cuda_standin.py" "$dir/$b"
    done
    mkdir -p "$dir/peer/mamba_ssm"
    CUDA_CHECK_BIN=$dir PEER_TOOL="$PWD/scripts/cuda_standin.py" OUT=${OUT:-$dir/out} \
        "$0" run
    ;;
*)
    echo "usage: $0 build|run|dry-run" >&2
    exit 2
    ;;
esac
