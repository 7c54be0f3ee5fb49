"""Token data in nanoGPT's format, and ``nntile-prepare`` that makes it.

A data directory holds ``train.bin`` and ``val.bin``: flat arrays of token ids, read through
``np.memmap``: uint16 as nanoGPT writes them, or uint32 for a vocabulary past 65,536 tokens
(Llama 3's 128,256), as ``meta.json`` says. An optional ``meta.json`` names the tokenizer,
the vocabulary size, the ids' dtype (none: uint16) and each file's count of tokens (a file cut
short, even at a token's boundary, is refused).
Training batches are windows at random offsets drawn from a seeded numpy Generator, whose state
is saved in checkpoints; evaluation batches are fixed windows spread evenly over a split.
"""
import contextlib
import hashlib
import json
import os
import shutil
import sys
import sysconfig
import tempfile

import numpy as np

from nntile.cli_common import CLIError, ArgumentParser, OutLock, plural, program_main

SPLITS = ("train", "val")
TOKEN_DTYPE = np.dtype(np.uint16)  # nanoGPT's, and the default of files with no meta.json
TOKEN_DTYPES = ("uint16", "uint32")


def token_dtype(vocab_size):
    """The dtype of token files for a vocabulary: uint16 when its ids fit, else uint32."""
    if vocab_size > 2**32:
        raise CLIError(f"a vocabulary of {vocab_size} tokens is more than uint32 data files "
                       "can hold")
    return TOKEN_DTYPE if vocab_size <= 2**16 else np.dtype(np.uint32)
BYTE_VOCAB = 256
GPT2_EOT = 50256
DEFAULT_VAL_FRACTION = 0.1
STDLIB_CORPUS_VERSION = 1
# validation batches: nntile-train's --eval-batches and nntile-eval's --batches
EVAL_BATCHES = 8


def _first_line(exc):
    text = str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__


# ---- tokenizers --------------------------------------------------------------------------

class ByteTokenizer:
    """Every byte of UTF-8 text is a token; always available."""
    name = "byte"
    vocab_size = BYTE_VOCAB
    eot = None

    def encode(self, data):
        if isinstance(data, str):
            data = data.encode("utf-8")
        return np.frombuffer(data, dtype=np.uint8).astype(TOKEN_DTYPE)

    def decode(self, ids):
        return bytes(int(i) for i in ids).decode("utf-8", errors="replace")


class HFTokenizer:
    """transformers' GPT2TokenizerFast, loaded from local files only: nntile downloads
    nothing, so a run never depends on the network or changes with what a hub serves."""

    def __init__(self, name_or_path):
        self.name = "gpt2"
        self.path = name_or_path
        if name_or_path != "gpt2" and not os.path.exists(name_or_path):  # not a cache name
            raise CLIError(self._missing("no such directory"))
        if os.path.isdir(name_or_path) and not any(
                os.path.isfile(os.path.join(name_or_path, f)) for f in ("tokenizer.json",
                                                                        "vocab.json")):
            raise CLIError(self._missing("it holds no tokenizer.json"))
        try:
            from transformers import GPT2TokenizerFast
            import transformers
            transformers.logging.set_verbosity_error()
            self.tok = GPT2TokenizerFast.from_pretrained(name_or_path, local_files_only=True)
        except Exception as exc:  # ImportError, OSError, ValueError...: all mean "not here"
            raise CLIError(self._missing(_first_line(exc))) from None
        probe = "def hello(): return 'world'\n"
        if len(self.tok) < 2 or self.tok.decode(self.tok.encode(probe)) != probe:
            # transformers builds an empty tokenizer when it finds no files
            raise CLIError(self._missing("no tokenizer files were found"))
        self.vocab_size = len(self.tok)
        self.dtype = token_dtype(self.vocab_size)
        self.eot = self.tok.eos_token_id

    def _missing(self, reason):
        """What is missing, and how to provide it."""
        if self.path != "gpt2":
            where = f"the tokenizer directory {self.path} cannot be loaded ({reason})"
        else:
            where = (f"the tokenizer {self.path!r} is not on this machine ({reason}), and "
                     "nntile downloads nothing")
        return (f"{where}: pass --tokenizer DIR, a directory holding the tokenizer's "
                "tokenizer.json (as the model's files on the Hugging Face hub have it, or as "
                "transformers' save_pretrained writes it), or --tokenizer byte")

    def encode(self, data):
        if isinstance(data, bytes):
            data = data.decode("utf-8", errors="replace")
        return np.asarray(self.tok.encode(data), dtype=self.dtype)

    def decode(self, ids):
        return self.tok.decode([int(i) for i in ids])


