#!/usr/bin/env bash
# The GPU check, in one command, on a machine with a GPU and no network:
#   scripts/gpu_check.sh            (STARPU_TARBALL defaults to vendor/starpu-1.4.10+dfsg.tar.gz)
# Builds StarPU with CUDA from the tarball, builds nntile with CUDA, runs the CUDA kernel
# tests, the GPU model tests, a short GPT-2 training run on the GPU and the GPU benchmark,
# then prints a summary. Logs go to $NNTILE_GPU_LOGS (default build/gpu-check).
# Arguments pick steps (default: build kernels model train bench):
#   build kernels model train bench    the single-GPU checks
#   attention  the fused-attention kernels: tests/cuda/test_flash.py, then bench/attention_op.py
#              (cuDNN, ours and PyTorch's SDPA, bf16 and TF32, head dims 64 and 128)
#   multigpu   wide GPT-2 n_embd $NNTILE_WIDE_EMBD (8192) on 1 GPU, then on every GPU in one process
#   wide-1gpu  only the first of those (the baseline of the mpi step)
#   mpi-small  a small model under mpirun, one rank per GPU (default pml; ob1 if that fails)
#   mpi        the wide model under mpirun, one rank per GPU ($NNTILE_MPI_DISTRIBUTIONS:
#              data tensor; extra mpirun options in $NNTILE_MPIRUN_ARGS)
#   (NNTILE_WIDE_EXTRA: options appended to the wide model's, e.g. "--batch 8 --tile-batch 4")
#   scale      growing n_embd ($NNTILE_SCALE_SIZES) on one GPU until a size fails
#   largest    growing n_embd on every GPU ($NNTILE_LARGEST_SIZES; default on 8 GPUs 30720 32768
#              36864: 48.4B, 54.9B, 69.0B parameters; on fewer 28672 29696 30720: 42.4B, 45.4B,
#              48.4B, what the pre-check admits on 4 H100s and 503 GiB of host memory) until a
#              size fails or the pre-check refuses it
#   depth      the wide model on every GPU with $NNTILE_DEPTHS layers (default 4 8 16), no tile
#              flags, $NNTILE_DEPTH_ARGS (default --batch 16 --precision bf16-mixed), and each
#              depth's tokens/s x layers against the first depth's (throughput per layer)
#   levers     the wide model on one GPU once per variant in $NNTILE_LEVERS (';'-separated
#              options and NAME=value environment, e.g. ";--no-layer-priorities;--sched lws"), each
#              after $NNTILE_LEVER_BASE (e.g. "--batch 8"): out-of-core levers side by side
#   defaults   the wide model with no tile, worker or scheduler flag (nntile.policy's choices)
#              for each EMBDxBATCH of $NNTILE_DEFAULT_CONFIGS (default 8192x4 10240x16: in
#              memory, and 6.07B past an H100's memory), each from fresh StarPU models (its own
#              STARPU_HOME, as on a new machine): step 1 against the later ones. Words
#              NAME=value of $NNTILE_DEFAULTS_ENV are its environment (e.g.
#              STARPU_CALIBRATE_MINIMUM=10, StarPU's own default); $NNTILE_DEFAULTS_ARGS are
#              more options (e.g. "--precision bf16-mixed")
#   offload    past one GPU's memory with no flags: the wide model for each EMBDxBATCHxSTEPS of
#              $NNTILE_OFFLOAD_CONFIGS (default 10240x16x4 12288x8x3 13440x6x3: 6.07B, 8.50B,
#              10.04B) in each of $NNTILE_OFFLOAD_PRECISIONS (bf16-mixed tf32), from fresh
#              StarPU models, then DeepSpeed ZeRO-3 offload on the first (bench/deepspeed_ref.py)
#   compare    ours vs PyTorch eager on the wide model ($NNTILE_COMPARE_SIZES)
#   llama      Llama: tests/test_gpu.py's Llama tests; Llama-3.2-1B (batch 8 x 2048) against
#              transformers' LlamaForCausalLM in bf16-mixed and tf32 (compare_torch.py, with
#              our per-op table); Llama-3.1-8B (batch 2 x 2048, bf16-mixed) past the GPU's
#              memory (scale.py); each run limited to $NNTILE_LLAMA_LIMIT s (default 570)
#   node-table ours with defaults beside PyTorch FSDP2, and FSDP2 with activation
#              checkpointing, on every GPU (bench/node_table.py; configurations EMBDxBATCH in
#              $NNTILE_NODE_CONFIGS, default 8192x4,8192x16,16384x4)
#   node-llama the same for Llama: one table per ';'-separated run of $NNTILE_NODE_LLAMA
#              (MODEL:BATCH, default "llama-3.2-1b:16;llama-3.1-8b:4"), sequence 2048, in
#              $NNTILE_NODE_PRECISION (default bf16-mixed); each run limited to
#              $NNTILE_LLAMA_LIMIT s
#   node-capacity which Llama shapes of $NNTILE_NODE_CAPACITY (default
#              llama-3.2-1b,llama-3.2-3b,llama-3.1-8b) each side trains, batch
#              $NNTILE_NODE_CAPACITY_BATCH (default 8) x 2048, 2 steps, and the largest
#   recompute  recomputation of fewer blocks: ours on every GPU with --recompute K for each K of
#              $NNTILE_RECOMPUTE_BLOCKS (default "32 20 12"), $NNTILE_RECOMPUTE_MODEL
#              (llama-3.1-8b) at batch $NNTILE_RECOMPUTE_BATCH (16) x 2048 in bf16-mixed, and
#              FSDP2 with activation checkpointing beside the first (bench/node_table.py)
#   replicas   data parallelism: for each "SHAPE:PRECISION" of $NNTILE_REPLICA_RUNS (';'-separated),
#              the sides of $NNTILE_REPLICA_SIDES (default "one ranks ddp fsdp2"): ours in one
#              process on every GPU (one: a replica per GPU; off: --device-replicas off), ours
#              with one rank per GPU (--distribution replicas, NCCL), PyTorch DDP and FSDP2,
#              each with its steps back to back (--pipeline); tokens/s side by side in
#              replicas.txt
#   mixed      bf16-mixed at scale: the wide model on one GPU against PyTorch autocast
#              (compare_torch.py), on every GPU, ours and FSDP MixedPrecision (fsdp_ref.py),
#              and out of core on one GPU ($NNTILE_OOC_ARGS, default --batch 8: 1.23x an H100),
#              tf32 and bf16-mixed side by side (bytes moved per step in the RESULT lines)
set -uo pipefail
cd "$(dirname "$0")/.."
export STARPU_TARBALL="${STARPU_TARBALL:-$PWD/vendor/starpu-1.4.10+dfsg.tar.gz}"
logs="${NNTILE_GPU_LOGS:-build/gpu-check}"
mkdir -p "$logs" build
summary=()
step() {  # step NAME COMMAND...: run, log, remember the outcome
    local name="$1"; shift
    local start=$SECONDS
    echo "=== $name: $*"
    if "$@" >"$logs/$name.log" 2>&1; then
        summary+=("PASS  $name ($((SECONDS - start)) s)")
    else
        summary+=("FAIL  $name ($((SECONDS - start)) s): see $logs/$name.log")
        tail -n 30 "$logs/$name.log"
        return 1
    fi
    tail -n 5 "$logs/$name.log"
}

