"""nntile.policy: the defaults as plain functions of the situation, tested without StarPU
(each test loads the module by its path, so the core is not imported); and the one check of
every StarPU call whose code matters (CHKERR)."""
import glob
import importlib.util
import os
import re
import subprocess
import sys

import pytest
from hypothesis import given, settings, strategies as st

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
GiB = 2**30


def _load_policy():
    spec = importlib.util.spec_from_file_location("nntile_policy_alone",
                                                  os.path.join(ROOT, "nntile", "policy.py"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


policy = _load_policy()
H100 = 80 * 10**9  # bytes nvidia-smi reports, about
CPU2 = policy.Machine(cores=2)
ONE_H100 = policy.Machine(cores=16, gpus=(H100,), cuda_built=True)
TWO_H200 = policy.Machine(cores=32, gpus=(141 * 10**9,) * 2, cuda_built=True)


def gpt2_sizes(n_embd, n_head, vocab=50257, seq=1024, inner=None):
    """What GPT2Config.sizes() gives (the vocabulary's default tile is not read here)."""
    inner = inner or 4 * n_embd
    return {"batch": (None, None), "seq": (seq, seq), "embd": (n_embd, n_embd),
            "head": (n_head, n_head), "inner": (inner, inner), "vocab": (vocab, vocab)}


def tiles_for(machine, sizes, batch, run_bytes=None, given=None):
    settings_ = policy.runtime_settings(machine, {}, {}, run_bytes)
    run = policy.Run(sizes, batch, None, run_bytes, dict(given or {}))
    return {k: v for k, (v, _) in policy.tiles(run, settings_, machine).items()}


def test_the_module_stands_alone():
    """policy.py runs with no nntile package and no StarPU: it imports nothing of either."""
    code = (f"import importlib.util, sys; s = importlib.util.spec_from_file_location('p', "
            f"{os.path.join(ROOT, 'nntile', 'policy.py')!r}); m = importlib.util.module_from_spec(s);"
            " s.loader.exec_module(m); print(sorted(n for n in sys.modules if n.startswith('nntile')))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd="/")
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "[]"


def test_default_scheduler_follows_the_situation():
    """docs/performance.md, "Defaults at scale": lws without GPUs and on several GPUs alone;
    dmdas on one GPU alone and wherever CPU workers join GPUs."""
    assert policy.scheduler(0, True)[0] == "lws"
    assert policy.scheduler(1, True)[0] == "dmdas"
    assert policy.scheduler(4, True)[0] == "dmdas"
    assert policy.scheduler(1, False)[0] == "dmdas"
    assert policy.scheduler(2, False)[0] == "lws"
    assert "4 GPUs" in policy.scheduler(4, False)[1]


def test_workers_per_gpu_follow_the_situation():
    """Two per GPU; four on one GPU that cannot hold the run ("Activations dropped after
    backward"); two where the run's size is not known or there are several GPUs."""
    assert policy.workers_per_gpu(1, 50 * GiB, 76 * GiB)[0] == 2
    assert policy.workers_per_gpu(1, 175 * GiB, 76 * GiB)[0] == 4
    assert "cannot hold" in policy.workers_per_gpu(1, 175 * GiB, 76 * GiB)[1]
    assert policy.workers_per_gpu(2, 175 * GiB, 76 * GiB)[0] == 2  # several: not measured
    assert policy.workers_per_gpu(1, None, 76 * GiB)[0] == 2
    assert policy.workers_per_gpu(1, 175 * GiB, None)[0] == 2


def test_host_memory_is_pinned_ahead_only_past_gpu_memory():
    """The run's size in MiB where the GPUs cannot hold it ("Step 1 past GPU memory"); none
    in GPU memory, without GPUs, where the size is not known, or with pinning turned off."""
    past = policy.pinned_host_mib(1, 175 * GiB, 76 * GiB, {})
    assert past == (175 * 1024, policy.PIN_AHEAD)
    assert policy.pinned_host_mib(1, 175 * GiB + 1, 76 * GiB, {})[0] == 175 * 1024 + 1
    assert policy.pinned_host_mib(1, 50 * GiB, 76 * GiB, {}) == (0, policy.PIN_AS_NEEDED)
    assert policy.pinned_host_mib(3, 175 * GiB, 76 * GiB, {})[0] == 0  # three GPUs hold it
    assert policy.pinned_host_mib(2, 175 * GiB, 76 * GiB, {})[0] == 175 * 1024
    assert policy.pinned_host_mib(0, 175 * GiB, None, {})[0] == 0
    assert policy.pinned_host_mib(1, None, 76 * GiB, {})[0] == 0
    off = policy.pinned_host_mib(1, 175 * GiB, 76 * GiB, {"STARPU_DISABLE_PINNING": "1"})
    assert off == (0, policy.PINNING_OFF)
    assert policy.pinned_host_mib(1, 175 * GiB, 76 * GiB, {"STARPU_DISABLE_PINNING": "0"})[0]


def test_recompute_only_where_it_makes_the_run_fit_better():
    """Recomputation is on where the run fits better with it (the GPUs alone rather than GPU
    and host memory together, or at all rather than refused), off otherwise; a given value
    wins either way."""
    better = [("host", "gpu"), (None, "host"), (None, "gpu")]
    for without, with_recompute in better:
        choice = policy.recompute(None, without, with_recompute)
        assert choice.value is True
        assert policy.FITS_WORDS[with_recompute] in choice.reason
        assert policy.recompute(False, without, with_recompute) == (False, "argument")
    for without in policy.FITS:
        for with_recompute in policy.FITS:
            if (without, with_recompute) not in better:
                assert policy.recompute(None, without, with_recompute) == \
                    (False, policy.NO_RECOMPUTE)
                assert policy.recompute(True, without, with_recompute) == (True, "argument")


def test_runtime_settings_argument_then_variable_then_rule():
    cpu = policy.runtime_settings(CPU2, {}, {})
    assert cpu["ncpu"] == (None, "StarPU default") and cpu["sched"][0] == "lws"
    assert cpu["ncuda"] == (0, "built without CUDA") and cpu["workers_per_gpu"][0] is None
    assert cpu["calibrate_minimum"] == (1, policy.CALIBRATE_FAST)
    assert cpu["history_max_error"] == (1000, policy.HISTORY_TOLERANT)
    env = policy.runtime_settings(CPU2, {}, {"STARPU_NCPU": "1", "STARPU_SCHED": "eager",
                                             "STARPU_CALIBRATE_MINIMUM": "10"})
    assert env["ncpu"] == ("1", "$STARPU_NCPU") and env["sched"] == ("eager", "$STARPU_SCHED")
    assert env["calibrate_minimum"] == ("10", "$STARPU_CALIBRATE_MINIMUM")
    assert policy.runtime_settings(CPU2, {}, {"STARPU_HISTORY_MAX_ERROR": "50"})[
        "history_max_error"] == ("50", "$STARPU_HISTORY_MAX_ERROR")
    arg = policy.runtime_settings(CPU2, {"ncpu": 2, "sched": "dmdas"}, {"STARPU_NCPU": "1"})
    assert arg["ncpu"] == (2, "argument") and arg["sched"] == ("dmdas", "argument")

    gpu = policy.runtime_settings(ONE_H100, {}, {})
    assert gpu["ncpu"] == (0, policy.GPU_ONLY) and gpu["sched"][0] == "dmdas"
    assert gpu["limit_cuda_mem"] == (policy.cuda_limit_mib(H100), policy.CUDA_LIMIT)
    assert gpu["workers_per_gpu"] == (2, policy.TWO_PER_GPU)
    past = policy.runtime_settings(ONE_H100, {}, {}, run_bytes=175 * GiB)
    assert past["workers_per_gpu"] == (4, policy.FOUR_PAST_MEMORY)
    assert past["pinned_host_mem"] == (175 * 1024, policy.PIN_AHEAD)
    assert gpu["pinned_host_mem"] == (0, policy.PIN_AS_NEEDED)
    assert policy.runtime_settings(ONE_H100, {}, {"NNTILE_PINNED_HOST_MEM": "0"},
                                   run_bytes=175 * GiB)["pinned_host_mem"][0] == "0"
    mpi = policy.runtime_settings(policy.Machine(cores=16, gpus=(H100,), cuda_built=True,
                                                 mpi=True), {}, {}, run_bytes=175 * GiB)
    assert mpi["workers_per_gpu"][0] == 2  # other ranks share the node: not measured
    assert mpi["pinned_host_mem"][0] == 0
    # past GPU memory each update's tiles are copied to the host after it, else not
    assert past["write_behind"] == (1, policy.WRITE_BEHIND)
    assert gpu["write_behind"] == (0, policy.NO_WRITE_BEHIND)
    assert cpu["write_behind"] == (0, policy.NO_WRITE_BEHIND)
    assert mpi["write_behind"][0] == 0
    assert policy.runtime_settings(ONE_H100, {"write_behind": 0}, {}, run_bytes=175 * GiB)[
        "write_behind"] == (0, "argument")
    off = policy.runtime_settings(ONE_H100, {}, {"NNTILE_WRITE_BEHIND": "0"}, run_bytes=175 * GiB)
    assert off["write_behind"] == ("0", "$NNTILE_WRITE_BEHIND")
    # GPU buffers from a memory pool of each GPU, on one GPU or several (each pool open to the
    # others), unless turned off
    assert gpu["cuda_pool"] == (1, policy.POOL) and past["cuda_pool"] == (1, policy.POOL)
    assert mpi["cuda_pool"] == (1, policy.POOL)
    assert policy.runtime_settings(TWO_H200, {}, {})["cuda_pool"] == (1, policy.POOL)
    assert policy.runtime_settings(TWO_H200, {}, {"NNTILE_CUDA_POOL": "0"})["cuda_pool"] == (
        "0", "$NNTILE_CUDA_POOL")
    assert policy.runtime_settings(TWO_H200, {"cuda_pool": 1}, {})["cuda_pool"] == (1, "argument")
    assert cpu["cuda_pool"][0] is None
    assert "cuda_pool" in policy.DEFAULTS_IN_ENV
    assert policy.runtime_settings(TWO_H200, {}, {})["sched"][0] == "lws"
    assert policy.runtime_settings(ONE_H100, {"ncpu": 8}, {})["sched"][0] == "dmdas"
    assert policy.runtime_settings(ONE_H100, {"ncuda": 0}, {})["sched"][0] == "lws"
    one_core = policy.Machine(cores=1, mpi=True, one_core=True)
    assert policy.runtime_settings(one_core, {}, {})["ncpu"] == (1, policy.SHARED_CORE)


def test_half_the_update_on_cpu_workers_only_where_measured():
    """One GPU that cannot hold a run without compute copies: half the update on every spare
    core, the rest of the step on the GPU ("The update where its states live"); nowhere else
    (bf16-mixed, in memory, several GPUs, MPI, few cores, not training, CPU workers given)."""
    tf32, mixed = ("tf32", "tf32"), ("fp32", "bf16")
    past = policy.runtime_settings(ONE_H100, {}, {}, 175 * GiB, tf32)
    assert past["cpu_update"] == (0.5, policy.UPDATE_ON_CPU)
    assert past["ncpu"] == (13, policy.CPU_UPDATE_WORKERS) and past["sched"][0] == "dmdas"
    assert past["workers_per_gpu"][0] == 4 and past["write_behind"][0] == 1
    fp64 = policy.runtime_settings(ONE_H100, {}, {}, 175 * GiB, ("fp64", "fp64"))
    assert fp64["cpu_update"][0] == 0.5
    on_gpu = (0, policy.UPDATE_WITH_STEP)
    for machine, given, run_bytes, training in (
            (ONE_H100, {}, 175 * GiB, mixed), (ONE_H100, {}, 50 * GiB, tf32),
            (ONE_H100, {}, 175 * GiB, None), (ONE_H100, {}, None, tf32),
            (TWO_H200, {}, 400 * GiB, tf32), (ONE_H100, {"ncuda": 0}, 175 * GiB, tf32),
            (policy.Machine(cores=15, gpus=(H100,), cuda_built=True), {}, 175 * GiB, tf32),
            (policy.Machine(cores=16, gpus=(H100,), cuda_built=True, mpi=True), {},
             175 * GiB, tf32)):
        settings_ = policy.runtime_settings(machine, given, {}, run_bytes, training)
        assert settings_["cpu_update"] == on_gpu, (machine, given, run_bytes, training)
        assert settings_["ncpu"][0] in (0, None, 1)
    # on a node of 64 cores driving one of its GPUs, every spare core
    assert policy.runtime_settings(policy.Machine(cores=64, gpus=(H100,) * 4, cuda_built=True),
                                   {"ncuda": 1}, {}, 175 * GiB, tf32)["ncpu"][0] == 61
    # CPU workers of the user's own take what the scheduler gives them
    own = policy.runtime_settings(ONE_H100, {"ncpu": 4}, {}, 175 * GiB, tf32)
    assert own["cpu_update"] == on_gpu and own["ncpu"] == (4, "argument")
    # asked for: an argument, then the variable; the spare cores then work for it
    asked = policy.runtime_settings(ONE_H100, {"cpu_update": 0.25}, {}, 50 * GiB, mixed)
    assert asked["cpu_update"] == (0.25, "argument") and asked["ncpu"][0] == 13
    env = policy.runtime_settings(ONE_H100, {}, {"NNTILE_CPU_UPDATE": "0"}, 175 * GiB, tf32)
    assert env["cpu_update"] == ("0", "$NNTILE_CPU_UPDATE") and env["ncpu"][0] == 0
    for bad in ("half", "1.5", "-0.1", ""):
        assert policy.share(bad) is None
    assert policy.share("0.5") == 0.5 and policy.share(1) == 1.0
    with pytest.raises(ValueError, match="NNTILE_CPU_UPDATE='2'.*share of the parameters"):
        policy.check_starpu_env({"NNTILE_CPU_UPDATE": "2"})


def test_cuda_limit_leaves_three_gib_or_three_percent():
    assert policy.cuda_limit_mib(80 * GiB) == (80 * GiB - 3 * GiB) // 2**20
    assert policy.cuda_limit_mib(200 * GiB) == int(200 * GiB * 0.97) // 2**20
    assert policy.cuda_limit_mib(16 * GiB) == int(0.9 * 16 * GiB) // 2**20


def test_tiles_of_the_measured_runs():
    """No tile flags give the hand tiles of docs/performance.md's fastest figures."""
    # GPT-2 124M, batch 8, one H100: two batch tiles, the vocabulary in 8192, the rest whole
    assert tiles_for(ONE_H100, gpt2_sizes(768, 12), 8) == dict(
        batch=4, seq=1024, embd=768, head=12, inner=3072, vocab=8192)
    # the XL shape (48 layers, n_embd 1600, 25 heads), batch 8
    assert tiles_for(ONE_H100, gpt2_sizes(1600, 25), 8) == dict(
        batch=4, seq=1024, embd=1600, head=25, inner=6400, vocab=8192)
    # n_embd 8192 in memory: tiles 4096, 32 heads of 128, the MLP's 32768 in 8192s
    assert tiles_for(ONE_H100, gpt2_sizes(8192, 64), 4, run_bytes=70 * GiB) == dict(
        batch=2, seq=1024, embd=4096, head=32, inner=8192, vocab=8192)
    # several GPUs that hold the run: one batch tile a GPU (a replica's share) and the MLP's
    # weight tiles within 4096 x 8192, as on one GPU: n_embd 8192 batch 16 and Llama-3.1-8B's
    # shape at batch 8 on two H200s
    assert tiles_for(TWO_H200, gpt2_sizes(8192, 64), 16, run_bytes=90 * GiB) == dict(
        batch=8, seq=1024, embd=4096, head=32, inner=8192, vocab=8192)
    assert tiles_for(TWO_H200, gpt2_sizes(4096, 32, inner=14336), 8, run_bytes=220 * GiB) == dict(
        batch=4, seq=1024, embd=4096, head=32, inner=7168, vocab=8192)
    # past their memory, two batch tiles a GPU and the MLP's weight tiles within 4096 x 4096
    assert tiles_for(TWO_H200, gpt2_sizes(4096, 32, inner=14336), 16, run_bytes=400 * GiB) == dict(
        batch=4, seq=1024, embd=4096, head=32, inner=3584, vocab=8192)
    # Llama-3.1-8B's and Llama-2-13B's blocks in memory (one H200): the MLP's 14336 in two
    # equal tiles; 5120 in one tile, not 4096 + 1024, and 13824 in three
    one_h200 = policy.Machine(cores=16, gpus=(141 * 10**9,), cuda_built=True)
    assert tiles_for(one_h200, gpt2_sizes(4096, 32, inner=14336), 4, run_bytes=80 * GiB)[
        "inner"] == 7168
    assert tiles_for(one_h200, gpt2_sizes(5120, 40, inner=13824), 4, run_bytes=80 * GiB) == dict(
        batch=2, seq=1024, embd=5120, head=40, inner=4608, vocab=8192)
    # 6.07B (n_embd 10240) batch 16 past the H100's memory: four workers, four batch tiles
    assert tiles_for(ONE_H100, gpt2_sizes(10240, 80), 16, run_bytes=175 * GiB) == dict(
        batch=4, seq=1024, embd=4096, head=32, inner=4096, vocab=8192)
    # the 2-core machine: make train's default run and bench/test_gpt2_cpu.py, one batch tile
    # per CPU worker
    assert tiles_for(CPU2, gpt2_sizes(128, 4, vocab=256, seq=128), 8)["batch"] == 4
    assert tiles_for(CPU2, gpt2_sizes(256, 4, seq=1024), 8)["batch"] == 4


def test_each_data_parallel_group_gets_its_batch_tiles():
    rank = policy.Machine(cores=1, mpi=True, one_core=True)
    settings_ = policy.runtime_settings(rank, {}, {})
    choices = policy.tiles(policy.Run(gpt2_sizes(128, 4, vocab=256, seq=128), 8,
                                      data_groups=2), settings_, rank)
    assert choices["batch"].value == 4 and "2 data groups" in choices["batch"].reason


def test_given_tiles_win_and_reasons_are_printed():
    settings_ = policy.runtime_settings(ONE_H100, {}, {})
    run = policy.Run(gpt2_sizes(768, 12), 8, None, None, {"batch": 8, "vocab": 50257})
    choices = policy.tiles(run, settings_, ONE_H100)
    assert choices["batch"] == (8, "given") and choices["vocab"] == (50257, "given")
    line = policy.describe_tiles(choices)
    assert line.startswith("batch 8, vocab 50257 (given); seq 1024 (one tile)")
    assert "embd 768 (one tile below 6144, tiles of 4096 from there)" in line
    unknown_batch = policy.tiles(policy.Run(gpt2_sizes(768, 12)), settings_, ONE_H100)
    assert unknown_batch["batch"].value is None and unknown_batch["batch_count"].value == 2


@settings(max_examples=30, deadline=None)
@given(heads=st.integers(1, 96), head_dim=st.sampled_from([16, 64, 80, 128]),
       batch=st.integers(1, 64), gpus=st.integers(0, 8), past=st.booleans())
def test_tiles_fit_their_dimensions(heads, head_dim, batch, gpus, past):
    machine = policy.Machine(cores=8, gpus=(H100,) * gpus, cuda_built=True)
    sizes = gpt2_sizes(heads * head_dim, heads)
    t = tiles_for(machine, sizes, batch, run_bytes=(100_000 if past else 1) * GiB)
    for key in ("seq", "embd", "head", "inner", "vocab"):
        assert 1 <= t[key] <= sizes[key][0]
    assert 1 <= t["batch"] <= batch
    assert t["embd"] == sizes["embd"][0] < 1.5 * policy.WIDE_TILE or t["embd"] == policy.WIDE_TILE
    most = policy.WIDE_TILE**2 * (1 if past and gpus else 2)
    assert t["embd"] * t["inner"] <= most or t["inner"] == sizes["inner"][0]
    # equal tiles: the last one is at least as large as the others less a 256 step each
    count = -(-sizes["inner"][0] // t["inner"])
    assert sizes["inner"][0] - (count - 1) * t["inner"] >= t["inner"] - 256 * count
    assert t["head"] * head_dim <= max(t["embd"], head_dim)  # heads of a tile fit its embd
    # the batch is cut into as many tiles as workers run chains, or as GPUs that hold the run
    # (or fewer, for a small batch)
    if not gpus:
        chains = 8
    elif past:
        chains = 4 if gpus == 1 else 2 * gpus
    else:
        chains = 2 if gpus == 1 else gpus
    assert -(-batch // t["batch"]) <= chains


def test_starpu_variables_that_would_abort_are_refused():
    for name, value in (("STARPU_NCPU", "-1"), ("STARPU_CALIBRATE", "abc"),
                        ("STARPU_NWORKER_PER_CUDA", "0"), ("STARPU_LIMIT_CPU_MEM", "1.5G"),
                        ("STARPU_WORKERS_CUDAID", "0;1"), ("STARPU_HISTORY_MAX_ERROR", "50%"),
                        ("NNTILE_PINNED_HOST_MEM", "-1"), ("NNTILE_WRITE_BEHIND", "yes"),
                        ("NNTILE_CUDA_POOL", "on")):
        with pytest.raises(ValueError, match=f"{name}={value!r} should be"):
            policy.check_starpu_env({name: value})
    policy.check_starpu_env({"STARPU_NCPU": "2", "STARPU_CALIBRATE": "1", "STARPU_SCHED": "x",
                             "STARPU_WORKERS_CUDAID": "0,1", "STARPU_LIMIT_CUDA_MEM": ""})
    with pytest.raises(ValueError, match="'nope' does not exist; StarPU has: lws, eager"):
        policy.check_scheduler("nope", {"lws": "", "eager": ""})


def test_launcher_and_rank_cores():
    assert policy.launcher_rank({}) == (0, 1) and not policy.launched_by_mpirun({})
    env = {"OMPI_COMM_WORLD_RANK": "1", "OMPI_COMM_WORLD_SIZE": "4"}
    assert policy.launcher_rank(env) == (1, 4) and policy.launched_by_mpirun(env)
    assert policy.launcher_rank({"PMI_RANK": "0"}) == (0, 1)
    assert policy.rank_core_share(range(8), 1, 2) == [4, 5, 6, 7]
    assert policy.rank_core_share(range(2), 2, 3) == [0]
    assert policy.mpi_yield_when_idle(True) == "1" and policy.mpi_yield_when_idle(False) is None
    assert policy.mpi_progress_thread_unbound(True, False)
    assert not policy.mpi_progress_thread_unbound(True, True)


# ---- CHKERR: a StarPU call whose code matters cannot be left unchecked ------------------------

# int-returning functions of starpu.pxd whose result is a value, not an error code
RETURNS_A_VALUE = {"starpu_is_initialized", "starpu_memory_node_get_name",
                   "starpu_worker_get_id", "starpu_worker_get_devid", "starpu_bus_get_count",
                   "starpu_bus_get_src", "starpu_bus_get_dst"}


def _declared(path, pattern):
    with open(os.path.join(ROOT, path)) as f:
        return set(re.findall(pattern, f.read(), re.M))


def test_every_error_code_is_declared_checked():
    returning_int = _declared("nntile/_core/starpu.pxd", r"^\s+int (starpu_\w+)\(")
    checked = _declared("nntile/_core/starpu_checked.h", r"^int (starpu_\w+)\(.*NNTILE_CHECKED;")
    assert returning_int - RETURNS_A_VALUE == checked
    glue = _declared("nntile/_core/mpi_glue.h", r"^int (nntile_mpi_\w+)\(.*NNTILE_CHECKED;")
    assert glue == {"nntile_mpi_start", "nntile_mpi_stop", "nntile_mpi_submit",
                    "nntile_mpi_wait_for_all", "nntile_mpi_barrier", "nntile_mpi_bytes_sent"}


def _starpu_include():
    prefixes = [os.environ.get("NNTILE_STARPU_PREFIX", "")]
    prefixes += glob.glob(os.path.expanduser("~/.cache/nntile/starpu-1.4*"))
    for prefix in prefixes:
        include = os.path.join(prefix, "include", "starpu", "1.4")
        if prefix and os.path.exists(os.path.join(include, "starpu.h")):
            return include
    return None


def test_a_dropped_error_code_does_not_build(tmp_path):
    """The core's compiler flags turn a dropped code into an error, even cast to void, which
    is how Cython writes a call whose result is not used."""
    include = _starpu_include()
    if include is None:
        pytest.skip("StarPU's headers were not found")
    for body, builds in (("(void) starpu_task_wait_for_all();", False),
                         ("if (starpu_task_wait_for_all() != 0) return -1;", True)):
        source = tmp_path / "call.c"
        source.write_text(f'#include "starpu_checked.h"\nint f(void) {{ {body} return 0; }}\n')
        out = subprocess.run(["cc", "-c", "-o", os.devnull, "-Werror=unused-result",
                              f"-I{ROOT}/nntile/_core", f"-I{include}", str(source)],
                             capture_output=True, text=True)
        assert (out.returncode == 0) == builds, out.stderr
