#!/usr/bin/env bash
# A CUDA toolkit without a GPU or a driver, from PyPI's wheels, laid out as cubecl-cuda expects
# it at CUDA_PATH: include/ (cuda_runtime.h, cuda_fp16.h, cuda_bf16.h, mma.h; crt/ from the
# nvcc wheel), include/cccl (libcu++: cuda/pipeline, cuda/barrier, cuda/ptx; cubecl-cuda adds it
# as a second include path where it exists), lib64/ (libnvrtc), bin/ (ptxas, nvdisasm).
#
#   scripts/cuda-toolkit.sh DIR     # then CUDA_PATH=DIR LD_LIBRARY_PATH=DIR/lib64
#
# NVRTC, ptxas and the headers are CUDA 12.9's (one release, as a user's toolkit is); nvdisasm
# comes only as CUDA 13 wheels, which read sm_80 and sm_90 cubins alike. About 160 MB to
# download (pip's cache keeps them), 350 MB unpacked, under DIR/wheels.
set -euo pipefail
root=$1
venv=$root/wheels
[ -x "$venv/bin/python" ] || python3 -m venv "$venv"
"$venv/bin/pip" install -q --disable-pip-version-check --no-deps \
    nvidia-cuda-nvrtc-cu12==12.9.86 nvidia-cuda-nvcc-cu12==12.9.86 \
    nvidia-cuda-runtime-cu12==12.9.79 nvidia-cuda-cccl-cu12==12.9.27 \
    nvidia-cuda-nvdisasm==13.5.37
site=$("$venv/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
nv=$site/nvidia
rm -rf "$root/include" "$root/lib64" "$root/bin"
mkdir -p "$root/include" "$root/lib64" "$root/bin"
for f in "$nv"/cuda_runtime/include/* "$nv"/cuda_nvcc/include/* "$nv"/cuda_nvrtc/include/*; do
    ln -s "$f" "$root/include/"
done
ln -s "$nv/cuda_cccl/include" "$root/include/cccl"
for f in "$nv"/cuda_nvrtc/lib/* "$nv"/cuda_runtime/lib/*; do ln -s "$f" "$root/lib64/"; done
ln -sf libnvrtc.so.12 "$root/lib64/libnvrtc.so"
ln -s "$nv/cuda_nvcc/bin/ptxas" "$root/bin/ptxas"
nvdisasm=$(find "$nv" -name nvdisasm -type f | head -1)
[ -n "$nvdisasm" ] && ln -s "$nvdisasm" "$root/bin/nvdisasm"
"$root/bin/ptxas" --version | tail -1