steps="${*:-build kernels model train bench}"
want() { [[ " $steps " == *" $1 "* ]]; }
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader | tee "$logs/gpu.txt"
# A machine lent for minutes starts bare: the build of one call (StarPU's libraries and
# nntile's extension modules, ~5 MB) can be packed with NNTILE_GPU_EXPORT=DIR and unpacked by
# a later call from $NNTILE_GPU_PREBUILT instead of building again (~2 minutes).
prebuilt="${NNTILE_GPU_PREBUILT:-vendor/gpu-prebuilt.tgz}"
pack_build() {
    local stage prefix
    stage="$(mktemp -d)" prefix="$(cat build/starpu-prefix)"
    mkdir -p "$stage/prefix" "$stage/tree"
    echo "$prefix" > "$stage/prefix-path"
    tar cf - --exclude='*.a' --exclude='*.la' -C "$prefix" . | tar xf - -C "$stage/prefix"
    find nntile -name '*.so' | tar cf - -T - | tar xf - -C "$stage/tree"
    mkdir -p "$1" && tar czf "$1/gpu-prebuilt.tgz" -C "$stage" . && rm -rf "$stage"
}
unpack_build() {
    local stage prefix
    stage="$(mktemp -d)" && tar xzf "$prebuilt" -C "$stage" || return 1
    prefix="$(cat "$stage/prefix-path")"
    mkdir -p "$prefix" && cp -a "$stage/prefix/." "$prefix/" && cp -a "$stage/tree/." . || return 1
    echo "$prefix" > build/starpu-prefix && rm -rf "$stage"
}
# with "build" too, StarPU then comes from the pack and only nntile is built again
if [ ! -f build/starpu-prefix ] && [ -f "$prebuilt" ]; then
    step unpack-build unpack_build || exit 1
