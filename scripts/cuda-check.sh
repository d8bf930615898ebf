#!/usr/bin/env bash
# CUDA checks for a machine with an NVIDIA GPU but no Rust toolchain.
#
#   scripts/cuda-check.sh build   # here: builds the CUDA test binaries and examples into
#                                 # device-bin/ (git-ignored), stripped and gzipped (46 MB
#                                 # on 2026-12-03; 183 MB unpacked, over a 64 MiB carry)
#   scripts/cuda-check.sh run     # on the GPU machine, from the repository root, with
#                                 # device-bin/ carried over: the fused SSD kernels against the
#                                 # tensor operations, one 130m layer's SSD on both paths beside
#                                 # the cost model, the mamba2-130m bench (train and forward
#                                 # tokens/s) on both paths, the golden reference cases and the
#                                 # path tests on Burn's Cuda backend, the test past 2^32
#                                 # elements and a short training run
#
# `run` prints everything to stdout and writes it to cuda-check.log in $OUT where that is set
# (else in device-bin/), as it goes.
set -euo pipefail
cd "$(dirname "$0")/.."
BIN=device-bin

case "${1:-}" in
build)
    export CUDARC_CUDA_VERSION="${CUDARC_CUDA_VERSION:-13000}"
    mkdir -p "$BIN"
    # the test binaries: cargo prints their paths with --message-format=json
    cargo test --release --features cuda --no-run --lib --test suite \
        --message-format=json 2>/dev/null \
        | grep -o '"executable":"[^"]*"' | cut -d'"' -f4 \
        | while read -r exe; do
            name=$(basename "$exe" | sed 's/-[0-9a-f]*$//')
            cp "$exe" "$BIN/$name"
        done
    cargo build --release --features cuda --example bench --example train
    cp target/release/examples/bench target/release/examples/train "$BIN/"
    strip "$BIN"/mamba2_burn "$BIN"/suite "$BIN"/bench "$BIN"/train
    gzip -9 -f "$BIN"/mamba2_burn "$BIN"/suite "$BIN"/bench "$BIN"/train
    ls -la "$BIN"
    du -sh "$BIN"
    ;;
run)
    # Every step has a time limit and the whole run a budget (CUDA_CHECK_BUDGET seconds, 400 by
    # default: the device call's limit is 420), so that a slow step (a first autotune, a JIT
    # compile) costs its own result only. The most telling steps come first; the log is
    # written as it goes, into $OUT where that is set, so a run cut short still brings back
    # what it had.
    log="${OUT:-$BIN}/cuda-check.log"
    deadline=$((SECONDS + ${CUDA_CHECK_BUDGET:-400}))
    # step LIMIT TITLE COMMAND...: runs COMMAND for at most LIMIT seconds (less when the
    # budget has less left), says when it failed, timed out or was skipped
    step() {
        local limit=$1 title=$2
        shift 2
        local left=$((deadline - SECONDS))
        echo "== $title"
        if ((left < 15)); then
            echo "SKIPPED (the budget is spent): $title"
            return 0
        fi
        ((limit > left)) && limit=$left
        local start=$SECONDS status=0
        timeout --signal=INT --kill-after=5 "$limit" "$@" || status=$?
        if ((status == 124 || status == 137)); then
            echo "TIMED OUT after ${limit} s: $title"
        elif ((status != 0)); then
            echo "FAILED (exit $status): $title"
        fi
        echo "-- $((SECONDS - start)) s"
    }
    for gz in "$BIN"/*.gz; do
        [ -e "$gz" ] && gunzip -f "$gz"
    done
    chmod +x "$BIN"/mamba2_burn "$BIN"/suite "$BIN"/bench "$BIN"/train
    export MAMBA2_REFERENCE_DIR=tests/fixtures/reference
    # the tests on few autotune candidates: their shapes are many and small
    tests=(env CUBECL_AUTOTUNE_LEVEL=minimal)
    bench=("$BIN/bench" --device cuda)
    {
        date -u
        nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv || true
        step 90 "the fused SSD kernels against the tensor operations on Cuda" \
            "${tests[@]}" "$BIN/mamba2_burn" fused_matches_tensor_ops_on_cuda --ignored --nocapture
        # one 130m layer's SSD (batch 8): the cost model's estimate, then measured, forward
        # and forward plus backward, the fused kernels then the tensor operations; each line
        # with the achieved TFLOP/s and TB/s beside the model's
        for dtype in f32 bf16; do
            step 10 "the cost model at one 130m layer, $dtype" \
                bash -c "'$BIN/bench' --preset 130m --batch 8 --dtype $dtype --mode ssd-cost | grep summary"
            for ssd in fused tensor-ops; do
                step 45 "one 130m layer's SSD, $dtype, --ssd $ssd" \
                    "${bench[@]}" --preset 130m --batch 8 --dtype "$dtype" --ssd "$ssd" \
                    --mode ssd,ssd-train --iters 3
            done
        done
        for ssd in fused tensor-ops; do
            step 45 "mamba2-130m training and forward, f32, --ssd $ssd" \
                "${bench[@]}" --preset 130m --ssd "$ssd" --mode train,forward --iters 3
        done
        for ssd in fused tensor-ops; do
            step 45 "mamba2-130m training and forward, bf16, --ssd $ssd" \
                "${bench[@]}" --preset 130m --dtype bf16 --ssd "$ssd" --mode train,forward --iters 3
        done
        step 60 "reference cases on Cuda" \
            "${tests[@]}" "$BIN/suite" reference::cuda --ignored --nocapture
        step 90 "path tests on Cuda" \
            "${tests[@]}" "$BIN/suite" paths::cuda:: --ignored --nocapture
        step 60 "the fused scan past 2^32 elements (64-bit indices; about 40 GB)" \
            "${tests[@]}" "$BIN/mamba2_burn" indices_past_u32_read_the_right_elements_on_cuda --ignored \
            --nocapture
        step 60 "training run (MQAR, 1 epoch) on Cuda" \
            "$BIN/train" --device cuda --epochs 1 --artifacts "$BIN/run"
        date -u
    } 2>&1 | tee "$log"
    ;;
*)
    echo "usage: $0 build|run" >&2
    exit 2
    ;;
esac