class TokenizerFile:
    """A directory's ``tokenizer.json``, read by the tokenizers library: the tokenizer of any
    family that transformers saves (Llama's, SmolLM's, GPT-2's). Text is encoded with the
    tokenizer's own special tokens (a Llama tokenizer starts each text with its BOS); the
    end-of-text token is tokenizer_config.json's ``eos_token``."""
    name = "tokenizer.json"

    def __init__(self, directory):
        self.path = os.path.abspath(directory)
        file = os.path.join(self.path, "tokenizer.json")
        try:
            from tokenizers import Tokenizer
            self.tok = Tokenizer.from_file(file)
        except Exception as exc:  # ImportError, or the library's own for a bad file
            raise CLIError(f"the tokenizer {file} cannot be loaded ({_first_line(exc)})") \
                from None
        self.vocab_size = self.tok.get_vocab_size(with_added_tokens=True)
        self.dtype = token_dtype(self.vocab_size)
        self.eot = self._end_of_text()

    def _end_of_text(self):
        try:
            with open(os.path.join(self.path, "tokenizer_config.json")) as f:
                eos = json.load(f).get("eos_token")
        except (OSError, ValueError, AttributeError):
            return None
        if isinstance(eos, dict):
            eos = eos.get("content")
        return self.tok.token_to_id(eos) if isinstance(eos, str) else None

    def encode(self, data):
        if isinstance(data, bytes):
            data = data.decode("utf-8", errors="replace")
        # the library raises its own exception where it cannot (a WordLevel vocabulary that
        # lacks its unknown token, for a word outside it)
        try:
            ids = self.tok.encode(data).ids
        except Exception as exc:
            raise CLIError(f"the tokenizer {self.path}/tokenizer.json cannot encode the text "
                           f"({_first_line(exc)})") from None
        return np.asarray(ids, dtype=self.dtype)

    def decode(self, ids):
        return self.tok.decode([int(i) for i in ids])


def get_tokenizer(spec, path=None):
    """``byte``, ``gpt2`` (transformers' cached files), or a local directory: its
    tokenizer.json where it has one (recorded as ``tokenizer.json``), else a GPT-2 tokenizer
    that transformers saved there."""
    if spec in (None, "byte"):
        return ByteTokenizer()
    target = path or spec
    if spec == TokenizerFile.name or (spec != "gpt2" and
                                      os.path.isfile(os.path.join(target, "tokenizer.json"))):
        return TokenizerFile(target)
    return HFTokenizer(target)


def checkpoint_tokenizer(ckpt, path, name_asked=None):
    """The tokenizer to read and write a checkpoint's tokens with: the one asked for, else
    the one it records; a CLIError for one of another vocabulary."""
    config = ckpt.config
    info = ckpt.get("tokenizer") or {}
    name = name_asked or info.get("name") or ("byte" if config.vocab_size <= 256 else None)
    if name is None:
        raise CLIError(f"checkpoint {path} names no tokenizer: pass --tokenizer")
    tok = get_tokenizer(name, None if name_asked else info.get("path"))
    if tok.vocab_size > config.vocab_size:
        raise CLIError(f"the {tok.name} tokenizer has {tok.vocab_size} tokens, more than the "
                       f"model's vocabulary of {config.vocab_size}")
    # another size is another tokenizer's ids, unless the model was trained with this one
    # (a vocabulary larger than its tokenizer's, --vocab-size)
    if tok.vocab_size != config.vocab_size and tok.name != info.get("name"):
        raise CLIError(f"the {tok.name} tokenizer has {tok.vocab_size} tokens, the model's "
                       f"vocabulary {config.vocab_size}: pass the tokenizer it was trained "
                       "with (--tokenizer DIR, the directory holding its tokenizer.json)")
    return tok