fi
if want build || [ ! -f build/starpu-prefix ]; then
    step starpu bash -c 'NNTILE_CUDA=1 scripts/install_starpu.sh | tail -n 1 > build/starpu-prefix' || exit 1
    export NNTILE_STARPU_PREFIX="$(cat build/starpu-prefix)"
    step build env NNTILE_CUDA=1 NNTILE_CUDA_ARCHS="${NNTILE_CUDA_ARCHS:-90}" python3 setup.py build_ext --inplace --force -j "$(nproc)" || exit 1
    [ -n "${NNTILE_GPU_EXPORT:-}" ] && step pack-build pack_build "$NNTILE_GPU_EXPORT"
fi
python3 -c "import nntile; assert nntile.HAVE_CUDA, 'nntile built without CUDA'" || exit 1
export PYTHONUNBUFFERED=1 PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
# NVLink multicast stays off on shared hosts, for every torchrun and NCCL user started here:
# NCCL's, PyTorch's symmetric memory's and NVSHMEM's
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
want kernels && step cuda-kernels python3 -m pytest -q -p no:cacheprovider tests/cuda
want model && step gpu-model python3 -m pytest -q -s -p no:cacheprovider tests/test_gpu.py
want train && step gpu-train python3 -m nntile.train --ncuda 1 --ncpu 1 --steps 300 \
    --batch-size 16 --eval-every 100 --no-progress --overwrite --out build/gpu-train
want bench && step gpu-bench python3 -m pytest -q -s -p no:cacheprovider bench/test_gpt2_gpu.py --benchmark-only
if want attention; then
    step attention-tests python3 -m pytest -q -p no:cacheprovider tests/cuda/test_flash.py
    step attention-bench python3 bench/attention_op.py
    sed -n '/^cuDNN workspace/p; /^cuDNN ran/,$p' "$logs/attention-bench.log"
fi
ngpu=$(python3 -c "from nntile.machine import gpu_memory; print(len(gpu_memory()))")
wide_embd="${NNTILE_WIDE_EMBD:-8192}"
# batch 4 x 1024, two batch tiles (one per data-parallel rank), 4096-wide weight tiles
wide=(--n-layer 4 --batch 4 --steps 3 --ncpu 0 --tile-batch 2 --tile-embd 4096
      --tile-inner 4096 --tile-head 32 --tile-vocab 8192 ${NNTILE_WIDE_EXTRA:-})
run_limit="${NNTILE_RUN_LIMIT:-170}"
if want multigpu || want wide-1gpu; then
    step wide-1gpu timeout "$run_limit" python3 bench/scale.py --n-embd "$wide_embd" --ncuda 1 "${wide[@]}"
    want multigpu && [ "$ngpu" -gt 1 ] && step "wide-${ngpu}gpu" timeout "$run_limit" python3 bench/scale.py \
        --n-embd "$wide_embd" --ncuda "$ngpu" "${wide[@]}"
