"""What the command-line programs share: their entry point, one-line errors with exit code 2,
the model and tiling flags, and the StarPU flags."""
import argparse
import math
import os
import sys
import time

from nntile.errors import CLIError
from nntile.models.config import DEFAULT_VOCAB_TILE, INT_MAX
from nntile.policy import WIDE_TILE, launcher_rank  # noqa: F401 (programs import it here)
from nntile.startup import INTERRUPTED, end_quiet_interrupt

TILE_FLAGS = ("batch", "seq", "embd", "head", "inner", "vocab")


class ArgumentParser(argparse.ArgumentParser):
    """argparse with a one-line error message (no usage dump) and exit code 2."""

    def error(self, message):
        raise CLIError(message)


class DefaultsHelpFormatter(argparse.HelpFormatter):
    """--help that shows each option's default, where it has one to show (and its help
    does not say it already)."""

    def _get_help_string(self, action):
        text = action.help or ""
        shown = not (action.default is None or action.default is False
                     or action.default in ("", argparse.SUPPRESS))
        if shown and "default" not in text:
            text += " (default: %(default)s)"
        return text


def run_cli(func, argv=None, prog="nntile"):
    """Run ``func(argv)``; bad input and known failures end as one line and exit code 2.
    Under mpirun every rank runs the program (same inputs, same result) and rank 0 alone
    writes to stdout."""
    rank, size = launcher_rank()
    if size > 1 and rank != 0:
        sys.stdout = open(os.devnull, "w")
    try:
        end_quiet_interrupt()  # a KeyboardInterrupt from here on: see below
        return func(argv) or 0
    except CLIError as exc:
        message = " ".join(line.strip() for line in str(exc).splitlines() if line.strip())
        print(f"{prog}{_rank_label()}: error: {message}", file=sys.stderr, flush=True)
        _let_other_ranks_report()
        return 2
    except MemoryError as exc:  # numpy's host arrays; StarPU's are checked beforehand
        print(f"{prog}{_rank_label()}: error: out of memory: {exc}", file=sys.stderr,
              flush=True)
        return 2
    except KeyboardInterrupt:
        print(f"{prog}: interrupted", file=sys.stderr)
        return INTERRUPTED
    except BrokenPipeError:
        return 1


def program_main(func, prog, module):
    """A program's ``main(argv=None)``, the function its console script (pyproject.toml)
    calls: ``func(argv)`` under run_cli. ``module`` is the program module's ``__name__``:
    run as a script (``python -m``), the program runs at once and exits with its code."""
    def main(argv=None):
        return run_cli(func, argv, prog)
    if module == "__main__":
        sys.exit(main())
    return main


def _let_other_ranks_report(seconds=10.0):
    """mpirun kills every rank once one exits with an error, so a rank waits (boundedly: an
    error of its own alone must not hang it) until the others have reached their error too
    and printed it."""
    _, size = launcher_rank()
    if size < 2:
        return
    from nntile.distributed import mpi
    try:
        MPI = mpi()
    except ImportError:
        return
    request = MPI.COMM_WORLD.Ibarrier()
    deadline = time.monotonic() + seconds
    while not request.Test():
        if time.monotonic() > deadline:
            # MPI_Finalize would wait for the unfinished barrier: leave without it
            sys.stderr.flush()
            os._exit(2)
        time.sleep(0.01)


def _rank_label():
    rank, size = launcher_rank()
    return f" [rank {rank}]" if size > 1 else ""


def _int_at_least(minimum):
    def parse(text):
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not an integer") from None
        if value < minimum:
            raise argparse.ArgumentTypeError(f"{value} must be >= {minimum}")
        if value > INT_MAX:  # sizes and counts reach C ints
            raise argparse.ArgumentTypeError(f"{value} is too large (at most {INT_MAX})")
        return value
    return parse


positive_int = _int_at_least(1)
nonneg_int = _int_at_least(0)