# ---- preparing data ----------------------------------------------------------------------

OUTPUTS = ("train.bin", "val.bin", "meta.json")


def _input_files(inputs, out_dir=None):
    """The files to tokenize; a directory is walked in sorted order, leaving out hidden
    entries and the data set that ``out_dir`` holds (its own outputs are not text)."""
    outputs = {os.path.realpath(os.path.join(out_dir, n)) for n in OUTPUTS} if out_dir else ()
    files = []
    for item in inputs:
        if os.path.isdir(item):
            found = []
            for root, dirs, names in os.walk(item):
                dirs[:] = sorted(d for d in dirs if not d.startswith("."))
                # regular files only: reading a FIFO or a device would block or never end
                found += [os.path.join(root, n) for n in names if not n.startswith(".")
                          and os.path.isfile(os.path.join(root, n))
                          and os.path.realpath(os.path.join(root, n)) not in outputs]
            if not found:
                raise CLIError(f"input directory {item} holds no files")
            files += sorted(found)
        elif os.path.realpath(item) in outputs:
            raise CLIError(f"input {item} is an output of --out {out_dir}: tokenize the text "
                           "it was made from")
        elif os.path.isfile(item):
            files.append(item)
        elif os.path.exists(item):
            raise CLIError(f"input {item} is not a regular file")
        else:
            raise CLIError(f"input {item} does not exist")
    return files


def _read_file(path):
    try:
        with open(path, "rb") as f:
            return f.read()
    except OSError as exc:
        raise CLIError(f"cannot read input {path}: {exc.strerror or exc}") from None


# meta.json while a data set is being replaced: a reader refuses the directory until the
# new meta.json replaces it, so that an interrupted nntile-prepare never leaves old and new
# files that load as one data set
INCOMPLETE = {"incomplete": "an nntile-prepare into this directory was interrupted"}


def _write_file(path, write):
    with open(path, "wb") as f:
        write(f)
        f.flush()
        os.fsync(f.fileno())


def write_dataset(out_dir, train, val, meta):
    """Write train.bin, val.bin and meta.json: first into a temporary directory inside
    ``out_dir``, then renamed into place under the INCOMPLETE marker, meta.json last."""
    dtype = token_dtype(meta["vocab_size"])
    meta = dict(meta, train_tokens=int(len(train)), val_tokens=int(len(val)), dtype=dtype.name)
    contents = {"train.bin": lambda f: f.write(np.ascontiguousarray(train, dtype)),
                "val.bin": lambda f: f.write(np.ascontiguousarray(val, dtype)),
                "meta.json": lambda f: f.write(json.dumps(meta, indent=1).encode())}
    tmp = None
    try:
        os.makedirs(out_dir, exist_ok=True)
        tmp = tempfile.mkdtemp(prefix=".nntile-prepare-", dir=out_dir)
        for name, write in contents.items():
            _write_file(os.path.join(tmp, name), write)
        _write_file(os.path.join(tmp, "incomplete"),
                    lambda f: f.write(json.dumps(INCOMPLETE).encode()))
        os.replace(os.path.join(tmp, "incomplete"), os.path.join(out_dir, "meta.json"))
        for name in OUTPUTS:  # meta.json last
            os.replace(os.path.join(tmp, name), os.path.join(out_dir, name))
    except OSError as exc:
        raise CLIError(f"cannot write data to {out_dir}: {exc.strerror or exc}") from None
    finally:
        if tmp is not None:
            shutil.rmtree(tmp, ignore_errors=True)