fi
# --bind-to none: nntile gives each rank on a node its own share of the cores. The watchdog
# prints when no task ends for 10 s: a stall shows in the log, not as silence.
mpi=(mpirun --allow-run-as-root --oversubscribe --bind-to none -x PYTHONUNBUFFERED -x PATH
     -x STARPU_WATCHDOG_TIMEOUT=10000000)
if (want mpi-small || want mpi || want replicas) && [ "$ngpu" -gt 1 ]; then
    # StarPU measures the bus on its first start on a machine and stores it under ~/.starpu;
    # one process does it here, so that ranks starting together do not race on those files
    step bus-calibration python3 -c "import nntile; nntile.Context(ncpu=0).shutdown()"
fi
if want mpi-small && [ "$ngpu" -gt 1 ]; then
    # a small model first tells a stall from slowness in seconds; if it fails, the same again
    # with Open MPI's ob1 layer instead of UCX
    small=(--n-embd 1024 --n-layer 2 --batch 4 --steps 3 --ncpu 0 --ncuda 1 --tile-batch 2
           --tile-embd 512 --tile-inner 2048 --tile-head 4 --tile-vocab 8192 --distribution data)
    step mpi-small timeout 60 "${mpi[@]}" -np "$ngpu" python3 bench/scale.py "${small[@]}" ||
    step mpi-small-ob1 timeout 60 "${mpi[@]}" --mca pml ob1 -np "$ngpu" python3 bench/scale.py \
        "${small[@]}"
fi
if want mpi && [ "$ngpu" -gt 1 ]; then
    for dist in ${NNTILE_MPI_DISTRIBUTIONS:-data tensor}; do
        step "mpi-${ngpu}rank-$dist" timeout "$run_limit" "${mpi[@]}" \
            ${NNTILE_MPIRUN_ARGS:-} -np "$ngpu" python3 \
            bench/scale.py --n-embd "$wide_embd" --ncuda 1 --distribution "$dist" "${wide[@]}"
    done
fi
if want scale; then
    for e in ${NNTILE_SCALE_SIZES:-8192 10240 12288}; do
        step "scale-$e" timeout "$run_limit" python3 bench/scale.py --n-embd "$e" --ncuda 1 \
            "${wide[@]}" ${NNTILE_SCALE_ARGS:-} || break
    done
fi
if want largest; then
    if [ "$ngpu" -ge 8 ]; then largest_sizes="30720 32768 36864"; else largest_sizes="28672 29696 30720"; fi
    for e in ${NNTILE_LARGEST_SIZES:-$largest_sizes}; do
        step "largest-$e" timeout "$run_limit" python3 bench/scale.py --n-embd "$e" \
            --ncuda "$ngpu" "${wide[@]}" || break
    done
fi
if want depth; then
    for layers in ${NNTILE_DEPTHS:-4 8 16}; do
        # no tile or scheduler flag: what a user gets
        step "depth-$layers" timeout "$run_limit" python3 bench/scale.py --n-embd "$wide_embd" \
            --ncuda "$ngpu" --n-layer "$layers" --steps 4 \
            ${NNTILE_DEPTH_ARGS:---batch 16 --precision bf16-mixed}
    done
    for layers in ${NNTILE_DEPTHS:-4 8 16}; do grep -h "^RESULT" "$logs/depth-$layers.log"; done |
        python3 -c '
import json, sys
runs = [json.loads(line.split(" ", 1)[1]) for line in sys.stdin]
for r in runs:
    n, tps = r["n_layer"], r["tokens_per_s"]
    ratio = tps * n / (runs[0]["tokens_per_s"] * runs[0]["n_layer"])
    print("depth %d: %.0f tokens/s, %.1f TFLOP/s, throughput per layer %.3f of the first depth"
          % (n, tps, r["tflops"], ratio))' | tee "$logs/depth.txt"
