"""nntile-train: train a language model on tiles scheduled by StarPU, with HDF5 checkpoints.

    nntile-train                          # small byte-level GPT-2 on the Python stdlib sources
    nntile-train --data DIR --n-layer 6 --n-embd 384 --seq-len 256 --steps 5000
    nntile-train --resume latest          # continue the run in --out (bit for bit on CPU)
    nntile-train --init-from HF_DIR --data DIR   # fine-tune a transformers model

Flags left out fall back, in order, to the checkpoint being resumed and then to the defaults.
Ctrl-C or SIGTERM ends the current step, saves a checkpoint and exits with 130 or 143; a second
signal abandons the step (the checkpoint then holds the step before). Before the first step,
either ends the program quietly (nntile.startup).
"""
import contextlib
import json
import math
import os
import shutil
import signal
import sys
import tempfile
import time

import numpy as np

from nntile.cli_common import (ArgumentParser, CLIError, OutLock, add_disk_swap_args,
                               add_dry_run_args, add_recompute_arg, add_runtime_args,
                               add_tiling_args, apply_disk_swap,
                               add_verbose_arg, calibration_note, check_dtype, check_seq_len,
                               default_tiles, family_model, launcher_rank, model_tiling,
                               nonneg_float, nonneg_int, planned_machine, plural,
                               positive_float, positive_int, program_main,
                               resolve_distribution, resolve_tiling, start_context,
                               tiling_from_args)
from nntile import train_config
from nntile.data import EVAL_BATCHES
from nntile.events import EventWriter, event_files
from nntile.models import FAMILIES
from nntile.models.config import ATTENTION

DEFAULT_SEQ_LEN = 128
TRAIN_DEFAULTS = dict(batch_size=8, grad_accum=1, steps=1500, lr=2e-3, min_lr=2e-4, warmup=100,
                      weight_decay=0.01, beta1=0.9, beta2=0.95, eps=1e-8, grad_clip=1.0,
                      eval_every=250, eval_batches=EVAL_BATCHES, save_every=500, keep=3,
                      seed=1337)
# the model flags, and the canonical config attribute each one sets (CausalLMConfig)
CONFIG_FLAGS = {"n_layer": "num_hidden_layers", "n_head": "num_attention_heads",
                "n_kv_head": "num_key_value_heads", "n_embd": "hidden_size",
                "vocab_size": "vocab_size"}
METRICS = "metrics.jsonl"


def build_parser():
    p = ArgumentParser(prog="nntile-train", description=__doc__.split("\n\n")[0])
    g = p.add_argument_group("model (default: a GPT-2 of 4 layers, 4 heads, n_embd 128, seq "
                             "128, the data's vocabulary)")
    g.add_argument("--model", choices=list(FAMILIES), help="the family of a fresh model "
                   "(gpt2; llama: 4 layers, hidden 128, 4 heads sharing 2 key/value heads)")
    g.add_argument("--config", help="model config JSON: nntile's or transformers' config.json "
                   "(its model_type picks the family)")
    g.add_argument("--n-layer", type=positive_int)
    g.add_argument("--n-head", type=positive_int)
    g.add_argument("--n-kv-head", type=positive_int, help="key/value heads (llama)")
    g.add_argument("--n-embd", type=positive_int)
    g.add_argument("--seq-len", type=positive_int, help="training sequence length "
                   "(also the model's positions when it comes from flags)")
    g.add_argument("--vocab-size", type=positive_int)
    g.add_argument("--precision", "--dtype", dest="dtype",
                   help="fp32 (default), tf32, bf16 (bf16 storage, fp32 arithmetic), fp64, "
                   "bf16-mixed (fp32 master weights and Adam states, bf16 GEMMs)")
    g.add_argument("--attention", choices=ATTENTION, help="fused (default: flash attention, "
                   "nothing [seq, seq] kept) or unfused (the scores and probabilities as "
                   "tensors: the reference)")
    add_tiling_args(p)
    g = p.add_argument_group("training")
    g.add_argument("--batch-size", type=positive_int, help="sequences per micro-batch (8)")
    g.add_argument("--grad-accum", type=positive_int, help="micro-batches per step (1)")
    g.add_argument("--steps", type=positive_int, help="total optimizer steps (1500)")
    g.add_argument("--lr", type=positive_float, help="peak learning rate (2e-3)")
    g.add_argument("--min-lr", type=nonneg_float, help="final learning rate (--lr / 10; "
                   "resuming with a new --lr: the checkpoint's fraction of it)")
    g.add_argument("--warmup", type=nonneg_int, help="linear warm-up steps (100, at most steps/10)")
    g.add_argument("--weight-decay", type=nonneg_float, help="AdamW weight decay (0.01)")
    g.add_argument("--beta1", type=nonneg_float, help="Adam beta1 (0.9)")
    g.add_argument("--beta2", type=nonneg_float, help="Adam beta2 (0.95)")
    g.add_argument("--grad-clip", type=nonneg_float, help="global gradient-norm clip, 0: off (1)")
    g.add_argument("--seed", type=nonneg_int, help="seed of the weights and batches (1337)")
    add_recompute_arg(g)
    g = p.add_argument_group("evaluation")
    g.add_argument("--eval-every", type=nonneg_int, help="validation every N steps, 0: only "
                   "at the end (250)")
    g.add_argument("--eval-batches", type=positive_int, help="validation batches (the same "
                   f"windows as nntile-eval's; {EVAL_BATCHES})")
    g = p.add_argument_group("data and checkpoints")
    g.add_argument("--data", help="directory with train.bin and val.bin (nanoGPT); "
                   "default: the running Python's standard library, byte-level")
    g.add_argument("--out", help="checkpoint and metrics directory (checkpoints/; when "
                   "resuming a file: that file's directory)")
    g.add_argument("--overwrite", action="store_true", help="start afresh in an --out that "
                   "holds checkpoints (deleting them); with --resume of an earlier checkpoint, "
                   "delete the later ones instead of keeping them aside")
    g.add_argument("--save-every", type=nonneg_int, help="checkpoint every N steps, 0: only "
                   "at the end (500)")
    g.add_argument("--keep", type=nonneg_int, help="keep the newest K checkpoints, 0: all (3)")
    g.add_argument("--resume", metavar="PATH|latest", help="continue from a checkpoint")
    g.add_argument("--init", metavar="CKPT", help="start from a checkpoint's weights (e.g. "
                   "one made by nntile-convert import) with a fresh optimizer")
    g.add_argument("--init-from", metavar="HF_DIR", help="start from a transformers "
                   "directory (save_pretrained: config.json and the weights) with a fresh "
                   "optimizer; its tokenizer is recorded for generation")
    add_verbose_arg(p)
    p.add_argument("--no-progress", action="store_true", help="no progress bar (nor, without "
                   "a terminal, the progress lines that replace it)")
    train_config.add_args(p)
    add_runtime_args(p)
    add_disk_swap_args(p)
    add_dry_run_args(p)
    return p