def split_tokens(tokens, val_fraction):
    """The last ``val_fraction`` of the token stream is the validation split."""
    n_val = max(1, int(round(len(tokens) * val_fraction)))
    if len(tokens) - n_val < 2 or n_val < 2:
        raise CLIError(f"the input holds only {len(tokens)} tokens: too few for a train and a "
                       "validation split")
    return tokens[:-n_val], tokens[-n_val:]


def prepare(inputs, out_dir, tokenizer="byte", val_fraction=DEFAULT_VAL_FRACTION,
            overwrite=False):
    """Tokenize files (directories are walked in sorted order) into ``out_dir``; a data set
    already there is replaced only with ``overwrite``."""
    if not 0 < val_fraction < 1:
        raise CLIError(f"--val-fraction {val_fraction} must be between 0 and 1")
    if os.path.exists(out_dir) and not os.path.isdir(out_dir):
        raise CLIError(f"--out {out_dir} exists and is not a directory")
    tok = get_tokenizer(tokenizer)
    files = _input_files(inputs, out_dir)
    with _locked_out(out_dir):  # from the check that it holds no data set to the write
        existing = [n for n in OUTPUTS if os.path.exists(os.path.join(out_dir, n))]
        if existing and not overwrite:
            raise CLIError(f"--out {out_dir} already holds a data set ({', '.join(existing)}): "
                           "replace it with --overwrite, or choose another --out")
        return _tokenize(files, tok, out_dir, val_fraction)


@contextlib.contextmanager
def _locked_out(out_dir):
    """``out_dir``, created if needed, with this process alone writing into it (OutLock, as
    nntile-train's --out); removed again if the block fails having written nothing."""
    created = not os.path.exists(out_dir)
    try:
        os.makedirs(out_dir, exist_ok=True)
    except OSError as exc:
        raise CLIError(f"cannot write data to {out_dir}: {exc.strerror or exc}") from None
    with OutLock(out_dir):
        try:
            yield
        except BaseException:
            if created:
                with contextlib.suppress(OSError):  # not empty: something was written
                    os.rmdir(out_dir)
            raise


def _tokenize(files, tok, out_dir, val_fraction):
    """Tokenize ``files`` with ``tok`` into a data set in ``out_dir``; what prepare() says."""
    pieces = []
    for path in files:
        ids = tok.encode(_read_file(path))
        pieces.append(ids)
        if tok.eot is not None and not (len(ids) and ids[-1] == tok.eot):
            pieces.append(np.array([tok.eot], dtype=ids.dtype))
    tokens = np.concatenate(pieces) if pieces else np.zeros(0, TOKEN_DTYPE)
    if len(tokens) == 0:
        raise CLIError("the inputs hold no text")
    train, val = split_tokens(tokens, val_fraction)
    meta = {"tokenizer": tok.name, "vocab_size": tok.vocab_size}
    if tok.name != "byte":
        meta["tokenizer_path"] = tok.path if not os.path.isdir(tok.path) \
            else os.path.abspath(tok.path)
    write_dataset(out_dir, train, val, meta)
    return meta | {"train_tokens": len(train), "val_tokens": len(val), "files": len(files)}


def stdlib_files():
    """The running Python's standard-library ``.py`` sources, in a fixed order."""
    root = sysconfig.get_paths()["stdlib"]
    found = []
    for base, dirs, names in os.walk(root):
        dirs[:] = sorted(d for d in dirs if d not in ("site-packages", "dist-packages",
                                                    "__pycache__") and not d.startswith("."))
        found += [os.path.join(base, n) for n in names if n.endswith(".py")]
    return root, sorted(found, key=lambda p: os.path.relpath(p, root))


