#!/usr/bin/env bash
# CUDA checks for a machine with an NVIDIA GPU but no Rust toolchain.
#
#   scripts/cuda-check.sh build   # here: builds the CUDA test binaries and examples into
#                                 # device-bin/ (git-ignored), stripped and gzipped (about 42 MB;
#                                 # 166 MB unpacked, over a 64 MiB carry)
#   scripts/cuda-check.sh run     # on the GPU machine, from the repository root, with
#                                 # device-bin/ carried over: the golden reference cases and the
#                                 # path tests on Burn's Cuda backend, a short training run, and
#                                 # the mamba2-130m bench (train and forward tokens/s) with the
#                                 # fused SSD kernels and with the tensor operations
#
# `run` prints everything to stdout and writes it to device-bin/cuda-check.log (and to $OUT when
# that is set).
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
    log="$BIN/cuda-check.log"
    for gz in "$BIN"/*.gz; do
        [ -e "$gz" ] && gunzip -f "$gz"
    done
    chmod +x "$BIN"/mamba2_burn "$BIN"/suite "$BIN"/bench "$BIN"/train
    {
        date -u
        nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv || true
        export MAMBA2_REFERENCE_DIR=tests/fixtures/reference
        echo "== the fused SSD kernels against the tensor operations on Cuda"
        time "$BIN/mamba2_burn" fused_matches_tensor_ops_on_cuda --ignored --nocapture \
            || echo "FAILED: fused kernels"
        echo "== the fused scan past 2^32 elements (64-bit indices; about 40 GB)"
        time "$BIN/mamba2_burn" indices_past_u32_read_the_right_elements_on_cuda --ignored \
            --nocapture || echo "FAILED: indices past 2^32"
        echo "== reference cases on Cuda"
        time "$BIN/suite" reference::cuda --ignored --nocapture || echo "FAILED: reference"
        echo "== path tests on Cuda"
        time "$BIN/suite" paths::cuda:: --ignored --nocapture || echo "FAILED: paths"
        echo "== training run (MQAR, 1 epoch) on Cuda"
        time "$BIN/train" --device cuda --epochs 1 --artifacts "$BIN/run" || echo "FAILED: train"
        echo "== mamba2-130m bench on Cuda: the fused SSD kernels, then the tensor operations"
        for ssd in fused tensor-ops; do
            "$BIN/bench" --device cuda --preset 130m --ssd "$ssd" --mode train,forward --iters 5 \
                || echo "FAILED: bench --ssd $ssd"
        done
        echo "== the same shape, backbone only"
        "$BIN/bench" --device cuda --preset 130m --vocab 0 --mode train,forward --iters 5 \
            || echo "FAILED: bench"
        echo "== one 130m layer's SSD (batch 8): the cost model's estimate, then measured,"
        echo "   forward and forward plus backward, the fused kernels then the tensor operations"
        for dtype in f32 bf16; do
            "$BIN/bench" --device cuda --preset 130m --batch 8 --dtype "$dtype" \
                --mode ssd-cost --iters 1 | grep -E '"summary"' \
                || echo "FAILED: bench ssd-cost $dtype"
            for ssd in fused tensor-ops; do
                "$BIN/bench" --device cuda --preset 130m --batch 8 --dtype "$dtype" \
                    --ssd "$ssd" --mode ssd,ssd-train --iters 3 \
                    | grep -E '"mode":"ssd(-train)?"' \
                    || echo "FAILED: bench ssd $dtype --ssd $ssd"
            done
        done
        echo "== mamba2-130m bench on Cuda in bf16 (the SSD's decays and states in f32)"
        "$BIN/bench" --device cuda --preset 130m --dtype bf16 --mode train,forward --iters 5 \
            || echo "FAILED: bench"
    } 2>&1 | tee "$log"
    if [ -n "${OUT:-}" ]; then cp "$log" "$OUT/"; fi
    ;;
*)
    echo "usage: $0 build|run" >&2
    exit 2
    ;;
esac