def parse_args(argv):
    """The flags, over the settings of --train-config."""
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.train_config is not None:
        parser.set_defaults(**train_config.read(args.train_config, parser))
        args = parser.parse_args(argv)
    return args


class Setup:
    """Every setting of a run, resolved and checked before StarPU starts."""


def _given(args, key):
    return getattr(args, key, None) is not None


def _read_config_file(path):
    """The config of a --config file: nntile's or transformers' config.json, of the family
    its model_type names."""
    from nntile.models import config_from_dict
    if not os.path.isfile(path):  # a FIFO would block the read
        raise CLIError(f"--config {path}: " + ("not a regular file" if os.path.exists(path)
                                               else "no such file"))
    try:
        with open(path) as f:
            data = json.load(f)
        config = config_from_dict(data)
    except (OSError, ValueError, TypeError, RecursionError) as exc:
        raise CLIError(f"--config {path}: {exc}") from None
    unknown = config.unknown_keys(data)
    if unknown:
        raise CLIError(f"--config {path}: unknown keys {', '.join(unknown)} (it holds the "
                       "model; the training settings go in --train-config or flags)")
    return config


def _fresh_config(args, vocab_size, seq_len):
    """The config of a fresh model: the family's small default (``small``), changed by the
    model flags."""
    import inspect
    from nntile.models import config_class
    family = config_class(args.model or "gpt2")
    flags = {k: getattr(args, k) for k in ("n_layer", "n_head", "n_kv_head", "n_embd")
             if _given(args, k)}
    for key in flags:
        if key not in inspect.signature(family.small).parameters:
            raise CLIError(f"--{key.replace('_', '-')} does not apply to a {family.name} model")
    try:
        return family.small(vocab_size, seq_len, **flags)
    except ValueError as exc:
        raise CLIError(str(exc).replace(f"{family.__name__}.", "")) from None


def _check_same_tokenizer(flag, base, data, model_vocab):
    """A checkpoint goes on with data of its own tokenizer: the one it records, else (no
    record: an imported model) one of its vocabulary's size."""
    data_vocab, data_tok = data.meta.get("vocab_size"), data.meta.get("tokenizer")
    base_tok = (base.get("tokenizer") or {}).get("name")
    if data_vocab is None or (base_tok and data_tok == base_tok):
        return
    if base_tok or data_vocab != model_vocab:
        raise CLIError(f"{flag} {base.path}: its model has a vocabulary of {model_vocab} tokens"
                       f"{f' ({base_tok} tokenizer)' if base_tok else ''}, the data in "
                       f"{data.path} one of {data_vocab} ({data_tok or '?'} tokenizer): tokenize "
                       "the text with the model's own tokenizer (nntile-prepare --tokenizer DIR, "
                       "the directory holding its tokenizer.json)")


def resolve(args):
    """The run's Setup from the flags, the checkpoint resumed or started from, the data and
    the machine; a CLIError for what conflicts."""
    s = Setup()
    base = _base_checkpoint(args, s)
    config, known, source = _model_config(args, s, base)
    train_prev = (s.ckpt.get("train") or {}) if s.ckpt else {}
    init_prev = (base.get("train") or {}) if base else {}
    s.seq_len = _seq_len(args, config, train_prev, init_prev)
    _train_settings(args, s, train_prev)
    if args.dtype is not None:
        s.dtype = check_dtype(args.dtype)
    elif base is not None:
        s.dtype = base.dtype
    else:
        s.dtype = "fp32"
    config = _data(args, s, base, train_prev, config, known, source)
    # tiling: flags, else the checkpoint's, else chosen for the machine and the run
    given = tiling_from_args(args)
    tiling = dict(given)
    if base is not None:
        # the checkpoint's tiles, batch and seq clipped to this run's shapes
        sizes = {"batch": s.batch_size, "seq": s.seq_len}
        for key, value in (base.get("tiling") or {}).items():
            if value is not None and key not in given:
                tiling[key] = min(value, sizes.get(key, value))
    s.tile_choices = default_tiles(config, s.batch_size, s.seq_len, tiling, args, s.dtype)
    s.tiles = resolve_tiling(tiling, config, s.batch_size, s.seq_len, s.tile_choices)
    return s