fi
if want levers; then
    IFS=";" read -ra variants <<< "${NNTILE_LEVERS:-;--no-layer-priorities}"
    for i in "${!variants[@]}"; do  # a variant's NAME=value words are its environment
        envs=() opts=()
        for word in ${variants[$i]}; do
            if [[ $word == [A-Z]*=* ]]; then envs+=("$word"); else opts+=("$word"); fi
        done
        echo "lever-$i: ${NNTILE_LEVER_BASE:-} ${variants[$i]}" >> "$logs/levers.txt"
        step "lever-$i" timeout "$run_limit" env "${envs[@]}" python3 bench/scale.py \
            --n-embd "$wide_embd" --ncuda 1 "${wide[@]}" ${NNTILE_LEVER_BASE:-} "${opts[@]}"
    done
fi
if want defaults; then
    for config in ${NNTILE_DEFAULT_CONFIGS:-8192x4 10240x16}; do
        home="$(mktemp -d)"
        step "defaults-$config${NNTILE_DEFAULTS_ENV:+-env}" timeout "$run_limit" env \
            STARPU_HOME="$home" ${NNTILE_DEFAULTS_ENV:-} python3 bench/scale.py \
            --n-embd "${config%x*}" --batch "${config#*x}" --n-layer 4 \
            --steps "${NNTILE_DEFAULT_STEPS:-4}" ${NNTILE_DEFAULTS_ARGS:-}
        rm -rf "$home"
    done