def _float_where(ok, what):
    def parse(text):
        try:
            value = float(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not a number") from None
        if not (math.isfinite(value) and ok(value)):
            raise argparse.ArgumentTypeError(f"{text} must be {what}")
        return value
    return parse


positive_float = _float_where(lambda v: v > 0, "a positive number")
nonneg_float = _float_where(lambda v: v >= 0, "a number >= 0")
probability = _float_where(lambda v: 0 < v <= 1, "a probability in (0, 1]")


def output_file(example="out.h5"):
    """An argparse type: the name of a file to write, in a directory that exists. A directory
    is refused: it says where to write, not what (``example`` names a file in it)."""
    def parse(text):
        if os.path.isdir(text):
            raise argparse.ArgumentTypeError(
                f"{text} is a directory: name the file to write, e.g. "
                f"{os.path.join(text, example)}")
        parent = os.path.dirname(os.path.abspath(text))
        if not os.path.isdir(parent):
            raise argparse.ArgumentTypeError(f"directory {parent} of {text} does not exist")
        return text
    return parse


class OutLock:
    """One program at a time writes into an --out directory: an flock on the directory itself
    (nothing is written; the kernel releases it when the process ends, however it ends, or
    at release()). A second program is refused, naming the holder's process (Linux's
    /proc/locks)."""

    def __init__(self, out):
        import fcntl
        try:
            self.fd = os.open(out, os.O_RDONLY)
        except OSError as exc:
            raise CLIError(f"--out {out}: {exc.strerror or exc}") from None
        try:
            fcntl.flock(self.fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(self.fd)
            raise CLIError(f"--out {out} is in use by {self.holder(out)}: wait for it to end, "
                           "or use another --out") from None
        except OSError:  # a file system without flock on directories: no lock to take
            pass

    def release(self):
        os.close(self.fd)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.release()

    @staticmethod
    def holder(out):
        st = os.stat(out)
        inode = f"{os.major(st.st_dev):02x}:{os.minor(st.st_dev):02x}:{st.st_ino}"
        try:
            with open("/proc/locks") as f:
                pids = [line.split()[4] for line in f
                        if " FLOCK " in line and line.split()[5] == inode]
            with open(f"/proc/{pids[0]}/cmdline", "rb") as f:
                command = command_line(f.read())
            return f"process {pids[0]} ({command[:80]})"
        except (OSError, IndexError):
            return "another process"


def add_dtype_arg(parser):
    """--dtype of the programs that run a checkpoint: every precision nntile has."""
    from nntile.precision import PRECISIONS
    parser.add_argument("--dtype", help=f"compute in {', '.join(PRECISIONS)} (default: the "
                        "checkpoint's)")


def plural(count, noun):
    """"1 step", "2 steps"."""
    return f"{count} {noun}{'' if count == 1 else 's'}"


def command_line(cmdline):
    """A process's command from /proc/PID/cmdline, short: "nntile-train --out run" for
    "/usr/.../bin/python3 /usr/.../bin/nntile-train --out run" (the interpreter's and the
    program's directories would take the whole line)."""
    words = cmdline.decode(errors="replace").split("\0")
    words = [os.path.basename(w) if i < 2 else w for i, w in enumerate(words)]
    if len(words) > 1 and words[0].startswith("python") and words[1].startswith("nntile-"):
        words = words[1:]
    return " ".join(words).strip()


def add_checkpoint_arg(parser):
    parser.add_argument("--checkpoint", required=True, help="an nntile checkpoint (.h5)")


def add_verbose_arg(parser):
    parser.add_argument("-v", "--verbose", action="store_true", help="say more: StarPU's "
                        "workers, the cores of its threads, every runtime setting, the CPU's "
                        "BLAS, and StarPU's own messages (its performance models' warnings)")


def add_recompute_arg(parser):
    parser.add_argument("--recompute", nargs="?", const=True, type=positive_int,
                        metavar="BLOCKS", help="activation recomputation: keep only the "
                        "residual stream between blocks and run each block's forward again "
                        "in backward but for the MLP's output projection, for about a quarter "
                        "more arithmetic; with BLOCKS, only "
                        "the first BLOCKS blocks (less arithmetic, more memory) (default: "
                        "every block where the run then fits better, in GPU memory or at "
                        "all, and in GPU memory the fewest first blocks that leave a margin; "
                        "nntile.policy.recompute, keeps_activations)")
    parser.add_argument("--no-recompute", dest="recompute", action="store_false",
                        help="no activation recomputation")


def add_disk_swap_args(parser):
    group = parser.add_argument_group("disk swap (default: none; StarPU's STARPU_DISK_SWAP)")
    group.add_argument("--disk-swap", metavar="DIR", help="a directory StarPU may evict host "
                       "memory to (a disk memory node)")
    group.add_argument("--disk-swap-mib", type=positive_int, metavar="MIB", help="the disk "
                       "swap's size in MiB (default: the free space of DIR)")
    group.add_argument("--disk-swap-backend", choices=("unistd", "unistd_o_direct"),
                       help="StarPU's disk backend (default unistd_o_direct, or unistd when "
                       "some tiles are not whole pages)")


def apply_disk_swap(args, estimate):
    """Set up the disk swap that args ask for (before StarPU starts); its backend, or None.
    `estimate()` (nntile.memory's estimate of the run, made only where there is a disk swap)
    tells whether some tiles are not whole pages."""
    if not args.disk_swap:
        return None
    from nntile import machine
    unaligned = estimate().unaligned_tiles
    try:
        backend = machine.use_disk_swap(args.disk_swap, args.disk_swap_mib,
                                        args.disk_swap_backend, unaligned)
    except (OSError, ValueError) as exc:
        raise CLIError(f"--disk-swap {args.disk_swap}: {exc}") from None
    if args.disk_swap_backend is None and unaligned:
        print(f"disk swap: {unaligned} tiles are not whole pages (e.g. the loss), "
              "which unistd_o_direct cannot swap: using the unistd backend", flush=True)
    return backend


def add_dry_run_args(parser):
    parser.add_argument("--dry-run", action="store_true",
                        help="print the run's plan (memory by kind and place, tiles, "
                        "recomputation, PCIe traffic, predicted step time) and exit: 0 where "
                        "it fits, 2 where not; StarPU does not start")
    parser.add_argument("--machine", metavar="DESCRIPTION",
                        help="with --dry-run: plan for this machine instead of this one, "
                        "e.g. gpus=1x80GiB,host=128GiB[,cores=16] or the same keys as JSON "
                        "(host: memory available; STARPU_LIMIT_*_MEM still apply)")


def planned_machine(args):
    """The context in which a program plans for --machine (this machine without it); a
    CLIError for --machine without --dry-run or a description that does not parse."""
    from nntile import machine
    if args.machine is None:
        return machine.described(None)
    if not args.dry_run:
        raise CLIError("--machine describes the machine to plan for: use it with --dry-run")
    try:
        return machine.described(machine.parse_machine(args.machine))
    except ValueError as exc:
        raise CLIError(str(exc) if str(exc).startswith("--machine") else
                       f"--machine: {exc}") from None


def add_tiling_args(parser):
    group = parser.add_argument_group(
        "tiling (tile sizes; default: chosen for the machine and the run, nntile.policy.tiles: "
        f"the batch in one tile per worker, the vocabulary in tiles of {DEFAULT_VOCAB_TILE}, "
        f"n_embd in tiles of {WIDE_TILE} where wider, MLP weights in tiles of at most "
        f"{WIDE_TILE}x{WIDE_TILE}, the rest whole; printed at start)")
    for key in TILE_FLAGS:
        group.add_argument(f"--tile-{key}", type=positive_int, default=None, metavar="N")


def add_runtime_args(parser):
    group = parser.add_argument_group("StarPU runtime (default: StarPU's environment)")
    group.add_argument("--ncpu", type=nonneg_int, default=None, help="CPU workers")
    group.add_argument("--ncuda", type=nonneg_int, default=None, help="CUDA workers")
    group.add_argument("--sched", default=None, type=scheduler_name,
                       help="StarPU scheduler (lws, dmdas, ...)")
    group.add_argument("--distribution", default="replicas",
                       metavar="replicas[:zero]|data|tensor|mixed[:DxT]",
                       help="under mpirun: replicas: every rank holds the whole model and "
                       "trains on its share of the batch, gradients all-reduced (as PyTorch's "
                       "DDP; the fastest where the model fits each rank); replicas:zero: the "
                       "same with the update sharded (as ZeRO-2: gradients reduced to the rank "
                       "that updates each tile, which alone holds its optimizer states, "
                       "gradient and, in bf16-mixed, fp32 master); "
                       "otherwise which rank "
                       "owns which tiles, weights and optimizer states spread over all ranks "
                       "(data: batch tiles shared out; tensor: each activation's other tiles "
                       "shared out; mixed: a D x T grid of both). Default: replicas")


def scheduler_name(text):
    """A scheduler StarPU has (it would warn and fall back to its default on another)."""
    from nntile._core.core import schedulers
    from nntile.policy import check_scheduler
    try:
        check_scheduler(text, schedulers())
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None
    return text


def resolve_distribution(args, batch_size=None, tiles=None, config=None):
    """The Distribution for this run under mpirun (None for one process), checked on every
    rank alike before StarPU starts, so a bad one stops every rank with the same error."""
    _, size = launcher_rank()
    text = getattr(args, "distribution", None) or "replicas"
    from nntile.distributed import Distribution
    try:
        dist = Distribution.parse(text, size)
        dist.check(size)
        if batch_size is not None and tiles is not None:
            batch_tile = tiles.get("batch") or batch_size
            dist.check_batch(batch_size, -(-batch_size // batch_tile))
        if config is not None and tiles is not None and size > 1 and not dist.replicas:
            weight_tiles = ((-(-config.hidden_size // tiles["embd"]))
                            * (-(-config.intermediate_size // tiles["inner"])))
            if weight_tiles < dist.tensor:
                raise ValueError(f"{dist.tensor} tensor-parallel ranks but an MLP weight has "
                                 f"only {weight_tiles} tile(s) to share: use smaller "
                                 "--tile-embd/--tile-inner or fewer ranks")
    except ValueError as exc:
        raise CLIError(str(exc)) from None
    return dist if size > 1 else None


def tiling_from_args(args):
    return {key: getattr(args, f"tile_{key}") for key in TILE_FLAGS
            if getattr(args, f"tile_{key}", None) is not None}


def check_dtype(dtype):
    """A precision name (nntile.precision), or a one-line CLIError."""
    from nntile.precision import PRECISIONS
    if dtype not in PRECISIONS:
        raise CLIError(f"--precision {dtype!r}: use {', '.join(PRECISIONS)}")
    return dtype


def default_tiles(config, batch, seq, given, args=None, dtype="fp32", training=True):
    """{key: Choice} of the tiles for this run where ``given`` has none: nntile.policy.tiles
    for this machine, the runtime flags in ``args`` (--ncpu, --ncuda) and the memory the run
    needs (nntile.fit.chosen_total: recomputed as preflight will choose, or as ``args`` say)."""
    from nntile import fit, machine, memory, policy
    if os.environ.get("NNTILE_MEMORY_CHECK", "1") != "0":
        fit.refuse_absurd_depth(config, machine.gpus_of_this_process(
            getattr(args, "ncuda", None)))
    sizes = (config, batch or 1, seq or config.max_position_embeddings)
    run_bytes = (fit.chosen_total(*sizes, dtype, getattr(args, "ncuda", None),
                                  getattr(args, "recompute", None)) if training
                 else memory.estimate(*sizes, None, dtype, optimizer=None, training=False).total)
    flags = {name: getattr(args, name, None) for name in ("ncpu", "ncuda", "sched")}
    env = {k: v for k, v in os.environ.items() if k.startswith("STARPU_")}
    nranks = launcher_rank()[1]
    this = machine.probe(nranks > 1)
    settings = policy.runtime_settings(this, flags, env, run_bytes)
    data_groups = 1
    if nranks > 1:
        from nntile.distributed import Distribution
        try:
            data_groups = Distribution.parse(getattr(args, "distribution", None) or "data",
                                             nranks).data
        except ValueError:
            pass  # resolve_distribution says what is wrong with it
    run = policy.run_of(config, batch, seq, run_bytes, given, data_groups)
    return policy.tiles(run, settings, this)


def resolve_tiling(tiling, config, batch=None, seq=None, defaults=None):
    """Tile sizes, each checked against its dimension and the family's rules
    (config.check_tiles); a full dict for the checkpoint.
    ``defaults``: {key: Choice} for the keys ``tiling`` leaves out (default_tiles); without,
    one tile per dimension (the vocabulary in tiles of 8192)."""
    dims = dict(config.sizes(), batch=(batch, batch))  # one tile by default, as the model
    if seq is not None:
        dims["seq"] = (seq, seq)
    for key, (value, _) in (defaults or {}).items():
        if key in dims and value is not None:
            dims[key] = (dims[key][0], min(value, dims[key][0] or value))
    what = config.dimension_names()
    sizes = {key: size for key, (size, _) in dims.items()}
    out = {}
    for key in TILE_FLAGS:
        value = tiling.get(key)
        if value is None:
            out[key] = dims[key][1]
            continue
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise CLIError(f"--tile-{key} {value!r} must be a positive integer")
        if sizes[key] is not None and value > sizes[key]:
            raise CLIError(f"--tile-{key} {value} is larger than {what[key]} ({sizes[key]})")
        out[key] = value
    try:
        config.check_tiles(out)
    except ValueError as exc:
        raise CLIError(f"--tile-head {out['head']}: {exc}") from None
    return out


def model_tiling(tiles):
    """The tiling argument of a model (batch and seq tiles are clipped to the data)."""
    return {k: v for k, v in tiles.items() if v is not None}


def starpu_messages(verbose):
    """StarPU's own messages on stderr only under -v: its performance-model warnings ("not
    calibrated enough ... forcing calibration", "Too big deviation ... flushing the
    performance model") and start-up notes. StarPU prints them all through _STARPU_DISP,
    which STARPU_SILENT=1 (read by starpu_init) turns off; a STARPU_SILENT of the user's
    stands. Call it before StarPU starts; calibration_note says in one line what the
    silenced warnings would."""
    os.environ.setdefault("STARPU_SILENT", "0" if verbose else "1")


def calibration_note(ctx, echo, verbose):
    """A function to call after each step: the first time StarPU is found calibrating
    performance models (Context.models_calibrating), it ``echo``-es one line saying so; not
    under -v (``verbose``), where StarPU's own warnings say it (starpu_messages)."""
    told = verbose

    def check():
        nonlocal told
        count = 0 if told else ctx.models_calibrating()
        if count:
            told = True
            echo(f"nntile: StarPU is calibrating the performance models of {count} kernel"
                 f"{'s' if count > 1 else ''} on this machine: steps run slower until it has "
                 "measured each tile shape (-v shows its messages)")
    return check


def start_context(args, verbose=True, distribution=None, run_bytes=None, tiles=None,
                  training=None, run_breakdown=None, run_batch=None):
    """Start StarPU with the runtime flags (and StarPU-MPI under mpirun); print its workers
    and settings on stderr. ``run_bytes``: the pre-check's estimate, and ``training``: the
    precision a training run updates in, which some defaults depend on (nntile.Context);
    ``tiles``: {key: Choice} of the run's tiles, for describe(); ``run_breakdown``: the
    estimate's bytes by category (whether a replica per GPU fits), and ``run_batch`` its
    batch rows (whether the GPUs share them equally)."""
    from nntile.context import Context
    # StarPU's own SIGINT handler would replace Python's; the programs handle signals.
    os.environ.setdefault("STARPU_CATCH_SIGNALS", "0")
    starpu_messages(getattr(args, "verbose", False))
    try:
        ctx = Context(ncpu=args.ncpu, ncuda=args.ncuda, sched=args.sched,
                             distribution=distribution, run_bytes=run_bytes,
                             training=training, run_breakdown=run_breakdown,
                             run_batch=run_batch)
    except (RuntimeError, ValueError, TypeError) as exc:
        raise CLIError(f"cannot start StarPU: {exc}") from None
    ctx.tiles = tiles
    if verbose:
        print(ctx.describe(), file=sys.stderr)
    return ctx


def checkpoint_tiles(ckpt, args=None, batch=None, seq=None):
    """The tiles to run a checkpoint in: its own, except where tile flags say otherwise
    (batch and seq tiles clipped to the data's shape)."""
    tiling = {k: v for k, v in (ckpt.get("tiling") or {}).items() if v is not None}
    limits = {"batch": batch, "seq": seq}
    for key, limit in limits.items():
        if key in tiling and limit is not None:
            tiling[key] = min(tiling[key], limit)
    given = tiling_from_args(args) if args is not None else {}
    tiling.update(given)
    return resolve_tiling(tiling, ckpt.config, batch, seq)


def check_inference_memory(ckpt, args, batch, seq, dtype, prog):
    """Before StarPU starts: refuse, with the numbers, a forward pass (and loss) of a
    checkpoint on [batch, seq] that cannot fit (as nntile-train does for training); the
    estimate."""
    from nntile.fit import preflight
    family_model(ckpt.config)
    return preflight(ckpt.config, batch, seq, checkpoint_tiles(ckpt, args, batch, seq),
                     check_dtype(dtype) if dtype else ckpt.dtype, ncuda=args.ncuda,
                     optimizer=None, grad_clip=False, training=False, prog=prog)


def family_model(config):
    """The model class of a config's family, or a one-line CLIError for a family whose layers
    are not written yet (before StarPU starts)."""
    from nntile.models import model_class
    try:
        return model_class(config.model_type)
    except NotImplementedError as exc:
        raise CLIError(f"{config.model_type}: {exc}") from None


def model_from_checkpoint(ckpt, args=None, batch=None, seq=None, dtype=None):
    """The model of a checkpoint's family holding its weights, in checkpoint_tiles."""
    tiles = checkpoint_tiles(ckpt, args, batch, seq)
    dtype = check_dtype(dtype) if dtype else ckpt.dtype
    model = family_model(ckpt.config)(ckpt.config, tiling=model_tiling(tiles), dtype=dtype)
    ckpt.load_params(model)
    return model


def checkpoint_seq_len(ckpt, requested=None):
    """The sequence length to run a checkpoint at: asked, else its training one, else the
    model's positions; checked against them."""
    config = ckpt.config
    return check_seq_len(config, requested or (ckpt.get("train") or {}).get("seq_len")
                         or config.max_position_embeddings)


def check_seq_len(config, seq):
    """``seq``, or a CLIError when the model has fewer positions."""
    if seq > config.max_position_embeddings:
        raise CLIError(f"--seq-len {seq} is larger than the model's "
                       f"{config.field_name('max_position_embeddings')} "
                       f"({config.max_position_embeddings})")
    return int(seq)