def _base_checkpoint(args, s):
    """The checkpoint resumed (``s.ckpt``) or started from (``s.init``), or None; and the
    run's directory ``s.out``."""
    from nntile.checkpoint import Checkpoint, latest, latest_run
    s.ckpt = None
    s.init = None
    s.init_from = None
    s.notes = []
    given = [f"--{k.replace('_', '-')}" for k in ("resume", "init", "init_from")
             if getattr(args, k)]
    if len(given) > 1:
        raise CLIError(f"{' and '.join(given)} conflict: pick one")
    if args.resume:
        if args.resume == "latest":
            out = args.out or "checkpoints"
            if latest(out) is None and latest_run(out) is not None:
                out = latest_run(out)  # the newest of the runs `make train` keeps in out
            path = latest(out)
            if path is None:
                raise CLIError(f"--resume latest: no checkpoint (ckpt-<step>.h5) in {out}")
            resumed_out = out
        else:
            path = args.resume
            if not os.path.exists(path):
                raise CLIError(f"--resume {path}: no such checkpoint file")
        s.ckpt = Checkpoint(path)
        base = s.ckpt
    elif args.init:
        s.init = Checkpoint(args.init)
        base = s.init
    else:
        base = None
    if args.resume == "latest":
        s.out = resumed_out
    else:
        s.out = args.out or (os.path.dirname(os.path.abspath(args.resume)) if args.resume
                             else "checkpoints")
    return base


def _model_config(args, s, base):
    """(the model's config, None until the data's vocabulary is known where the flags build
    it; the config known from a checkpoint or a transformers directory; where it came
    from)."""
    # model configuration: of a checkpoint, a transformers directory, a config file or flags
    if base is not None:
        known, source = base.config, f"checkpoint {base.path}"
    elif args.init_from:
        from nntile.transformers_io import read_config
        s.init_from = args.init_from
        known, s.notes = read_config(args.init_from)
        source = args.init_from
    else:
        known = source = None
    if args.config is not None:
        given = [f"--{k.replace('_', '-')}" for k in CONFIG_FLAGS if _given(args, k)]
        if given:
            raise CLIError(f"--config and {', '.join(given)} conflict: the model comes from "
                           "the config file")
        config = _read_config_file(args.config)
        if known is not None:
            # the model must be the same; how attention is computed may differ
            if not config.same_model(known):
                raise CLIError(f"--config {args.config} differs from the model of {source}")
            config = known
    elif known is not None:
        config = known
        for key, name in CONFIG_FLAGS.items():
            if _given(args, key) and getattr(args, key) != getattr(config, name):
                raise CLIError(f"--{key.replace('_', '-')} {getattr(args, key)} conflicts with "
                               f"{source} ({config.field_name(name)} = {getattr(config, name)})")
    else:
        config = None  # built once the vocabulary is known (from the data)
    if config is not None:
        if args.model and args.model != config.model_type:
            raise CLIError(f"--model {args.model} conflicts with the {config.model_type} model "
                           f"of {source or args.config}")
        family_model(config)
    return config, known, source


def _seq_len(args, config, train_prev, init_prev):
    """--seq-len, else the checkpoint's, else the model's positions up to 1024; checked
    against the model's positions."""
    if _given(args, "seq_len"):
        seq_len = args.seq_len
    elif "seq_len" in train_prev or "seq_len" in init_prev:
        seq_len = int(train_prev.get("seq_len", init_prev.get("seq_len")))
    elif config is not None:
        seq_len = min(config.max_position_embeddings, 1024)
    else:
        seq_len = DEFAULT_SEQ_LEN
    return check_seq_len(config, seq_len) if config is not None else seq_len


