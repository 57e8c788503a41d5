#!/usr/bin/env bash
# One device call of the GPU check (docs/gpu.md): bash tests/device/run.sh PART [more gpu_check.py arguments]
# PART: core (carries .devpack/site.tar.xz and .devpack/fix-core; also the real-size set), v2, v2pro, v2proplus
# (each carries .devpack/fix-PART and finds the site the core call unpacked on the same warm machine).
set -u -o pipefail
part=${1:?usage: run.sh core|v2|v2pro|v2proplus [gpu_check.py arguments]}; shift
cd "$(dirname "$0")/../.." || exit 3
out=${OUT:-gpu-check-out}; mkdir -p "$out"
if [ -f .devpack/site.tar.xz ]; then
  rm -rf .devsite && mkdir .devsite && tar -xJf .devpack/site.tar.xz -C .devsite || { echo "cannot unpack the site"; exit 3; }
fi
if [ ! -d .devsite/mlx ]; then
  echo "no .devsite here: this call carries no .devpack/site.tar.xz and the machine is not the warm one the core"
  echo "call unpacked it on (a machine goes back 30 s after a call). Run the core call again, then this one."
  exit 3
fi
# MLX's library finds the CUDA libraries at $ORIGIN/../../nvidia/*/lib (its RPATH): the image's torch has them
nv=$(python3 -c 'import nvidia; print(list(nvidia.__path__)[0])' 2>/dev/null)
if [ -n "$nv" ]; then
  ln -sfn "$nv" .devsite/nvidia
  export LD_LIBRARY_PATH="$(printf '%s:' "$nv"/*/lib)${LD_LIBRARY_PATH:-}"
else
  echo "warning: no nvidia package in the image's python3: MLX may not find the CUDA libraries"
fi
[ -d /usr/local/cuda ] && export CUDA_HOME=${CUDA_HOME:-/usr/local/cuda}
[ -d ".devpack/fix-$part" ] || { echo "no .devpack/fix-$part: name it in carry"; exit 3; }
export PYTHONPATH="$PWD/.devsite:$PWD" NLTK_DATA="$PWD/.devsite/nltk_data" \
  PRIMESPEECH_TEXT_DATA="$PWD/.devsite/text-data" PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,driver_version,memory.used,memory.total,clocks.sm --format=csv > "$out/nvidia-smi.csv" 2>&1
bigset=()
[ "$part" = core ] && bigset=(--bigset)
python3 tests/device/gpu_check.py --part "$part" --device gpu --fixtures ".devpack/fix-$part" --out "$out" \
  "${bigset[@]}" "$@" 2>&1 | tee "$out/log.txt"