def _cache_root():
    base = os.environ.get("NNTILE_CACHE") or os.path.join(
        os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache"), "nntile")
    return os.path.join(base, "data")


def default_data_dir(fallback_parent=None, quiet=False):
    """The embedded corpus (standard-library sources, bytes), prepared once into a cache
    directory (or ``fallback_parent/data`` when the cache cannot be written)."""
    root, files = stdlib_files()
    key = hashlib.sha1(f"{STDLIB_CORPUS_VERSION}:{root}:{sys.version}:{len(files)}".encode())
    name = f"stdlib-py{sys.version_info[0]}{sys.version_info[1]}-byte-{key.hexdigest()[:10]}"
    candidates = [os.path.join(_cache_root(), name)]
    if fallback_parent:
        candidates.append(os.path.join(fallback_parent, "data", name))
    for target in candidates:
        if os.path.exists(os.path.join(target, "meta.json")):
            return target
    errors = []
    for target in candidates:
        parent = os.path.dirname(target)
        try:
            os.makedirs(parent, exist_ok=True)
            tmp = tempfile.mkdtemp(prefix=".tmp-", dir=parent)
        except OSError as exc:
            errors.append(f"{parent}: {exc.strerror or exc}")
            continue
        try:
            if not quiet:
                print(f"nntile: preparing the embedded corpus ({len(files)} standard-library "
                      f".py files, byte-level) into {target}", file=sys.stderr)
            tokens = np.concatenate([ByteTokenizer().encode(_read_file(p)) for p in files])
            train, val = split_tokens(tokens, DEFAULT_VAL_FRACTION)
            write_dataset(tmp, train, val, {"tokenizer": "byte", "vocab_size": BYTE_VOCAB,
                                            "source": f"python stdlib {root}"})
            try:
                os.rename(tmp, target)
            except OSError:
                if not os.path.exists(os.path.join(target, "meta.json")):
                    raise  # another process did not win the race: a real failure
            return target
        except (OSError, CLIError) as exc:
            errors.append(f"{target}: {exc}")
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
    raise CLIError("cannot prepare the embedded corpus: " + "; ".join(errors))


# ---- reading data ------------------------------------------------------------------------

class TokenData:
    """The splits of a data directory, checked: readable, whole tokens of meta.json's dtype,
    as many as it records, long enough, every id inside the vocabulary."""

    def __init__(self, path):
        self.path = path
        if not os.path.exists(path):
            raise CLIError(f"data directory {path} does not exist")
        if not os.path.isdir(path):
            raise CLIError(f"data path {path} is not a directory (it should hold train.bin "
                           "and val.bin)")
        self.meta = self._read_meta(os.path.join(path, "meta.json"))
        self.dtype = np.dtype(self.meta.get("dtype", TOKEN_DTYPE.name))
        self.splits = {split: self._open(split) for split in SPLITS}
        self._max = {}

    @staticmethod
    def _read_meta(meta_path):
        """meta.json's settings ({} without one), checked."""
        if not os.path.exists(meta_path):
            return {}
        try:
            if not os.path.isfile(meta_path):  # a FIFO would block the read
                raise ValueError("not a regular file")
            with open(meta_path) as f:
                meta = json.load(f)
            if not isinstance(meta, dict):
                raise ValueError("not a JSON object")
            vocab = meta.get("vocab_size", 1)
            if isinstance(vocab, bool) or not isinstance(vocab, int) or vocab < 1:
                raise ValueError(f"vocab_size {vocab!r} is not a positive integer")
            for split in SPLITS:
                count = meta.get(f"{split}_tokens", 0)
                if isinstance(count, bool) or not isinstance(count, int) or count < 0:
                    raise ValueError(f"{split}_tokens {count!r} is not a token count")
            if "incomplete" in meta:
                raise ValueError(f"{meta['incomplete']}: run it again")
            if meta.get("dtype", TOKEN_DTYPE.name) not in TOKEN_DTYPES:
                raise ValueError(f"dtype {meta['dtype']!r}: nntile reads token files of "
                                 f"{' or '.join(TOKEN_DTYPES)}")
        except (OSError, ValueError, RecursionError) as exc:
            raise CLIError(f"cannot read {meta_path}: {exc}") from None
        return meta

    def _open(self, split):
        file = os.path.join(self.path, f"{split}.bin")
        if not os.path.exists(file):
            raise CLIError(f"data file {file} does not exist")
        if not os.path.isfile(file):
            raise CLIError(f"data file {file} is not a regular file")
        try:
            with open(file, "rb") as f:
                f.read(2)
            size = os.path.getsize(file)
        except OSError as exc:
            raise CLIError(f"cannot read data file {file}: {exc.strerror or exc}") from None
        if size == 0:
            raise CLIError(f"data file {file} is empty")
        if size % self.dtype.itemsize:
            raise CLIError(f"data file {file} has {size} bytes: not a whole number of "
                           f"{self.dtype.name} tokens (truncated, or not nanoGPT format?)")
        recorded = self.meta.get(f"{split}_tokens")
        if recorded is not None and size // self.dtype.itemsize != recorded:
            raise CLIError(f"data file {file} holds {size // self.dtype.itemsize:,} tokens, "
                           f"meta.json records {recorded:,} (cut short, or replaced?): "
                           "prepare the data again")
        return np.memmap(file, dtype=self.dtype, mode="r")

    @property
    def tokenizer(self):
        return self.meta.get("tokenizer", "byte" if self.vocab_hint <= BYTE_VOCAB else "gpt2")

    @property
    def vocab_hint(self):
        """The vocabulary size of meta.json, else the smallest that holds every token id."""
        if "vocab_size" in self.meta:
            return int(self.meta["vocab_size"])
        return max(BYTE_VOCAB, self.max_token() + 1)

    def max_token(self, split=None):
        splits = [split] if split else list(SPLITS)
        result = 0
        for s in splits:
            if s not in self._max:
                data = self.splits[s]
                chunk = 1 << 24
                self._max[s] = int(max(int(data[i:i + chunk].max())
                                       for i in range(0, len(data), chunk)))
            result = max(result, self._max[s])
        return result

    def check(self, vocab_size, seq_len):
        """Raise CLIError unless every split can feed a model of this vocabulary and length."""
        for split, data in self.splits.items():
            file = os.path.join(self.path, f"{split}.bin")
            if len(data) < seq_len + 1:
                raise CLIError(f"data file {file} holds {len(data)} tokens: fewer than "
                               f"sequence length + 1 = {seq_len + 1}")
            top = self.max_token(split)
            if top >= vocab_size:
                raise CLIError(f"data file {file} holds token id {top}, outside the model's "
                               f"vocabulary of {vocab_size} (wrong --vocab-size or tokenizer?)")

    def check_vocabulary(self, vocab_size, tokenizer=None, source="the model", exact=False):
        """Raise CLIError when the data's vocabulary (meta.json) is not the model's: larger
        than its embedding (``exact``: another size), or (``tokenizer``: the model's own,
        where it comes with one) another tokenizer's."""
        if "vocab_size" not in self.meta:
            return  # bare token files: check() still looks at every id
        have = int(self.meta["vocab_size"])
        made = self.meta.get("tokenizer", "?")
        if tokenizer is not None and have != tokenizer.vocab_size:
            raise CLIError(f"data {self.path} was tokenized with {made} ({have} tokens) but "
                           f"{source} comes with a tokenizer of {tokenizer.vocab_size}: "
                           f"prepare the data with nntile-prepare --tokenizer "
                           f"{getattr(tokenizer, 'path', tokenizer.name)}")
        if exact and have != vocab_size:
            raise CLIError(f"data {self.path} was tokenized with {made} ({have} tokens), "
                           f"{source} has a vocabulary of {vocab_size}: set its vocab_size "
                           f"to {have}, or prepare the data with the model's tokenizer")
        if have > vocab_size:
            raise CLIError(f"data {self.path} was tokenized with {made} ({have} tokens), more "
                           f"than the vocabulary of {source} ({vocab_size})")

    def __len__(self):
        return len(self.splits["train"])


class BatchSampler:
    """Training batches: ``batch`` windows of ``seq + 1`` tokens at offsets drawn from a numpy
    Generator. ``state()``/``set_state()`` capture the generator and the count of batches
    drawn, so that a resumed run reads the very same batches."""

    def __init__(self, tokens, batch, seq, seed):
        self.tokens, self.batch, self.seq = tokens, batch, seq
        self.rng = np.random.Generator(np.random.PCG64(seed))
        self.batches_drawn = 0

    def next(self):
        starts = self.rng.integers(0, len(self.tokens) - self.seq, size=self.batch)
        self.batches_drawn += 1
        return windows(self.tokens, starts, self.seq)

    def state(self):
        return {"bit_generator": self.rng.bit_generator.state,
                "batches_drawn": self.batches_drawn,
                "tokens_drawn": self.batches_drawn * self.batch * self.seq}

    def set_state(self, state):
        try:
            self.rng.bit_generator.state = state["bit_generator"]
            self.batches_drawn = int(state["batches_drawn"])
        except (KeyError, TypeError, ValueError) as exc:
            raise ValueError(f"data sampler state is invalid ({exc})") from None


def windows(tokens, starts, seq):
    """Inputs and next-token targets [len(starts), seq] as int64."""
    idx = np.asarray(starts, dtype=np.int64)[:, None] + np.arange(seq + 1)
    block = np.asarray(tokens[idx], dtype=np.int64)
    return block[:, :-1], block[:, 1:]


def eval_starts(n_tokens, seq, count):
    """``count`` window offsets spread evenly over a split (fixed: same every evaluation)."""
    last = n_tokens - seq - 1
    return np.linspace(0, last, count).round().astype(np.int64)


def eval_batches(tokens, batch, seq, nbatches):
    """The fixed evaluation batches of a split: list of (inputs, targets)."""
    starts = eval_starts(len(tokens), seq, batch * nbatches)
    return [windows(tokens, starts[i * batch:(i + 1) * batch], seq) for i in range(nbatches)]


# ---- nntile-prepare ----------------------------------------------------------------------

def prepare_main(argv=None):
    parser = ArgumentParser(prog="nntile-prepare", description=(
        "Tokenize text files into nanoGPT-format train.bin/val.bin (uint16; uint32 past 65,536 "
        "tokens) and meta.json."))
    parser.add_argument("inputs", nargs="*", metavar="INPUT",
                        help="text files or directories (walked in sorted order); none: the "
                             "running Python's standard-library sources")
    parser.add_argument("--out", required=True, help="output directory")
    parser.add_argument("--tokenizer", default="byte",
                        help="byte (default), gpt2 (transformers' cached GPT-2 tokenizer) or a "
                             "local directory: its tokenizer.json (a transformers model's, "
                             "read by the tokenizers library), else a GPT-2 tokenizer saved "
                             "there")
    parser.add_argument("--val-fraction", type=float, default=DEFAULT_VAL_FRACTION,
                        help="share of the tokens (taken from the end) for val.bin")
    parser.add_argument("--overwrite", action="store_true",
                        help="replace the data set that --out already holds")
    args = parser.parse_args(argv)
    inputs = args.inputs
    if not inputs:
        inputs = stdlib_files()[1]
    info = prepare(inputs, args.out, args.tokenizer, args.val_fraction, args.overwrite)
    print(f"nntile-prepare: {plural(info['files'], 'file')} -> {info['train_tokens']:,} train + "
          f"{info['val_tokens']:,} val tokens ({info['tokenizer']}, vocabulary "
          f"{info['vocab_size']}) in {args.out}")
    return 0


main = program_main(prepare_main, "nntile-prepare", __name__)