def _train_settings(args, s, train_prev):
    """The training settings of TRAIN_DEFAULTS on ``s``, checked."""
    # training settings: flag, else the resumed checkpoint, else the default
    for key, default in TRAIN_DEFAULTS.items():
        if _given(args, key):
            value = getattr(args, key)
        elif key == "min_lr" and key in train_prev and _given(args, "lr"):
            # a new peak: the final rate keeps its fraction of it (else it may exceed it)
            value = s.lr * train_prev["min_lr"] / train_prev["lr"]
        elif key in train_prev:
            value = train_prev[key]
        elif key == "warmup":
            value = min(default, s.steps // 10)
        elif key == "min_lr":  # a tenth of the peak, whichever peak was asked for
            value = s.lr / 10
        else:
            value = default
        setattr(s, key, value)
    if s.steps < 1:
        raise CLIError(f"--steps {s.steps} must be >= 1")
    s.complete = None  # a resumed run with nothing left to train: what to say instead
    if s.ckpt is not None and s.ckpt.step >= s.steps:
        where = "past" if s.ckpt.step > s.steps else "the end of"
        given = "" if _given(args, "steps") else " (the checkpoint's)"
        s.complete = (f"{s.ckpt.path} is at step {s.ckpt.step}, {where} --steps {s.steps}"
                      f"{given}: nothing to train. To go on, pass a larger --steps, e.g. "
                      f"--steps {2 * s.ckpt.step} (the learning rate then decays over the "
                      "new total)")
        if s.ckpt.step > s.steps:  # asked for less than is done: an error
            raise CLIError(s.complete)
    if s.min_lr > s.lr:
        raise CLIError(f"--min-lr {s.min_lr} is larger than --lr {s.lr}")
    if s.warmup > s.steps:
        raise CLIError(f"--warmup {s.warmup} is longer than --steps {s.steps}")
    for key in ("beta1", "beta2"):
        if not 0 <= getattr(s, key) < 1:
            raise CLIError(f"--{key} {getattr(s, key)} must be in [0, 1)")



def _data(args, s, base, train_prev, config, known, source):
    """The data (``s.data``), its tokenizer (``s.tokenizer``) and the model's config, built
    from the flags and the data's vocabulary where no checkpoint or directory gave it; the
    vocabularies checked against each other."""
    # data
    from nntile.data import TokenData, default_data_dir
    data_dir = args.data or (train_prev.get("data") if train_prev else None)
    if data_dir is None:
        data_dir = default_data_dir(fallback_parent=s.out)
    s.data = TokenData(data_dir)
    s.data_dir = os.path.abspath(data_dir)
    s.warnings = []
    was = (s.ckpt.get("data") or {}) if s.ckpt else {}
    now = {split: len(s.data.splits[split]) for split in ("train", "val")}
    if was and any(was.get(f"{split}_tokens", n) != n for split, n in now.items()):
        s.warnings.append(
            f"the data differs from the checkpoint's: {s.data_dir} holds "
            f"{now['train']:,} train and {now['val']:,} val tokens, {s.ckpt.path} was trained "
            f"on {was.get('train_tokens', 0):,} and {was.get('val_tokens', 0):,} (in "
            f"{was.get('path', '?')}); training goes on with other batches than the first run")
    if config is None:
        config = _fresh_config(args, args.vocab_size or s.data.vocab_hint, s.seq_len)
        family_model(config)
    if args.attention is not None:  # argparse checked it
        config = config.replace(attention=args.attention)
    s.config = config
    if s.init_from and not getattr(args, "dry_run", False):  # every weight, before StarPU starts
        from nntile.transformers_io import read_model_state
        s.init_state = read_model_state(s.init_from, config, np.float64 if s.dtype == "fp64"
                                        else np.float32)
    # the model's own tokenizer, where it comes with one: the data must be made with it
    model_tokenizer = None
    if s.init_from:
        from nntile.data import get_tokenizer
        from nntile.transformers_io import tokenizer_info
        model_tokenizer = tokenizer_info(s.init_from)
        if model_tokenizer is not None:
            loaded = get_tokenizer(model_tokenizer["name"], model_tokenizer["path"])
            s.data.check_vocabulary(config.vocab_size, loaded, source)
    if known is None and args.config is not None:  # a model of its own: of the data's tokens
        s.data.check_vocabulary(config.vocab_size, None, f"the model of --config {args.config}",
                                exact=True)
    s.data.check_vocabulary(config.vocab_size, None, source or "the model")
    if base is not None:
        _check_same_tokenizer("--resume" if s.ckpt is not None else "--init", base, s.data,
                              config.vocab_size)
    s.data.check(config.vocab_size, s.seq_len)
    tok_prev = (base.get("tokenizer") if base else None) or {}
    s.tokenizer = model_tokenizer or {
        "name": s.data.meta.get("tokenizer") or tok_prev.get("name") or s.data.tokenizer,
        "path": s.data.meta.get("tokenizer_path", tok_prev.get("path"))}

    return config


def prepare_out(s, args):
    out = s.out
    if os.path.exists(out) and not os.path.isdir(out):
        raise CLIError(f"--out {out} exists and is not a directory")
    try:
        os.makedirs(out, exist_ok=True)
        fd, probe = tempfile.mkstemp(prefix=".write-test-", dir=out)
        os.close(fd)
        os.unlink(probe)
    except OSError as exc:
        raise CLIError(f"--out {out} is not writable: {exc.strerror or exc}") from None
    if launcher_rank()[0] == 0:  # under MPI, rank 0 writes what --out holds
        s.lock = OutLock(out)  # before anything in --out is read or changed
    blocking = _directory_where_a_file_goes(out)
    if blocking:
        raise CLIError(f"--out {out} holds a directory {blocking}, where the run writes or "
                       f"deletes its file {blocking}: move that directory away, or use "
                       "another --out")
    from nntile.checkpoint import list_checkpoints
    existing = list_checkpoints(out)
    if existing and not args.overwrite:
        newest = os.path.basename(existing[-1][1])
        if s.ckpt is None:
            raise CLIError(f"--out {out} already holds checkpoints (newest {newest}): continue "
                           "with --resume latest, or start afresh with --overwrite or another "
                           "--out")
        if not os.path.samefile(os.path.dirname(os.path.abspath(s.ckpt.path)), out):
            raise CLIError(f"--out {out} holds checkpoints of another run (newest {newest}) "
                           f"than {s.ckpt.path}: resume into that checkpoint's own directory, "
                           "another --out, or delete them with --overwrite")


def _directory_where_a_file_goes(out):
    """The name of an entry of --out that is a directory where the run writes or deletes a
    file (a checkpoint, a partial save, the metrics, the plot), else None. Found before
    anything is deleted: the run would stop at it part-way, its checkpoints gone."""
    from nntile.checkpoint import NAME_RE, PARTIAL_RE
    for name in sorted(os.listdir(out)):
        path = os.path.join(out, name)
        if ((name in (METRICS, "loss.png") or NAME_RE.match(name) or PARTIAL_RE.match(name))
                and os.path.isdir(path) and not os.path.islink(path)):
            return name
    return None


@contextlib.contextmanager
def output_errors(path):
    """A failure to write an output (a full disk, a lost permission) ends the run with one
    line; the checkpoints already saved stay as they are."""
    try:
        yield
    except OSError as exc:
        raise CLIError(f"cannot write {path}: {exc.strerror or exc}") from None


def start_outputs(s, overwrite, echo):
    """Once the run's state is loaded: drop what an earlier run left in --out (a fresh run
    with --overwrite) and the partial files of saves that a killed run left behind. Resuming
    an earlier checkpoint starts a new line of work: the checkpoints after it, and the
    metrics and plot that go with them, move to a directory of their own (deleted with
    --overwrite), so that neither pruning nor the new line's saves replace them."""
    from nntile.checkpoint import list_checkpoints, remove_partial
    metrics = os.path.join(s.out, METRICS)
    with output_errors(s.out):
        remove_partial(s.out)
        own = s.ckpt is not None and os.path.samefile(
            os.path.dirname(os.path.abspath(s.ckpt.path)), s.out)
        start = s.ckpt.step if own else -1
        later = [path for step, path in list_checkpoints(s.out) if step > start]
        if later and own and not overwrite:
            aside = _new_dir(os.path.join(s.out, f"abandoned-after-step-{start}"))
            for path in later:
                os.rename(path, os.path.join(aside, os.path.basename(path)))
            for name in (METRICS, "loss.png", *event_files(s.out)):
                if os.path.exists(os.path.join(s.out, name)):
                    shutil.copy2(os.path.join(s.out, name), aside)
            echo(f"nntile-train: resuming at step {start}: the {len(later)} later checkpoints "
                 f"of the run it continued are kept in {aside}")
        else:
            for path in later:
                os.unlink(path)
    with output_errors(metrics):
        if s.ckpt is None:  # a fresh run: the metrics of the one --overwrite replaces go
            for name in (METRICS, *event_files(s.out)):
                if os.path.exists(os.path.join(s.out, name)):
                    os.unlink(os.path.join(s.out, name))
        else:
            _truncate_metrics(metrics, s.ckpt.step)


def _new_dir(base):
    """base, or base-2, base-3, ...: the first that does not exist, created."""
    path, n = base, 1
    while True:
        try:
            os.mkdir(path)
            return path
        except FileExistsError:
            n += 1
            path = f"{base}-{n}"


def _truncate_metrics(path, step):
    """Keep the records up to the resumed step (a later crash may have logged more)."""
    if not os.path.exists(path):
        return
    kept = []
    with open(path) as f:
        for line in f:
            try:
                record = json.loads(line)
            except ValueError:
                continue  # a line cut short by a kill
            if isinstance(record, dict) and record.get("step", 0) <= step:
                kept.append(json.dumps(record))
    tmp = path + ".tmp"
    with open(tmp, "w") as f:
        f.write("".join(line + "\n" for line in kept))
    os.replace(tmp, path)


def read_metrics(path):
    records = []
    if os.path.exists(path):
        with open(path) as f:
            for line in f:
                try:
                    records.append(json.loads(line))
                except ValueError:
                    pass
    return records


class StopRequest:
    """SIGINT/SIGTERM: the first ends the run after the current step, a second abandons it."""

    def __init__(self):
        self.signum = None
        self.abandon = False
        self.told = 0
        # Under MPI every rank must run the same steps: no rank may drop a step half-way.
        self.can_abandon = True

    def __call__(self, signum, frame):
        # No printing here: the main thread may be inside a write to the same stream.
        if self.signum is None:
            self.signum = signum
        elif self.can_abandon:
            self.abandon = True

    def agreed(self, ctx):
        """Whether to stop before the next step. Under MPI the ranks may get the signal at
        different steps, so they agree (a max over ranks) and all stop at the same one."""
        if ctx.world_size == 1:
            return bool(self.signum)
        from nntile.distributed import mpi
        signum = ctx.comm.allreduce(self.signum or 0, op=mpi().MAX)
        if signum and not self.signum:
            self.signum = signum
        return bool(signum)

    def tell(self, echo):
        """Say (once each) what the signals asked for; called from the main loop."""
        if self.signum and self.told == 0:
            again = ("send it again to abandon the step" if self.can_abandon else
                     "all ranks stop after the same step")
            echo(f"nntile-train: {signal.Signals(self.signum).name}: finishing this step, then "
                 f"saving a checkpoint ({again})")
            self.told = 1
        if self.abandon and self.told == 1:
            echo("nntile-train: second signal: abandoning the step")
            self.told = 2

    def install(self):
        for sig in (signal.SIGINT, signal.SIGTERM):
            signal.signal(sig, self)

    @property
    def exit_code(self):
        return 128 + self.signum if self.signum else 0


def describe_tiles(tiles, sizes):
    """"batch 4 of 8 (2 tiles), embd 64 of 128 (2 tiles); the others whole" from the tiles
    and the dimensions' sizes."""
    cut = [f"{key} {tile} of {sizes[key]} ({-(-sizes[key] // tile)} tiles)"
           for key, tile in tiles.items() if tile is not None and tile < sizes[key]]
    if not cut:
        return "one per dimension"
    return ", ".join(cut) + ("; the others whole" if len(cut) < len(tiles) else "")


def banner(s, ctx, start_step, verbose=False):
    """What the run is, in a few lines (``verbose``: every runtime setting, too)."""
    c = s.config
    what = (f"resuming {s.ckpt.path} at step {start_step}" if s.ckpt else
            f"weights of {s.init.path}" if s.init else
            f"weights of {s.init_from}" if s.init_from else "fresh weights")
    sizes = dict({key: size for key, (size, _) in c.sizes().items()},
                 batch=s.batch_size, seq=s.seq_len)
    step = f"{s.batch_size} sequences of {s.seq_len} tokens"
    if s.grad_accum > 1:
        step = (f"{s.grad_accum} micro-batches of {step} (gradient accumulation: "
                f"{s.grad_accum * s.batch_size * s.seq_len:,} tokens)")
    lines = [f"nntile-train: {c.name}, {c.num_parameters() / 1e6:.2f}M parameters "
             f"({c.describe()}), {s.dtype}, {c.attention} attention, {what}",
             f"  {plural(s.steps, 'step')}, each {step}; tiles: {describe_tiles(s.tiles, sizes)}",
             f"  data {s.data_dir} ({len(s.data.splits['train']):,} train tokens); out {s.out}",
             ctx.describe() if verbose else "  " + ctx.describe(verbose=False)]
    if ctx.world_size > 1:
        lines.append(f"  {ctx.world_size} MPI ranks, distribution "
                     f"{ctx.distribution.describe()}")
    return "\n".join(lines)


class Progress:
    """The steps' progress: tqdm's bar on a terminal; elsewhere (a log file, a pipe) a plain
    line now and then (each 5% of the steps, at least once a minute, and the last) instead
    of the bar's carriage-return redraws."""
    EVERY_S = 60.0

    def __init__(self, tqdm, total, initial, enabled, stream=None):
        self.stream = stream or sys.stderr
        self.total, self.bar, self.lines = total, None, False
        if enabled and self.stream.isatty():
            self.bar = tqdm(total=total, initial=initial, unit="step", file=self.stream,
                            dynamic_ncols=True, smoothing=0.1)
        elif enabled:
            self.lines = True
            self.every = max(1, (total - initial) // 20)
            self.start = self.last = time.perf_counter()
            self.initial = initial

    def update(self, step, text):
        if self.bar is not None:
            self.bar.set_postfix_str(text, refresh=False)
            self.bar.update(1)
        elif self.lines:
            now = time.perf_counter()
            done = step - self.initial
            if done % self.every and step != self.total and now - self.last < self.EVERY_S:
                return
            left = (now - self.start) / done * (self.total - step)
            print(f"step {step}/{self.total}: {text} | {_duration(now - self.start)} elapsed, "
                  f"{_duration(left)} left", file=self.stream, flush=True)
            self.last = now

    def close(self):
        if self.bar is not None:
            self.bar.close()


def plot_losses(records, path):
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return None
    steps = [r["step"] for r in records]
    fig, ax = plt.subplots(figsize=(7, 4))
    ax.plot(steps, [r["loss"] for r in records], label="train", linewidth=1)
    val = [(r["step"], r["val_loss"]) for r in records if r.get("val_loss") is not None]
    if val:
        ax.plot(*zip(*val), "o-", label="validation")
    ax.set_xlabel("step")
    ax.set_ylabel("loss (nats/token)")
    ax.grid(alpha=0.3)
    ax.legend()
    fig.tight_layout()
    tmp = path + ".tmp.png"
    try:
        with output_errors(path):
            fig.savefig(tmp, dpi=100)
            os.replace(tmp, path)
    finally:
        plt.close(fig)
        if os.path.exists(tmp):
            os.unlink(tmp)
    return path


def _duration(seconds):
    m, sec = divmod(int(round(seconds)), 60)
    h, m = divmod(m, 60)
    return f"{h}h{m:02d}m{sec:02d}s" if h else f"{m}m{sec:02d}s" if m else f"{seconds:.1f}s"


def resolved_settings(s, args):
    """{dest: value} that make this run again, for --print-config: the model as it came
    (a checkpoint, a transformers directory, a config file or the model flags)."""
    settings = dict(vars(args), seq_len=s.seq_len, dtype=s.dtype, data=s.data_dir,
                    out=os.path.abspath(s.out), attention=s.config.attention,
                    **{k: getattr(s, k) for k in TRAIN_DEFAULTS},
                    **{f"tile_{key}": value for key, value in s.tiles.items()})
    for key in ("resume", "init", "init_from", "config"):
        if settings[key] is not None:
            path = s.ckpt.path if key == "resume" else settings[key]
            settings[key] = os.path.abspath(path)
            return settings
    settings["model"] = s.config.model_type
    family = s.config.small.__func__.__code__.co_varnames  # the flags the family takes
    for key, name in CONFIG_FLAGS.items():
        if key in family or key == "vocab_size":
            settings[key] = getattr(s.config, name)
    return settings


def checked(args):
    """(Setup, Distribution, memory estimate) of a run resolved and accepted by the memory
    pre-check, before StarPU starts; None where a resumed run has nothing left to train."""
    s = resolve(args)
    if s.complete:
        print(f"nntile-train: {s.complete}")
        return None
    distribution = resolve_distribution(args, s.batch_size, s.tiles, s.config)
    from nntile import memory  # the disk swap before the pre-check, which counts the disk
    apply_disk_swap(args, lambda: memory.estimate(s.config, s.batch_size, s.seq_len, s.tiles,
                                                  s.dtype))
    from nntile.fit import preflight  # before StarPU starts: refuse what cannot fit
    est = preflight(s.config, s.batch_size, s.seq_len, s.tiles, s.dtype, ncuda=args.ncuda,
                    grad_clip=bool(s.grad_clip), prog="nntile-train", distribution=distribution,
                    recompute=args.recompute)
    s.recompute = est.recompute
    return s, distribution, est


def dry_run(args):
    """Print the plan of the run (nntile.plan) and return 0; StarPU does not start."""
    from nntile.plan import plan
    with planned_machine(args):
        run = checked(args)
        if run is None:
            return 0
        s, _, est = run
        c = s.config
        title = (f"nntile-train --dry-run: {c.name}, {c.num_parameters() / 1e6:,.2f}M "
                 f"parameters ({c.describe()}), {s.dtype}, {s.grad_accum} x {s.batch_size} "
                 f"sequences of {s.seq_len} tokens a step")
        print(plan(est, c, s.batch_size, s.seq_len, s.dtype, s.tile_choices, args.ncuda,
                   s.grad_accum).text(title), flush=True)
    return 0


def print_config(args):
    """Write the run's resolved settings as a training config (nntile.train_config)."""
    sys.stdout.write(train_config.write(resolved_settings(resolve(args), args), build_parser()))
    return 0


def train_main(argv=None):
    args = parse_args(argv)
    if args.print_config:
        return print_config(args)
    if args.dry_run or args.machine:
        return dry_run(args)
    run = checked(args)
    if run is None:
        return 0
    s, distribution, est = run
    prepare_out(s, args)
    from tqdm import tqdm
    lead, _ = launcher_rank()  # under mpirun only rank 0 talks and writes metrics

    def echo(text):
        if lead == 0:
            tqdm.write(text, file=sys.stderr)

    for warning in s.warnings:
        echo(f"nntile-train: warning: {warning}")

    stop = StopRequest()
    # described once the state is loaded
    ctx = start_context(args, verbose=False, distribution=distribution, run_bytes=est.total,
                        tiles=s.tile_choices, training=s.dtype, run_breakdown=est.breakdown,
                        run_batch=s.batch_size)
    ctx.recompute = s.recompute
    stop.install()  # after StarPU started: its handlers must not replace ours
    stop.can_abandon = ctx.world_size == 1
    try:
        return _run(s, args, ctx, stop, echo, tqdm)
    finally:
        ctx.shutdown()


def _start_training(s, ctx):
    """(the TrainingLoop, the batch sampler, the step to start at) of the run: the model's
    weights and the optimizer's states from the resumed checkpoint, the --init one, the
    transformers directory or the seed."""
    from nntile.checkpoint import CheckpointError
    from nntile.data import BatchSampler
    from nntile.optim import LRSchedule
    from nntile.training import TrainingLoop
    model = family_model(s.config)(s.config, tiling=model_tiling(s.tiles), dtype=s.dtype,
                                   recompute=s.recompute.value)
    loop = TrainingLoop(model, ctx, s.grad_accum,
                        lr=LRSchedule(s.lr, s.warmup, s.steps, s.min_lr),
                        betas=(s.beta1, s.beta2), eps=s.eps, weight_decay=s.weight_decay,
                        max_grad_norm=s.grad_clip or None)
    sampler = BatchSampler(s.data.splits["train"], s.batch_size, s.seq_len, s.seed)
    if s.ckpt is None:
        if s.init is not None:
            s.init.load_params(model)
        elif s.init_from is not None:
            model.load_state_dict(s.init_state)
        else:
            model.init_weights(s.seed)
        return loop, sampler, 0
    s.ckpt.load_params(model)
    s.ckpt.load_optimizer(loop.opt)
    if loop.opt.step_count != s.ckpt.step:
        raise CheckpointError(f"checkpoint {s.ckpt.path}: optimizer step_count "
                              f"{loop.opt.step_count} differs from step {s.ckpt.step}")
    data_pos = s.ckpt.get("data") or {}
    try:
        sampler.set_state({"bit_generator": s.ckpt.get("rng"),
                           "batches_drawn": data_pos.get("batches_drawn", 0)})
    except ValueError as exc:
        raise CheckpointError(f"checkpoint {s.ckpt.path}: attribute 'rng': {exc}") from None
    return loop, sampler, s.ckpt.step


def checkpoint_meta(s, opt, sampler, step):
    """What a checkpoint of this run records beside the tensors (nntile.checkpoint.save)."""
    state = sampler.state()
    return dict(
        config=s.config.to_dict(), tiling=s.tiles, dtype=s.dtype, step=step,
        schedule=opt.schedule.state(),
        optimizer=dict(name="AdamW", step_count=opt.step_count, betas=list(opt.betas),
                       eps=opt.eps, weight_decay=opt.weight_decay,
                       max_grad_norm=opt.max_grad_norm, decoupled=opt.decoupled),
        rng=state["bit_generator"],
        data=dict(path=s.data_dir, batches_drawn=state["batches_drawn"],
                  tokens_drawn=state["tokens_drawn"],
                  train_tokens=len(s.data.splits["train"]),
                  val_tokens=len(s.data.splits["val"])),
        train={**{k: getattr(s, k) for k in TRAIN_DEFAULTS}, "seq_len": s.seq_len,
               "data": s.data_dir},
        tokenizer=s.tokenizer,
        **({"source": {"transformers": os.path.abspath(s.init_from)}} if s.init_from
           else {}))


class Saver:
    """Saves the run's checkpoints into its directory, keeping the last ``--keep``."""

    def __init__(self, s, loop, sampler, ctx, watchdog):
        self.s, self.loop, self.sampler, self.ctx, self.watchdog = s, loop, sampler, ctx, watchdog
        self.step = s.ckpt.step if s.ckpt else None
        self.path = s.ckpt.path if s.ckpt else None

    def save(self, step):
        from nntile.checkpoint import checkpoint_name, prune, save
        path = os.path.join(self.s.out, checkpoint_name(step))
        with self.watchdog.paused():
            save(path, self.loop.model, self.loop.opt,  # collective under MPI
                 checkpoint_meta(self.s, self.loop.opt, self.sampler, step))
        if self.ctx.rank == 0:
            prune(self.s.out, self.s.keep, keep_path=path)
        self.step, self.path = step, path


class Outputs:
    """Where each step's record goes: metrics.jsonl and TensorBoard's event file (rank 0
    writes them), the progress bar."""

    def __init__(self, s, args, ctx, tqdm, start_step):
        self.metrics_path = os.path.join(s.out, METRICS)
        # the loss is the same number on every rank (to_array gathers it); rank 0 logs it
        with output_errors(self.metrics_path):
            self.metrics = open(self.metrics_path if ctx.rank == 0 else os.devnull, "a")
        with output_errors(s.out):
            self.events = EventWriter(s.out) if ctx.rank == 0 else None  # TensorBoard's
        self.bar = Progress(tqdm, s.steps, start_step, not args.no_progress and ctx.rank == 0)

    def write(self, record):
        with output_errors(self.metrics_path):
            self.metrics.write(json.dumps(record) + "\n")
            self.metrics.flush()
        if self.events is not None:
            with output_errors(self.events.path):
                self.events.scalars(record["step"],
                                    {k: v for k, v in record.items() if k != "step"})

    def close(self):
        self.bar.close()
        with output_errors(self.metrics_path):
            self.metrics.close()
            if self.events is not None:
                self.events.close()


def _run(s, args, ctx, stop, echo, tqdm):
    from nntile.data import eval_batches
    from nntile.distributed import Watchdog
    from nntile.nn.warm_up import before_first_step
    loop, sampler, start_step = _start_training(s, ctx)
    if ctx.rank == 0:
        start_outputs(s, args.overwrite, echo)
    for note in s.notes:
        echo(f"nntile-train: note: {note}")
    echo(banner(s, ctx, start_step, args.verbose))
    pin_wait_s, _, _ = before_first_step(loop.model, s.batch_size, s.seq_len)
    if pin_wait_s >= 1.0:
        echo(f"nntile-train: waited {pin_wait_s:.0f} s for host memory pinned ahead")
    val_batches = eval_batches(s.data.splits["val"], s.batch_size, s.seq_len, s.eval_batches)
    out = Outputs(s, args, ctx, tqdm, start_step)
    watchdog = Watchdog(ctx.comm, "nntile-train", ctx.mpi_timeout)  # a dead rank ends all
    saver = Saver(s, loop, sampler, ctx, watchdog)
    run_start = time.perf_counter()
    try:
        run = _train_steps(s, args, ctx, stop, echo, (loop, sampler, val_batches), start_step,
                           out, saver, watchdog)
        stop.tell(echo)
        if saver.step != run["step"]:
            saver.save(run["step"])
    finally:
        watchdog.stop()
        out.close()
    if ctx.rank == 0:
        print(_summary(s, stop, run, start_step, time.perf_counter() - run_start, saver.path,
                       out.metrics_path), flush=True)
    return stop.exit_code


def _train_steps(s, args, ctx, stop, echo, training, start_step, out, saver, watchdog):
    """Train from ``start_step`` until --steps or a stop: each step's record written, the
    validation loss every --eval-every steps and at the end, a checkpoint every --save-every
    steps and at the end. {"step", "first_loss", "last_loss", "val_loss", "tokens"}."""
    loop, sampler, val_batches = training
    tokens_per_step = s.batch_size * s.seq_len * s.grad_accum
    flops_tok = s.config.flops_per_token(s.seq_len)
    note_calibration = calibration_note(ctx, echo, args.verbose)
    run = dict(step=start_step, first_loss=None, last_loss=None, val_loss=None, tokens=0)

    def abandon():
        stop.tell(echo)
        return stop.abandon

    last_time = time.perf_counter()
    while run["step"] < s.steps and not stop.agreed(ctx):
        sampler_state = sampler.state()
        result = loop.step(sampler.next, abandon)
        if result is None:
            ctx.wait()
            sampler.set_state(sampler_state)  # the abandoned step's batches come again
            break
        # the norm that clipping measured (read here, no second pass); None unclipped
        grad_norm = loop.opt.grad_norm() if loop.opt.max_grad_norm else None
        step = run["step"] = run["step"] + 1
        if not math.isfinite(result.loss):
            kept = (f"the last checkpoint, {saver.path}, is kept" if saver.path
                    else "no checkpoint was saved")
            raise CLIError(f"the loss is {result.loss} at step {step}: training diverged (NaN "
                           f"or inf; lower --lr?); {kept}")
        now = time.perf_counter()
        tokens_s = tokens_per_step / (now - last_time)
        last_time = now
        run["tokens"] += tokens_per_step
        tflops = tokens_s * flops_tok / 1e12
        record = dict(step=step, loss=result.loss, lr=result.lr, grad_norm=grad_norm,
                      tokens_per_s=tokens_s, tflops=tflops)
        if step == s.steps or (s.eval_every and step % s.eval_every == 0):
            run["val_loss"] = record["val_loss"] = loop.evaluate(val_batches)
            echo(f"step {step}: val loss {run['val_loss']:.4f} (train loss {result.loss:.4f})")
            last_time = time.perf_counter()  # evaluation time is not training time
        out.write(record)
        if run["first_loss"] is None:
            run["first_loss"] = result.loss
        run["last_loss"] = result.loss
        out.bar.update(step, f"loss {result.loss:.4f} | {tokens_s:,.0f} tok/s | "
                             f"{tflops:.4f} TFLOP/s")
        watchdog.beat()
        note_calibration()
        if step == s.steps or (s.save_every and step % s.save_every == 0):
            saver.save(step)
    return run


def _summary(s, stop, run, start_step, elapsed, checkpoint, metrics_path):
    """The line nntile-train ends with (and the loss plot it names)."""
    records = read_metrics(metrics_path)
    png = plot_losses(records, os.path.join(s.out, "loss.png")) if records else None
    rate = run["tokens"] / elapsed if elapsed > 0 and run["tokens"] else 0.0
    parts = [f"nntile-train: step {run['step']}/{s.steps}"]
    if stop.signum:
        parts[0] += f" (stopped by {signal.Signals(stop.signum).name})"
    parts.append(f"{plural(run['step'] - start_step, 'step')} in {_duration(elapsed)}")
    if run["last_loss"] is not None:
        parts.append(f"loss {run['first_loss']:.4f} -> {run['last_loss']:.4f}")
    if run["val_loss"] is not None:
        parts.append(f"val loss {run['val_loss']:.4f}")
    if rate:
        flops_tok = s.config.flops_per_token(s.seq_len)
        parts.append(f"{rate:,.0f} tokens/s, {rate * flops_tok / 1e12:.4f} TFLOP/s")
    parts.append(f"checkpoint {checkpoint}")
    if png:
        parts.append(f"plot {png}")
    return ", ".join(parts)


main = program_main(train_main, "nntile-train", __name__)