fi
if want offload; then
    # issue 25's table past GPU memory: each EMBDxBATCHxSTEPS in each precision from fresh
    # StarPU models, then DeepSpeed ZeRO-3 offload on the first configuration (installed
    # offline from vendor/ when its sdist and wheels are there)
    configs=(${NNTILE_OFFLOAD_CONFIGS:-10240x16x4 12288x8x3 13440x6x3})
    for precision in ${NNTILE_OFFLOAD_PRECISIONS:-bf16-mixed tf32}; do
        for config in "${configs[@]}"; do
            IFS=x read -r embd batch nsteps <<<"$config"
            home="$(mktemp -d)"
            step "offload-$embd-b$batch-$precision" timeout "$run_limit" env STARPU_HOME="$home" \
                python3 bench/scale.py --n-layer 4 --n-embd "$embd" --batch "$batch" \
                --steps "$nsteps" --ncuda 1 --precision "$precision"
            rm -rf "$home"
        done
    done
    site=/tmp/nntile-deepspeed
    if [ -f vendor/deepspeed-0.19.8.tar.gz ] && { python3 -c "import deepspeed" 2>/dev/null ||
        { python3 -m pip install -q --no-index --no-deps --target "$site" vendor/whl/*.whl &&
          python3 -m pip install -q --no-index --no-deps --no-build-isolation --target "$site" \
              vendor/deepspeed-0.19.8.tar.gz; }; }; then
        IFS=x read -r embd batch nsteps <<<"${configs[0]}"
        step "offload-deepspeed-$embd-b$batch" timeout "$run_limit" env \
            PYTHONPATH="$site:$PYTHONPATH" python3 bench/deepspeed_ref.py --model gpt2 \
            --n-embd "$embd" --n-layer 4 --batch "$batch" --steps 3 --no-pin
    fi
    grep -h "^step\|^RESULT" "$logs"/offload-*.log | cut -c1-200
fi
if want compare; then
    for e in ${NNTILE_COMPARE_SIZES:-4096 8192}; do
        step "compare-$e" timeout "$run_limit" python3 bench/compare_torch.py --n-embd "$e" \
            --ncuda 1 "${wide[@]}"
    done
fi
if want mixed; then
    step mixed-compare-1gpu timeout "$run_limit" python3 bench/compare_torch.py \
        --n-embd "$wide_embd" --ncuda 1 --precision bf16-mixed "${wide[@]}"
    if [ "$ngpu" -gt 1 ]; then
        step "mixed-ours-${ngpu}gpu" timeout "$run_limit" python3 bench/scale.py \
            --n-embd "$wide_embd" --ncuda "$ngpu" --precision bf16-mixed "${wide[@]}"
        step "mixed-fsdp-${ngpu}gpu" timeout "$run_limit" python3 -m torch.distributed.run \
            --standalone --nproc-per-node "$ngpu" bench/fsdp_ref.py --n-embd "$wide_embd" \
            --n-layer 4 --batch 4 --steps 3 --dtype bf16-mixed
    fi
    for precision in tf32 bf16-mixed; do
        step "ooc-$precision" timeout "$run_limit" python3 bench/scale.py --n-embd "$wide_embd" \
            --ncuda 1 --precision "$precision" "${wide[@]}" ${NNTILE_OOC_ARGS:---batch 8}
    done
fi
if want llama; then
    llama_limit="${NNTILE_LLAMA_LIMIT:-570}"
    step llama-tests python3 -m pytest -q -s -p no:cacheprovider tests/test_gpu.py -k llama
    for precision in bf16-mixed tf32; do
        step "llama-1b-$precision" timeout "$llama_limit" python3 bench/compare_torch.py \
            --model llama-3.2-1b --seq 2048 --batch 8 --precision "$precision" --ncuda 1
    done
    step llama-8b timeout "$llama_limit" python3 bench/scale.py --model llama-3.1-8b \
        --seq 2048 --batch 2 --precision bf16-mixed --steps 3 --ncuda 1
fi
if want replicas && [ "$ngpu" -gt 1 ]; then
    # each run: ours in one process on every GPU, ours with one rank per GPU (replicas, NCCL),
    # then PyTorch DDP and FSDP2 under torchrun; same global batch, same call
    IFS=";" read -ra runs <<< "${NNTILE_REPLICA_RUNS:---n-embd 8192 --batch 16:bf16-mixed;--model llama-3.2-1b --seq 2048 --batch 16:bf16-mixed;--n-embd 8192 --batch 16:tf32}"
    # "off": one process, any GPU any task; "zero": ranks with the update sharded (replicas:zero)
    sides="${NNTILE_REPLICA_SIDES:-one ranks ddp fsdp2}"
    for i in "${!runs[@]}"; do
        shape="${runs[$i]%:*}" precision="${runs[$i]##*:}"
        echo "replicas-$i: $shape, $precision" | tee -a "$logs/replicas.txt"
        for side in $sides; do
            case $side in
            one|off) step "replicas-$i-$side" timeout "$run_limit" python3 bench/scale.py \
                --ncuda "$ngpu" --steps 4 --pipeline --precision "$precision" $shape \
                $([ "$side" = off ] && echo --device-replicas off) ;;
            ranks|zero) step "replicas-$i-$side" timeout "$run_limit" "${mpi[@]}" \
                -x NCCL_NVLS_ENABLE=0 -np "$ngpu" python3 bench/scale.py --ncuda 1 --steps 4 \
                --pipeline --precision "$precision" $shape \
                $([ "$side" = zero ] && echo --distribution replicas:zero) ;;
            ddp|fsdp2) step "replicas-$i-$side" timeout "$run_limit" python3 -m torch.distributed.run \
                --standalone --nproc-per-node "$ngpu" bench/fsdp_ref.py --steps 4 --pipeline \
                --dtype "$precision" $shape $([ "$side" = ddp ] && echo --ddp) ;;
            esac
        done
    done
    for i in "${!runs[@]}"; do
        for side in one off ranks zero ddp fsdp2; do
            grep -h "^RESULT" "$logs/replicas-$i-$side.log" 2>/dev/null | sed "s/^RESULT/$i $side/"
        done
    done | python3 -c '
import json, sys
rows = {}
for line in sys.stdin:
    i, side, text = line.split(" ", 2)
    r = json.loads(text)
    rows.setdefault(i, {})[side] = r.get("tokens_per_s") if r.get("status", "ok") == "ok" else None
for i, r in sorted(rows.items()):
    best = max((r.get(s) or 0) for s in ("ddp", "fsdp2")) or None
    ranks, one = r.get("ranks"), r.get("one")
    ratio = lambda a, b: "%.3f" % (a / b) if a and b else "-"
    print("replicas-%s tokens/s: one process %s (any GPU any task: %s), ranks %s, DDP %s, FSDP2 %s;"
          " ranks/one %s, ranks/best peer %s, one/FSDP2 %s, one/any-GPU %s; replicas:zero %s,"
          " zero/one %s"
          % (i, one, r.get("off"), ranks, r.get("ddp"), r.get("fsdp2"), ratio(ranks, one),
             ratio(ranks, best), ratio(one, r.get("fsdp2")), ratio(one, r.get("off")),
             r.get("zero"), ratio(r.get("zero"), one)))' | tee -a "$logs/replicas.txt"
fi
if want node-table; then
    step node-table python3 bench/node_table.py --configs "${NNTILE_NODE_CONFIGS:-8192x4,8192x16,16384x4}" \
        --timeout "$run_limit" --out "$logs/node-table.json" --logs "$logs/node-table"
    sed -n '/^## Node table/,$p' "$logs/node-table.log"
fi
if want node-llama; then
    IFS=";" read -ra runs <<< "${NNTILE_NODE_LLAMA:-llama-3.2-1b:16;llama-3.1-8b:4}"
    for run in "${runs[@]}"; do
        model="${run%:*}" batch="${run##*:}"
        step "node-$model-$batch" python3 bench/node_table.py --model "$model" --batch "$batch" \
            --seq 2048 --precision "${NNTILE_NODE_PRECISION:-bf16-mixed}" --steps 4 \
            --timeout "${NNTILE_LLAMA_LIMIT:-570}" --out "$logs/node-$model-$batch.json" \
            --logs "$logs/node-$model-$batch"
        sed -n '/^## Node table/,$p' "$logs/node-$model-$batch.log"
    done
fi
if want recompute; then
    model="${NNTILE_RECOMPUTE_MODEL:-llama-3.1-8b}" batch="${NNTILE_RECOMPUTE_BATCH:-16}"
    sides="ours,fsdp-ac"
    for k in ${NNTILE_RECOMPUTE_BLOCKS:-32 20 12}; do
        step "recompute-$k" python3 bench/node_table.py --model "$model" --batch "$batch" \
            --seq 2048 --precision bf16-mixed --steps 3 --sides "$sides" \
            --ours-args "--recompute $k" --timeout "${NNTILE_LLAMA_LIMIT:-570}" \
            --logs "$logs/recompute-$k"
        sed -n '/^## Node table/,$p' "$logs/recompute-$k.log"
        sides="ours"
    done
fi
if want node-capacity; then
    step node-capacity python3 bench/node_table.py \
        --capacity "${NNTILE_NODE_CAPACITY:-llama-3.2-1b,llama-3.2-3b,llama-3.1-8b}" \
        --batch "${NNTILE_NODE_CAPACITY_BATCH:-8}" --seq 2048 \
        --precision "${NNTILE_NODE_PRECISION:-bf16-mixed}" --steps 2 \
        --timeout "${NNTILE_LLAMA_LIMIT:-570}" --out "$logs/node-capacity.json" \
        --logs "$logs/node-capacity"
    sed -n '/^## Node table/,$p' "$logs/node-capacity.log"
fi
grep -h "^RESULT\|^{" "$logs"/wide-*.log "$logs"/defaults-*.log "$logs"/mpi-*.log "$logs"/scale-*.log "$logs"/lever-*.log \
    "$logs"/largest-*.log "$logs"/depth-*.log \
    "$logs"/compare-*.log "$logs"/mixed-*.log "$logs"/ooc-*.log "$logs"/llama-*.log 2>/dev/null
grep -h -A3 "nntile ratios" "$logs/gpu-bench.log" 2>/dev/null
echo "=== summary ($(cat "$logs/gpu.txt"))"
printf '%s\n' "${summary[@]}"
