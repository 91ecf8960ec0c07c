"""
prepare.py -- FROZEN. Data, tokenizer, dataloader and the evaluator (the fixed metric).

The research agent must not edit this file: agent.py checks its hash before and after every
experiment and rejects a candidate that changed it. train.py imports the runtime utilities below.

Usage:
    uv run prepare.py                                   # profile from the device (CUDA: default, climbmix shards
                                                        # from Hugging Face; MPS: small, CPU: cpu, tinystories;
                                                        # small and cpu offline: the sample in data/sample)
    uv run prepare.py --num-shards 8                    # fewer training shards (the val shard is pinned)
    uv run prepare.py --dataset tinystories --profile small     # a Mac or a small GPU
    uv run prepare.py --source data/sample --profile cpu     # offline: local .txt/.jsonl/.parquet
    uv run prepare.py --check                           # exit 0 if prepared data is ready (agent.py uses it)
    uv run prepare.py --frozen-inputs                   # JSON: sha256 of everything that defines the metric
    uv run prepare.py --evaluate run/model.pt2          # score a model artifact in this fresh process

Everything is written to $AUTORESEARCH_CACHE (default ~/.cache/autoresearch). The evaluation constants
(MAX_SEQ_LEN, EVAL_TOKENS, VOCAB_SIZE) come from the profile chosen here and are recorded with the data,
so every train.py run on this cache is scored the same way.

The number that ranks an experiment comes from `--evaluate`: a fresh interpreter running this file loads
the self-contained program that evaluate_bpb exported from train.py's model (torch.export, when
$AUTORESEARCH_ARTIFACT is set) and scores it. No code of train.py runs in that process, so nothing
train.py does to itself (a printed summary, a patched evaluator, a shimmed torch) can change the score.
"""

import argparse
import errno
import hashlib
import io
import itertools
import json
import math
import operator
import os
import pickle
import random
import re
import shutil
import socket
import sys
import time
import zipfile
from concurrent.futures import ThreadPoolExecutor, as_completed
from dataclasses import dataclass, replace as dataclass_replace
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import requests
import rustbpe
import tiktoken
import torch
import torch.export.passes  # move_to_device_pass: an artifact exported on one device is scored on another
import torch.nn.functional as F
from tqdm import tqdm

# ---------------------------------------------------------------------------
# Constants (fixed, do not modify)
# ---------------------------------------------------------------------------

METRIC_NAME = "val_bpb"  # what agent.py reads from the summary (with ast, never by importing)
METRIC_GOAL = "min"      # lower bits per byte is better
# The largest |val_bpb printed by train.py - val_bpb of `prepare.py --evaluate`| an honest run shows. They
# differ only in arithmetic: train.py evaluates under its autocast (bf16 on GPUs and on CPUs with AMX /
# AVX512-BF16), the separate evaluator runs the exported program in float32 (TF32 matmuls on CUDA). Measured on
# the cpu profile: on a 2-core Xeon with AMX, gaps of 2e-6, 1.4e-5, 9e-6 and 1.2e-5 bpb after 2, 20, 60 and 300 s
# of training; on an H200 (torch 2.11, SDPA), 3.1e-5 and 4.2e-5 after 20 and 40 s. The ranked number is always
# the evaluator's, so the tolerance only decides when train.py's own number is called a lie (`metric mismatch`):
# ~12x the largest gap measured, for the larger models and longer rows of the default profile (not measured).
METRIC_TOLERANCE = 5e-4
# The least noise sd the verdict assumes (harness.verdict.sd_floor): baseline runs that agree to the last digit (a
# train.py that ignores AUTORESEARCH_SEED) would otherwise make the noise margin 0 and keep "gains" of float rounding.
# 1e-4 bpb is ~2x the largest gap measured between two evaluations of one model in different arithmetic (above).
METRIC_SD_FLOOR = 1e-4
TIME_BUDGET = 300        # training time budget in seconds (5 minutes), start-up and eval excluded
# A profile's own budget where it is not TIME_BUDGET: the lab (2 CPU cores) measures research at 60 s a run, where
# its curve is flat enough that seed and load move val_bpb little (docs/benchmarks.md, "The lab profile").
PROFILE_BUDGETS = {"lab": 60}
PREFLIGHT = False        # nothing to check before the loop beyond --check
SPEED_PROBE = True       # `prepare.py --probe` times a fixed workload on the device (harness.conditions reads it)
# The probe's workload per device type: (n, reps): reps matmuls of n x n (bf16 on CUDA, float32 elsewhere) with a
# tanh between, after one warm-up, timed in PROBE_CHUNKS chunks whose median counts (a first chunk at a lower clock
# or one preempted by a stray process does not): ~0.2 s on 2 CPU cores, ~0.1 s on an H100, next to start-up.
PROBE_WORK = {"cuda": (4096, 400), "mps": (2048, 100), "cpu": (512, 100)}
PROBE_CHUNKS = 10

# Smoke tests and CI shorten the budget through this variable. train.py prints `budget_override: 1`
# in its summary whenever it sets a budget other than TIME_BUDGET, so a shortened run can never pass
# for a real one.
TIME_BUDGET_ENV = "AUTORESEARCH_TIME_BUDGET"
# When set, evaluate_bpb first saves the model as a torch.export program at this path, for `--evaluate`.
ARTIFACT_ENV = "AUTORESEARCH_ARTIFACT"
ARTIFACT_NAME = "model.pt2"     # the harness names the artifact file so (torch.export loads *.pt2 directly)
# The exported program takes int64[EVAL_BATCH_ROWS, MAX_SEQ_LEN] tokens, the only shape `--evaluate`
# feeds it (the last batch is padded). 32 rows keep the float32 logits of the default profile at 2 GiB.
EVAL_BATCH_ROWS = 32


@dataclass(frozen=True)
class Profile:
    """Evaluation constants fixed for one prepared dataset."""
    name: str
    max_seq_len: int   # context length of training rows and of evaluation rows, tokens
    eval_tokens: int   # tokens scored by evaluate_bpb
    vocab_size: int    # BPE vocabulary including the special tokens
    doc_chars: int     # local text is cut into documents of at most this many characters


# default: karpathy/autoresearch's H100 values. small: Macs and GPUs with 8-24 GB; 1M eval tokens take
# ~10-20 s on an M2-class device. cpu: a 2-core machine; a 2048 vocab keeps the embedding and the output
# layer from dominating a ~3M-parameter model, 256-token rows fit the context such a model uses, and
# 2^16 eval tokens take < 8 % of the 300 s budget while keeping the val_bpb standard error ~0.003.
# doc_chars ~ 2 chars per row token: most local documents fit a row whole, so best-fit packing wastes little.
PROFILES = {
    "default": Profile("default", max_seq_len=2048, eval_tokens=40 * 524288, vocab_size=8192, doc_chars=4096),
    "small": Profile("small", max_seq_len=512, eval_tokens=2 * 524288, vocab_size=4096, doc_chars=1024),
    "cpu": Profile("cpu", max_seq_len=256, eval_tokens=65536, vocab_size=2048, doc_chars=512),
    "lab": Profile("lab", max_seq_len=128, eval_tokens=65536, vocab_size=512, doc_chars=256),
}
# lab: research on 2 CPU cores. A ~0.5M-parameter model on 128-token rows of a 512-token vocabulary trains ~650
# steps in its 60 s (PROFILE_BUDGETS), and always on the sample shipped in data/sample (unless --source or --dataset
# says otherwise), so that its recorded table of runs (bench/lab_table.tsv) holds on every machine.

# ---------------------------------------------------------------------------
# Configuration
# ---------------------------------------------------------------------------

CLIMBMIX_URL = "https://huggingface.co/datasets/karpathy/climbmix-400b-shuffle/resolve/main"
MAX_SHARD = 6542                                 # the last climbmix shard is shard_06542.parquet
VAL_SHARD_NAME = f"shard_{MAX_SHARD:05d}.parquet"  # pinned validation shard, never trained on
HOLDOUT_SHARD_NAME = f"shard_{MAX_SHARD - 1:05d}.parquet"  # pinned holdout shard: never trained on nor searched on
TINYSTORIES_URL = "https://huggingface.co/datasets/karpathy/tinystories-gpt4-clean/resolve/main/tinystories_gpt4_clean.parquet"

LOCAL_VAL_NAME = "val.parquet"   # converted sources keep their held-out split under this name
LOCAL_HOLDOUT_NAME = "holdout.parquet"   # ... and the hidden holdout (report.py --holdout) under this one
VAL_BLOCK = 8                    # converted sources: documents go to val in blocks of 8 ...
VAL_EVERY = 10                   # ... every 10th block (10 %, spread over every file), and to the holdout the
HOLDOUT_AT = 4                   # blocks at this place of every 10 (another 10 %)
MAX_REPLACED_FRACTION = 0.01     # more undecodable bytes than this and a file is not UTF-8 text
# Documents per row group of converted train shards: a seeded order shuffles the row groups, then the documents in
# each, so small groups mix the source files finely. With 1024 the sample's two books came in 17 blocks, and which
# one the lab's run ended on moved its val_bpb by 0.08 between two seeds.
TRAIN_ROW_GROUP = 64

# Offline with no --source, the cpu and small profiles prepare this public-domain text shipped with the repository
# (data/sample/README.md) instead of their download, so a fresh machine with no network and no key still runs the
# loop; the default profile needs real data. Its val split holds ~114K tokens with the cpu profile's tokenizer and
# ~94K with small's, so it scores at most SAMPLE_EVAL_TOKENS (small's 1M would wrap around).
SAMPLE_DIR = Path(__file__).resolve().parent / "data" / "sample"
SAMPLE_PROFILES = ("cpu", "small", "lab")
SAMPLE_EVAL_TOKENS = 65536

# BPE split pattern (GPT-4 style, with \p{N}{1,2} instead of {1,3}); the same pattern trains and encodes.
SPLIT_PATTERN = r"""'(?i:[sdmt]|ll|ve|re)|[^\r\n\p{L}\p{N}]?+\p{L}+|\p{N}{1,2}| ?[^\s\p{L}\p{N}]++[\r\n]*|\s*[\r\n]|\s+(?!\S)|\s+"""
SPECIAL_TOKENS = [f"<|reserved_{i}|>" for i in range(4)]
BOS_TOKEN = SPECIAL_TOKENS[0]
TOKENIZER_MAX_CHARS = 1_000_000_000  # tokenizer training reads at most this much training text
TOKENIZER_DOC_CAP = 10_000           # and at most this much of any one document


def cache_dir():
    """The cache root: $AUTORESEARCH_CACHE, default ~/.cache/autoresearch (read at call time)."""
    return Path(os.environ.get("AUTORESEARCH_CACHE", Path.home() / ".cache" / "autoresearch")).expanduser()


class PrepareError(Exception):
    """A problem the user must fix; the message names the fix. Exits with code 1 from the CLI."""


def time_budget(profile=None):
    """Effective training budget in seconds and whether it was overridden.

    profile: the prepared profile's name; its budget is PROFILE_BUDGETS' where it has one, else TIME_BUDGET.
    Returns (seconds: float, overridden: bool); overridden is True only when the budget differs from the
    profile's (setting the variable to 300 changes nothing). Raises PrepareError if
    $AUTORESEARCH_TIME_BUDGET is set but is not a positive, finite number.
    """
    own = float(PROFILE_BUDGETS.get(profile, TIME_BUDGET))
    raw = os.environ.get(TIME_BUDGET_ENV)
    if raw is None or raw == "":
        return own, False
    try:
        seconds = float(raw)
    except ValueError:
        seconds = -1.0
    if not (seconds > 0 and math.isfinite(seconds)):
        raise PrepareError(f"{TIME_BUDGET_ENV}={raw!r} is not a positive, finite number of seconds; unset it or use e.g. {TIME_BUDGET_ENV}=30")
    return seconds, seconds != own

# ---------------------------------------------------------------------------
# Prepared-data record
# ---------------------------------------------------------------------------


@dataclass(frozen=True)
class Prepared:
    """What prepare.py wrote: the dataset, its profile and where its files are."""
    root: Path         # the cache root
    dataset: str       # climbmix | tinystories | local | sample (local text from SAMPLE_DIR)
    source: str        # URL or absolute local path
    profile: Profile
    data_dir: Path     # parquet shards with a `text` column
    val_name: str      # file name of the held-out split inside data_dir
    tokenizer_path: Path | None = None  # set while prepare.py builds a new tokenizer beside the current one
    holdout_name: str | None = None     # file name of the hidden holdout split (None: a cache prepared before it)

    @property
    def tokenizer_dir(self):
        return self.tokenizer_path or self.root / "tokenizer"

    @property
    def max_seq_len(self):
        return self.profile.max_seq_len

    @property
    def eval_tokens(self):
        return self.profile.eval_tokens

    @property
    def vocab_size(self):
        return self.profile.vocab_size


def _meta_path(root):
    return root / "prepared.json"


def load_prepared(root=None):
    """Read the record written at the end of a successful prepare.py run.

    Raises PrepareError (naming the command to run) if the cache is missing, incomplete or corrupt. The
    val split is not required here: a training sandbox may hide it (see frozen_inputs); the code that
    reads it (the evaluator, --check, --frozen-inputs) checks it.
    """
    root = Path(root) if root is not None else cache_dir()
    path = _meta_path(root)
    if not path.exists():
        raise PrepareError(f"no prepared data in {root}: run prepare.py first, e.g. "
                           f"`uv run prepare.py --source data/sample --profile cpu`")
    try:
        meta = json.loads(path.read_text())
        # the record, not today's PROFILES table, is the truth for data prepared earlier
        profile = Profile(meta["profile"], int(meta["max_seq_len"]), int(meta["eval_tokens"]), int(meta["vocab_size"]), int(meta["doc_chars"]))
        prepared = Prepared(root, meta["dataset"], meta["source"], profile, root / meta["data_dir"], meta["val_name"],
                            holdout_name=meta.get("holdout_name"))
    except (ValueError, KeyError) as e:
        raise PrepareError(f"{path} is unreadable ({e}): re-run prepare.py with --force")
    missing = [p for p in (prepared.tokenizer_dir / "tokenizer.pkl", prepared.tokenizer_dir / "token_bytes.pt") if not p.exists()]
    if missing:
        raise PrepareError(f"prepared data in {root} is incomplete ({missing[0]} is missing): re-run prepare.py with --force")
    return prepared


def _write_atomic(path, data):
    """Write bytes to path through a temporary file, so a crash never leaves half a file."""
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_bytes(data)
    os.replace(tmp, path)

# ---------------------------------------------------------------------------
# Data download (climbmix, tinystories)
# ---------------------------------------------------------------------------


def parquet_ok(path):
    """True if path is a readable parquet file (footer parses) with at least one row and a `text` column."""
    try:
        meta = pq.ParquetFile(path).metadata
        return meta.num_rows > 0 and "text" in meta.schema.names
    except Exception:
        return False


class OfflineError(PrepareError):
    pass


def _name_not_resolved(error):
    """True if error (from requests) comes from a failed DNS lookup: a socket.gaierror in its chain.

    Such a failure is not transient (no network, no resolver, or a wrong host), so it is not retried.
    """
    seen, todo = set(), [error]
    while todo:
        e = todo.pop()
        if e is None or id(e) in seen:
            continue
        seen.add(id(e))
        if isinstance(e, socket.gaierror):
            return True
        todo += [e.__cause__, e.__context__, getattr(e, "reason", None)]
        todo += [a for a in getattr(e, "args", ()) if isinstance(a, BaseException)]
    return False


def _offline_error(url):
    return OfflineError(f"cannot reach {url.split('/')[2]} (offline?): prepare local text instead with --source PATH, "
                        f"e.g. `uv run prepare.py --source data/sample --profile cpu` (the sample shipped here)")


def download_file(url, path, attempts=5, backoff=2.0, timeout=30, progress=False):
    """Download url to path: stream to path.tmp, validate it as parquet, then rename.

    A truncated or corrupt download is deleted and fetched again; an existing file is validated
    before it counts as done. Retries with exponential backoff (backoff * 2**k seconds), except when
    the host name does not resolve: that raises OfflineError at once. Raises OfflineError if the host
    cannot be reached at all, PrepareError on a 404 or when every attempt failed. progress: a byte progress bar
    (tqdm, on a terminal only).
    """
    path = Path(path)
    if path.exists():
        if parquet_ok(path):
            return path
        print(f"  {path.name}: existing file is corrupt, fetching it again")
        path.unlink()
    tmp = path.with_name(path.name + ".tmp")
    last_error, unreachable = None, True
    for attempt in range(attempts):
        if attempt:
            time.sleep(backoff * 2 ** (attempt - 1))
        try:
            with requests.get(url, stream=True, timeout=timeout) as response:
                unreachable = False
                if response.status_code == 404:
                    raise PrepareError(f"{url} does not exist (HTTP 404); check --num-shards / --dataset")
                response.raise_for_status()
                size = int(response.headers.get("Content-Length") or 0) or None
                with open(tmp, "wb") as f, tqdm(total=size, unit="B", unit_scale=True, desc=path.name,
                                                disable=None if progress else True) as bar:
                    for chunk in response.iter_content(chunk_size=1 << 20):
                        f.write(chunk)
                        bar.update(len(chunk))
            if not parquet_ok(tmp):
                raise ValueError("downloaded file is not a complete parquet file with a text column (truncated?)")
            os.replace(tmp, path)
            return path
        except (requests.ConnectionError, requests.Timeout) as e:
            if _name_not_resolved(e):
                raise _offline_error(url) from e
            last_error = e
        except (requests.RequestException, ValueError) as e:
            last_error, unreachable = e, False
        except OSError as e:
            if e.errno == errno.ENOSPC:
                raise
            last_error, unreachable = e, False
        finally:
            tmp.unlink(missing_ok=True)
        print(f"  {path.name}: attempt {attempt + 1}/{attempts} failed: {last_error}")
    if unreachable:
        raise _offline_error(url)
    raise PrepareError(f"could not download {url} after {attempts} attempts: {last_error}")


def download_climbmix(data_dir, num_shards, workers, base_url=CLIMBMIX_URL, backoff=2.0):
    """Download training shards 0..num_shards-1 plus the pinned validation and holdout shards into data_dir."""
    data_dir.mkdir(parents=True, exist_ok=True)
    names = [f"shard_{i:05d}.parquet" for i in range(min(num_shards, MAX_SHARD - 1))] + [VAL_SHARD_NAME,
                                                                                         HOLDOUT_SHARD_NAME]
    print(f"Data: {len(names)} climbmix shards -> {data_dir}")
    with ThreadPoolExecutor(max(1, min(workers, len(names)))) as pool, \
            tqdm(total=len(names), unit="shard", desc="climbmix", disable=None) as bar:   # a bar on a terminal
        futures = [pool.submit(download_file, f"{base_url}/{n}", data_dir / n, backoff=backoff) for n in names]
        for f in as_completed(futures):
            f.result()  # re-raises the first failure (offline, 404, disk full)
            bar.update(1)
    print(f"Data: {len(names)} shards ready")

# ---------------------------------------------------------------------------
# Local sources: .txt / .jsonl / .parquet converted to the same shard layout
# ---------------------------------------------------------------------------


def split_text(text, doc_chars):
    """Cut plain text into documents: paragraphs (blank-line separated) grouped up to doc_chars.

    A paragraph longer than doc_chars is cut at line ends, then at spaces, then hard. Deterministic.
    Returns a list of non-empty str.
    """
    pieces = []
    for para in re.split(r"\n\s*\n", text.replace("\r\n", "\n")):
        para = para.strip("\n")
        while len(para) > doc_chars:
            cut = para.rfind("\n", 0, doc_chars)
            if cut <= 0:
                cut = para.rfind(" ", 0, doc_chars)
            if cut <= 0:
                cut = doc_chars
            pieces.append(para[:cut])
            para = para[cut:].lstrip("\n ")
        if para.strip():
            pieces.append(para)
    docs, current = [], ""
    for piece in pieces:
        if current and len(current) + 2 + len(piece) > doc_chars:
            docs.append(current)
            current = piece
        else:
            current = current + "\n\n" + piece if current else piece
    if current:
        docs.append(current)
    return docs


def read_source_file(path, doc_chars):
    """Documents of one local file. Returns (docs: list[str], replaced_chars: int).

    .txt: UTF-8; undecodable bytes become U+FFFD and are counted; a file with more than 1 % of them is
    rejected as not UTF-8. .jsonl: one JSON object per line with a string field `text`. .parquet: a
    `text` column. Raises PrepareError naming the file (and line) on bad input.
    """
    suffix = path.suffix.lower()
    if suffix == ".txt":
        raw = path.read_bytes()
        text = raw.decode("utf-8", errors="replace")
        replaced = text.count("\ufffd") - raw.count("\ufffd".encode())
        if replaced + text.count("\x00") > MAX_REPLACED_FRACTION * max(1, len(text)):  # NUL bytes: a binary file
            raise PrepareError(f"{path}: {replaced} undecodable bytes and {text.count(chr(0))} NUL bytes: this is not UTF-8 "
                               f"text. A binary file: remove it; text in another encoding: convert it (e.g. `iconv -f latin1 -t utf-8`)")
        return split_text(text, doc_chars), replaced
    if suffix == ".jsonl":
        docs = []
        with open(path, encoding="utf-8", errors="strict") as f:
            for lineno, line in enumerate(f, 1):
                if not line.strip():
                    continue
                try:
                    text = json.loads(line)["text"]
                except (ValueError, KeyError, TypeError):
                    raise PrepareError(f"{path}:{lineno}: expected a JSON object with a string field \"text\"")
                if not isinstance(text, str):
                    raise PrepareError(f"{path}:{lineno}: field \"text\" is {type(text).__name__}, expected a string")
                if text.strip():
                    docs.append(text)
        return docs, 0
    if suffix == ".parquet":
        try:
            table = pq.read_table(path, columns=["text"])
        except Exception as e:
            raise PrepareError(f"{path}: cannot read a `text` column ({e})")
        return [t for t in table.column("text").to_pylist() if isinstance(t, str) and t.strip()], 0
    raise PrepareError(f"{path}: unsupported file type {suffix!r}; use .txt, .jsonl or .parquet")


def source_files(source):
    """The .txt/.jsonl/.parquet files under source (a file or a directory), sorted for determinism."""
    source = Path(source).expanduser()
    if not source.exists():
        raise PrepareError(f"--source {source} does not exist; pass a file or a directory of .txt/.jsonl/.parquet files")
    if source.is_file():
        return [source]
    files = sorted(p for p in source.rglob("*") if p.is_file() and p.suffix.lower() in (".txt", ".jsonl", ".parquet"))
    if not files:
        raise PrepareError(f"--source {source} holds no .txt, .jsonl or .parquet files")
    return files


def _write_shards(docs, out_dir, stem, rows_per_shard=100_000):
    paths = []
    for i in range(0, len(docs), rows_per_shard):
        path = out_dir / f"{stem}_{i // rows_per_shard:05d}.parquet"
        tmp = path.with_name(path.name + ".tmp")
        pq.write_table(pa.table({"text": docs[i:i + rows_per_shard]}), tmp, row_group_size=TRAIN_ROW_GROUP)
        os.replace(tmp, path)
        paths.append(path)
    return paths


def convert_source(files, data_dir, doc_chars):
    """Convert local files into train shards + val.parquet + holdout.parquet in data_dir (rebuilt from scratch).

    The held-out split takes every VAL_EVERY-th block of VAL_BLOCK consecutive documents of each file, and the
    holdout the block at HOLDOUT_AT of every VAL_EVERY, so both come from all over every file, never overlap and
    never appear in training. Returns a dict of counts. Raises PrepareError if there is no text or no validation text.
    """
    if data_dir.exists():
        shutil.rmtree(data_dir)
    data_dir.mkdir(parents=True)
    train, val, holdout, replaced = [], [], [], 0
    for path in files:
        docs, bad = read_source_file(path, doc_chars)
        replaced += bad
        for i, doc in enumerate(docs):
            place = (i // VAL_BLOCK) % VAL_EVERY
            (val if place == VAL_EVERY - 1 else holdout if place == HOLDOUT_AT else train).append(doc)
        print(f"  {path.name}: {len(docs):,} documents" + (f", {bad} undecodable bytes replaced by U+FFFD" if bad else ""))
    if not train:
        raise PrepareError(f"no text found in {len(files)} source file(s): the source is empty")
    if not val:
        raise PrepareError(f"only {len(train)} documents: too little text for a held-out split (need at least {VAL_BLOCK * VAL_EVERY}); add more text")
    _write_shards(train, data_dir, "shard")
    for name, docs in ((LOCAL_VAL_NAME, val), (LOCAL_HOLDOUT_NAME, holdout)):
        tmp = data_dir / (name + ".tmp")
        pq.write_table(pa.table({"text": pa.array(docs, pa.string())}), tmp, row_group_size=1024)
        os.replace(tmp, data_dir / name)
    return {"train_docs": len(train), "val_docs": len(val), "holdout_docs": len(holdout), "replaced_chars": replaced}

# ---------------------------------------------------------------------------
# Tokenizer training
# ---------------------------------------------------------------------------


def train_files(prepared):
    """Sorted training shards: every parquet file in data_dir except the validation and holdout files."""
    files = sorted(p for p in prepared.data_dir.glob("*.parquet")
                   if p.name not in (prepared.val_name, prepared.holdout_name, LOCAL_HOLDOUT_NAME, HOLDOUT_SHARD_NAME))
    if not files:
        raise PrepareError(f"no training shards in {prepared.data_dir}: run prepare.py again (with --force)")
    return files


def _iter_texts(paths, rng=None):
    """The text column of the parquet files, row group by row group. rng (a random.Random): the row groups of all
    files in a shuffled order, and the documents of each row group shuffled (a seeded training data order)."""
    files = {path: pq.ParquetFile(path) for path in paths}
    units = [(path, rg) for path in paths for rg in range(files[path].num_row_groups)]
    if rng is not None:
        rng.shuffle(units)
    for path, rg in units:
        texts = files[path].read_row_group(rg, columns=["text"]).column("text").to_pylist()
        if rng is not None:
            rng.shuffle(texts)
        yield from texts


def train_tokenizer(prepared):
    """Train a BPE tokenizer with rustbpe on training text only; save it as a pickled tiktoken Encoding.

    Also writes token_bytes.pt: int32[vocab_size], the UTF-8 byte length of every token taken from its
    raw bytes (a token holding half of a multi-byte character counts its own bytes), 0 for special tokens.
    """
    out = prepared.tokenizer_dir
    out.mkdir(parents=True, exist_ok=True)
    t0 = time.time()

    def texts():
        total = 0
        for text in _iter_texts(train_files(prepared)):
            text = text[:TOKENIZER_DOC_CAP]
            total += len(text)
            yield text
            if total >= TOKENIZER_MAX_CHARS:
                return

    bpe = rustbpe.Tokenizer()
    bpe.train_from_iterator(texts(), prepared.vocab_size - len(SPECIAL_TOKENS), pattern=SPLIT_PATTERN)
    ranks = {bytes(token): rank for token, rank in bpe.get_mergeable_ranks()}
    specials = {name: len(ranks) + i for i, name in enumerate(SPECIAL_TOKENS)}
    enc = tiktoken.Encoding(name="autoresearch", pat_str=bpe.get_pattern(), mergeable_ranks=ranks, special_tokens=specials)
    if enc.n_vocab != prepared.vocab_size:
        raise PrepareError(f"the training text only supports a {enc.n_vocab}-token vocabulary, the profile needs {prepared.vocab_size}: add more text or pick a smaller --profile")

    sample = "Hello world! Numbers: 123, 4567. Unicode: naïve café, 你好, emoji 🙂.\n\tTabs and  spaces."
    if enc.decode(enc.encode_ordinary(sample)) != sample:
        raise PrepareError("tokenizer round trip failed; this is a bug, please report it")
    _write_atomic(out / "tokenizer.pkl", pickle.dumps(enc))
    torch.save(token_byte_lengths(enc), out / "token_bytes.pt")
    print(f"Tokenizer: vocab {enc.n_vocab} trained in {time.time() - t0:.1f}s -> {out}")


def token_byte_lengths(enc):
    """int32[n_vocab]: byte length of each token's raw bytes; 0 for special tokens (never scored)."""
    special_ids = set(enc._special_tokens.values())
    lengths = [0 if i in special_ids else len(enc.decode_single_token_bytes(i)) for i in range(enc.n_vocab)]
    return torch.tensor(lengths, dtype=torch.int32)

# ---------------------------------------------------------------------------
# Runtime utilities (imported by train.py)
# ---------------------------------------------------------------------------


class Tokenizer:
    """The prepared BPE tokenizer (a tiktoken Encoding) with BOS handling."""

    def __init__(self, enc):
        self.enc = enc
        self.bos_token_id = enc.encode_single_token(BOS_TOKEN)

    @classmethod
    def from_directory(cls, tokenizer_dir=None):
        """Load tokenizer.pkl from tokenizer_dir (default: the prepared cache's tokenizer/)."""
        tokenizer_dir = Path(tokenizer_dir) if tokenizer_dir is not None else load_prepared().tokenizer_dir
        with open(tokenizer_dir / "tokenizer.pkl", "rb") as f:
            return cls(pickle.load(f))

    def get_vocab_size(self):
        return self.enc.n_vocab

    def get_bos_token_id(self):
        return self.bos_token_id

    def encode(self, text, prepend=None, num_threads=8):
        """str -> list[int], or list[str] -> list[list[int]]; special-token text is encoded as plain text.
        prepend: a token id put before each sequence (e.g. BOS)."""
        if isinstance(text, str):
            ids = self.enc.encode_ordinary(text)
            return [prepend] + ids if prepend is not None else ids
        if isinstance(text, list):
            rows = self.enc.encode_ordinary_batch(text, num_threads=num_threads)
            return [[prepend] + r for r in rows] if prepend is not None else rows
        raise TypeError(f"encode expects str or list[str], got {type(text).__name__}")

    def decode(self, ids):
        return self.enc.decode(ids)


def get_token_bytes(device="cpu", prepared=None):
    """int32[vocab_size] on device: byte length per token id, 0 for special tokens."""
    prepared = prepared or load_prepared()
    return torch.load(prepared.tokenizer_dir / "token_bytes.pt", map_location=device)


def _document_batches(paths, batch_size=128, seed=None):
    """Infinite iterator of (list[str], epoch) over the non-empty documents of the parquet files, epoch from 1; in
    file order, or with a seed in an order shuffled anew for every epoch (see _iter_texts)."""
    epoch = 1
    while True:
        rng = random.Random(f"{seed}:{epoch}") if seed is not None else None
        texts = (t for t in _iter_texts(paths, rng) if t)
        batch = list(itertools.islice(texts, batch_size))
        if not batch and epoch == 1:
            raise PrepareError(f"no documents in {', '.join(p.name for p in paths)}: the split is empty, re-run prepare.py with more text")
        while batch:
            yield batch, epoch
            batch = list(itertools.islice(texts, batch_size))
        epoch += 1


def make_dataloader(tokenizer, B, T, split, device="cpu", prepared=None, buffer_size=None, seed=None):
    """BOS-aligned best-fit packing: yields (inputs, targets, epoch) forever. split: train, val (the metric) or
    holdout (hidden from the search: report.py --holdout). seed (train split only; an int, e.g.
    $AUTORESEARCH_SEED): the documents come in an order shuffled by it, anew every epoch; None: file order.

    inputs, targets: int64[B, T] on device, targets = inputs shifted by one. Every row starts with BOS
    and is filled completely (no padding): the longest buffered document that fits goes next; when none
    fits, the shortest one is cropped to fill the row. epoch is the highest pass over the split that any
    document in the batch comes from: the train split wraps into epoch 2, 3, ... on a small corpus. On CUDA the host buffer is pinned and the copy is non-blocking.
    Raises PrepareError if the split has no data.
    """
    if split not in ("train", "val", "holdout"):
        raise ValueError(f"split must be 'train', 'val' or 'holdout', got {split!r}")
    if split != "train" and seed is not None:
        raise ValueError(f"the {split} split is read in one fixed order: no seed")
    prepared = prepared or load_prepared()
    if split == "holdout" and prepared.holdout_name is None:
        raise PrepareError(f"the data in {prepared.root} was prepared before holdout splits existed: re-run prepare.py "
                           "with --force to have one (this changes the frozen inputs: start a new tag after)")
    paths = (train_files(prepared) if split == "train" else
             [prepared.data_dir / (prepared.val_name if split == "val" else prepared.holdout_name)])
    # A big buffer packs training rows tighter; a small one lets evaluation use nearly all of a small val
    # split before the buffer has to pull documents from a second pass.
    buffer_size = buffer_size or (1000 if split == "train" else 64)
    batches = _document_batches(paths, seed=seed)
    bos = tokenizer.get_bos_token_id()
    device = torch.device(device)
    cuda = device.type == "cuda"
    row_capacity = T + 1
    if B < 1 or T < 1:
        raise ValueError(f"batch size B={B} and sequence length T={T} must be positive")
    rows = torch.empty((B, row_capacity), dtype=torch.long)
    host = torch.empty((2, B, T), dtype=torch.long, pin_memory=cuda)
    docs, doc_epochs = [], []  # buffered token lists and the epoch each was read in
    while True:
        epoch = 1
        for r in range(B):
            pos = 0
            while pos < row_capacity:
                while len(docs) < buffer_size:
                    texts, read_epoch = next(batches)
                    docs.extend(tokenizer.encode(texts, prepend=bos))
                    doc_epochs.extend([read_epoch] * len(texts))
                remaining = row_capacity - pos
                best, best_len = -1, 0
                for i, doc in enumerate(docs):
                    if best_len < len(doc) <= remaining:
                        best, best_len = i, len(doc)
                if best < 0:  # nothing fits whole: crop the shortest document to fill the row
                    best = min(range(len(docs)), key=lambda i: len(docs[i]))
                doc = docs.pop(best)[:remaining]
                epoch = max(epoch, doc_epochs.pop(best))
                rows[r, pos:pos + len(doc)] = torch.tensor(doc, dtype=torch.long)
                pos += len(doc)
        host[0].copy_(rows[:, :-1])
        host[1].copy_(rows[:, 1:])
        if cuda:
            out = host.to(device, non_blocking=True)
        elif device.type == "cpu":
            out = host.clone()  # the next batch overwrites host; the caller may still hold this one
        else:
            out = host.to(device)
        yield out[0], out[1], epoch

# ---------------------------------------------------------------------------
# Evaluation (DO NOT CHANGE -- this is the fixed metric)
# ---------------------------------------------------------------------------

# The causality probe runs on batches drawn at random in every evaluation (from os.urandom, so neither
# train.py nor the model can know which): 1 batch in 8, at least 2. A model that leaks the future on a
# fraction f of the batches escapes k probes with probability (1 - f)^k; each probe is one forward pass.
CAUSALITY_PROBE_EVERY = 8
CAUSALITY_MIN_PROBES = 2


class CausalityError(RuntimeError):
    """The model's logits at position t depend on tokens after t: it sees the future."""


class ArtifactError(RuntimeError):
    """The model artifact cannot be written, read or run; the message says why and what to change."""


def _first_lines(error, lines=3, chars=600):
    text = " ".join(line.strip() for line in str(error).strip().splitlines()[:lines] if line.strip())
    return f"{type(error).__name__}: {text[:chars]}"


def _device_of(model):
    """The device of model's first parameter or buffer; cpu for a plain function or an empty module."""
    if isinstance(model, torch.nn.Module):
        for t in itertools.chain(model.parameters(), model.buffers()):
            return t.device
    return torch.device("cpu")


def _logits(model, x, vocab_size):
    """model(x) as float32[B, T, vocab_size]. Raises ValueError for anything else (shape, dtype, a
    tuple) and for non-finite values, naming what came back."""
    logits = model(x)
    if not (isinstance(logits, torch.Tensor) and logits.shape == (*x.shape, vocab_size) and logits.is_floating_point()):
        got = f"{tuple(logits.shape)} {str(logits.dtype).replace('torch.', '')}" if isinstance(logits, torch.Tensor) else type(logits).__name__
        raise ValueError(f"evaluate_bpb calls model(x) with x of shape {tuple(x.shape)} and needs floating-point logits of shape "
                         f"{(*x.shape, vocab_size)}, got {got}; return logits (sliced to the vocab size) when no targets are given")
    logits = logits.float()
    if not torch.isfinite(logits).all():
        bad = (~torch.isfinite(logits)).sum().item()
        raise ValueError(f"the model returned {bad} non-finite logits (NaN or inf) for validation tokens of shape {tuple(x.shape)}, "
                         f"scored in float32: keep the logits finite (a softcap bounds them; mask with a large negative number, not -inf)")
    return logits


# The probe compares log-probabilities, not raw logits: they do not move when a constant is added to every logit,
# and below LOGPROB_FLOOR nats (probability < 1e-13) a difference cannot change the score, so huge logits on tokens
# that never occur can neither hide a leak nor trip the probe. The tolerance is absolute, in nats per token: a
# leak small enough to pass gains at most that much on a token, ~0.004 bpb at ~3.5 bytes per token. Honest
# models showed differences of exactly 0 (float32 and bf16, CPU and an H200), so 1e-2 leaves room for kernels.
CAUSALITY_TOL = 1e-2
LOGPROB_FLOOR = -30.0


@torch.no_grad()
def check_causality(model, x, vocab_size, base=None, tol=CAUSALITY_TOL, generator=None):
    """Raise CausalityError if changing tokens after position t changes the predictions at positions <= t.

    x: int64[B, T] real tokens; base: model logits for x if already computed. One extra forward pass of
    the same shape (no recompilation): in each row a cut c is drawn uniformly from [0, T-2] and every
    token after c is replaced by a different one. Passes if, at every position <= c, no log-probability
    (log_softmax in float32, floored at LOGPROB_FLOOR) moved by more than tol nats. generator: a CPU
    torch.Generator for the cuts and replacement tokens; by default one seeded from os.urandom, so the
    model cannot anticipate the probe.
    """
    base = _logits(model, x, vocab_size) if base is None else base
    B, T = x.shape
    if generator is None:
        generator = torch.Generator().manual_seed(int.from_bytes(os.urandom(8), "little"))
    cuts = torch.randint(0, max(1, T - 1), (B, 1), generator=generator).to(x.device)
    future = torch.arange(T, device=x.device)[None, :] > cuts
    noise = torch.randint(1, vocab_size, x.shape, generator=generator).to(x.device)
    probe = _logits(model, torch.where(future, (x + noise) % vocab_size, x), vocab_size)
    moved = torch.log_softmax(probe, -1).clamp(min=LOGPROB_FLOOR) - torch.log_softmax(base, -1).clamp(min=LOGPROB_FLOOR)
    diff = (moved.abs().amax(-1) * ~future).amax().item()
    if not diff <= tol:
        raise CausalityError(f"the model is not causal: changing only later tokens changed the log-probabilities at "
                             f"earlier positions by up to {diff:.4g} nats. A model that sees the future gets no score; "
                             f"check the attention mask (is_causal / window) and anything else that mixes positions")


@torch.no_grad()
def _score_bpb(model, tokenizer, batch_size, prepared, device, split="val"):
    """The metric itself, shared by evaluate_bpb (in train.py's process) and evaluate_artifact (a fresh one).

    Scores exactly EVAL_TOKENS // MAX_SEQ_LEN rows of MAX_SEQ_LEN val tokens, whatever batch_size is: the
    last batch is run at full size (no recompilation) and its extra rows are not counted. Batches drawn at
    random (see CAUSALITY_PROBE_EVERY) also go through check_causality. model: callable int64[batch_size,
    MAX_SEQ_LEN] on device -> logits. Returns (bpb: float, tokens: int, the rows scored x MAX_SEQ_LEN).
    """
    T, V = prepared.max_seq_len, prepared.vocab_size
    rows = prepared.eval_tokens // T
    n_batches = -(-rows // batch_size)
    draw = random.SystemRandom()  # os.urandom: fresh in every evaluation, unseeded by anything train.py sets
    n_probes = min(n_batches, max(CAUSALITY_MIN_PROBES, n_batches // CAUSALITY_PROBE_EVERY))
    probed = set(draw.sample(range(n_batches), n_probes))
    generator = torch.Generator().manual_seed(draw.getrandbits(63))
    token_bytes = get_token_bytes(device, prepared)
    loader = make_dataloader(tokenizer, batch_size, T, split, device=device, prepared=prepared)
    total_nats = torch.zeros((), dtype=torch.float64, device=device)
    total_bytes = torch.zeros((), dtype=torch.int64, device=device)
    for i in range(n_batches):
        x, y, _ = next(loader)
        logits = _logits(model, x, V)
        if i in probed:
            check_causality(model, x, V, base=logits, generator=generator)
        n = min(rows - i * batch_size, batch_size)
        nats = F.cross_entropy(logits[:n].reshape(-1, V), y[:n].reshape(-1), reduction="none")
        nbytes = token_bytes[y[:n].reshape(-1)]
        total_nats += (nats * (nbytes > 0)).sum(dtype=torch.float64)
        total_bytes += nbytes.sum(dtype=torch.int64)
    return total_nats.item() / (math.log(2) * total_bytes.item()), rows * T


class _Forward(torch.nn.Module):
    """A plain function as a module, so torch.export can trace it."""

    def __init__(self, fn):
        super().__init__()
        self.fn = fn

    def forward(self, x):
        return self.fn(x)


def export_model(model, path, prepared=None):
    """Save model as a self-contained torch.export program at path: the input of `prepare.py --evaluate`.

    model: callable int64[B, T] -> logits; an nn.Module, a torch.compile'd one (its _orig_mod is
    exported) or a plain function. It is traced on its own device, with autocast switched off (float32
    where the weights are float32), for the one input shape the evaluator feeds: int64[EVAL_BATCH_ROWS,
    MAX_SEQ_LEN]. The file (weights included) is written through a temporary file and a rename. Returns path.
    Raises ArtifactError (the cause chained) saying why the model could not be exported and what to change.
    """
    prepared = prepared or load_prepared()
    path = Path(path)
    module = getattr(model, "_orig_mod", model)
    module = module if isinstance(module, torch.nn.Module) else _Forward(module)
    device = _device_of(module)
    shape = (EVAL_BATCH_ROWS, prepared.max_seq_len)
    x = torch.randint(0, prepared.vocab_size, shape, generator=torch.Generator().manual_seed(0)).to(device)
    try:
        with torch.autocast(device.type, enabled=False):
            program = torch.export.export(module, (x,))
    except Exception as e:
        raise ArtifactError(f"the model artifact could not be exported ({_first_lines(e)}). The score comes from a torch.export "
                            f"program of model(x), x int64{list(shape)}, run in float32 by a fresh process without train.py: use only "
                            f"torch ops that torch.export can trace (no .item(), .tolist() or Python branches on tensor values in "
                            f"forward, no custom or hub kernels; a fast path can branch on torch.compiler.is_exporting())") from e
    try:
        buffer = io.BytesIO()
        torch.export.save(program, buffer)
        path.parent.mkdir(parents=True, exist_ok=True)
        _write_atomic(path, buffer.getvalue())
    except Exception as e:
        raise ArtifactError(f"the model artifact could not be saved to {path} ({_first_lines(e)}): check that {ARTIFACT_ENV} names "
                            f"a writable file on a disk with room for the weights") from e
    return path


@torch.no_grad()
def evaluate_bpb(model, tokenizer, batch_size, prepared=None):
    """Bits per byte on the held-out split: the fixed metric.

    bpb = sum_t CE_t / (ln 2 * sum_t bytes(y_t)), where CE_t = -ln softmax(logits_t)[y_t] in nats, computed
    here in float32 from the model's logits (the model never sees the targets), bytes(y) the UTF-8 byte
    length of target token y, and special-token targets (0 bytes) excluded from both sums. Bits per byte
    does not depend on the tokenizer's vocabulary (Gao et al. 2020, The Pile, section 4.1).

    Scores exactly EVAL_TOKENS // MAX_SEQ_LEN rows of MAX_SEQ_LEN tokens, batch_size rows per call, and
    probes causality on randomly drawn batches (see _score_bpb). When $AUTORESEARCH_ARTIFACT is set the
    model is first exported there (export_model) for the separate evaluator; if the val split is then not
    readable (a sandbox keeps it from the training process) the result is nan and the score comes from
    `prepare.py --evaluate`.

    model: callable int64[B, T] -> logits[B, T, vocab_size] (any float dtype). Returns bpb as a float.
    Raises CausalityError for a model that sees the future, ValueError for logits of the wrong shape or
    non-finite ones, ArtifactError if the export fails, PrepareError if the val split is unreadable and no
    artifact was asked for.
    """
    prepared = prepared or load_prepared()
    artifact = os.environ.get(ARTIFACT_ENV)
    if artifact:
        t0 = time.time()
        export_model(model, artifact, prepared)
        print(f"evaluate_bpb: model exported to {artifact} in {time.time() - t0:.1f}s", flush=True)
    val_path = prepared.data_dir / prepared.val_name
    if not parquet_ok(val_path):
        if artifact:
            print("evaluate_bpb: the val split is evaluator-only here, so val_bpb is nan in this process; "
                  "the score comes from the separate evaluator (prepare.py --evaluate)", flush=True)
            return float("nan")
        raise PrepareError(f"the val split {val_path} is missing or unreadable: re-run prepare.py with --force")
    return _score_bpb(model, tokenizer, batch_size, prepared, _device_of(model))[0]


def load_artifact(path, device="cpu"):
    """Load a program written by export_model onto device, without running Python code from the file.

    torch.export.load unpickles parts of an archive: entries holding pickled Python objects are refused
    and every tensor is read with torch.load(weights_only=True), so a crafted file can hold tensors and a
    graph of torch ops only. Returns a callable int64[EVAL_BATCH_ROWS, MAX_SEQ_LEN] -> logits.
    Raises ArtifactError if the file is missing, is not a torch.export archive, or cannot be loaded.
    """
    path = Path(path)
    if not path.is_file():
        raise ArtifactError(f"no model artifact at {path}: train.py's call of evaluate_bpb writes it when {ARTIFACT_ENV} is set; "
                            f"make sure train.py still ends by calling evaluate_bpb on the trained model")
    try:
        with zipfile.ZipFile(path) as archive:
            names = archive.namelist()
    except (zipfile.BadZipFile, OSError) as e:
        raise ArtifactError(f"the model artifact {path} is not a torch.export archive ({e}): let evaluate_bpb write it "
                            f"(set {ARTIFACT_ENV}) instead of writing that file from train.py")
    pickled = [n for n in names if Path(n).name.startswith(("custom_obj_", "opaque_obj_"))]
    if pickled:
        raise ArtifactError(f"the model artifact {path} holds pickled Python objects ({pickled[0]}), which the evaluator does not "
                            f"load: keep script objects and custom classes out of the model; plain tensors and torch ops only")
    forced = os.environ.get("TORCH_FORCE_WEIGHTS_ONLY_LOAD")
    os.environ["TORCH_FORCE_WEIGHTS_ONLY_LOAD"] = "1"  # torch.export.load falls back to full unpickling otherwise
    try:
        program = torch.export.load(path)
    except Exception as e:
        raise ArtifactError(f"the model artifact {path} cannot be loaded ({_first_lines(e)}): it must be written by evaluate_bpb "
                            f"with {ARTIFACT_ENV} set, under this torch version, from built-in torch ops only (custom ops and hub "
                            f"kernels do not exist in the evaluator's process)") from e
    finally:
        if forced is None:
            os.environ.pop("TORCH_FORCE_WEIGHTS_ONLY_LOAD", None)
        else:
            os.environ["TORCH_FORCE_WEIGHTS_ONLY_LOAD"] = forced
    check_graph(program, path)
    try:
        program = torch.export.passes.move_to_device_pass(program, torch.device(device))
        return program.module()
    except Exception as e:
        raise ArtifactError(f"the model artifact {path} cannot be loaded ({_first_lines(e)}): it must be written by evaluate_bpb "
                            f"with {ARTIFACT_ENV} set, under this torch version, from built-in torch ops only (custom ops and hub "
                            f"kernels do not exist in the evaluator's process)") from e


# Ops a model's forward pass never needs and a crafted archive could use to reach outside the evaluation
# (file access); anything that mutates state is refused by check_graph as well.
FORBIDDEN_OPS = ("from_file", "_assert_async", "save", "print")


def check_graph(program, path):
    """Refuse a loaded program that is not a pure function of its input: one that mutates buffers or inputs (state
    kept between calls would let it answer the causality probe from memory), calls an op outside the built-in
    aten/prims namespaces, an op whose schema mutates an argument, or one of FORBIDDEN_OPS (file access).
    torch.export never writes such graphs for a plain model; a hand-edited archive can. Raises ArtifactError."""
    signature = program.graph_signature
    mutated = dict(signature.buffers_to_mutate) or dict(getattr(signature, "user_inputs_to_mutate", {}) or {})
    if mutated:
        raise ArtifactError(f"the model artifact {path} updates its own buffers or inputs ({', '.join(mutated)}): the scored "
                            f"model must be a pure function of its input; keep state out of the forward pass")
    for node in program.graph.nodes:
        if node.op != "call_function":
            continue
        target = node.target
        schema = getattr(target, "_schema", None)
        namespace = getattr(target, "namespace", None)
        name = schema.name.split("::")[-1] if schema is not None else getattr(target, "__name__", str(target))
        builtin = namespace in ("aten", "prims") or target is operator.getitem
        if not builtin or name in FORBIDDEN_OPS or (schema is not None and schema.is_mutable):
            raise ArtifactError(f"the model artifact {path} calls {name} ({namespace or 'python'}), which a model's forward "
                                f"pass may not use: built-in, side-effect-free torch ops only (an in-place op such as "
                                f"x.add_(y) in forward: write x = x + y)")


def device_profile():
    """The profile for this machine's device class when --profile is not given: default with CUDA, small with MPS,
    cpu otherwise (printed, with how to choose another)."""
    device = default_device().type
    profile = {"cuda": "default", "mps": "small"}.get(device, "cpu")
    print(f"Profile: {profile} (this machine's device is {device}; --profile to choose another)")
    return profile


def default_device():
    """cuda if available, else mps, else cpu (the separate evaluator's choice)."""
    if torch.cuda.is_available():
        return torch.device("cuda")
    if torch.backends.mps.is_available():
        return torch.device("mps")
    return torch.device("cpu")


def evaluate_artifact(path, device=None, prepared=None, split="val"):
    """The separate evaluator behind `prepare.py --evaluate`: score the program export_model wrote.

    Runs the shared scoring (_score_bpb) on the artifact in float32, EVAL_BATCH_ROWS rows per call, on
    device (default: default_device()). On CUDA float32 matmuls use TF32 (10 mantissa bits, finer than
    the bf16 of train.py's own evaluation). Returns {"val_bpb": float, "eval_seconds": float, "eval_tokens":
    int, "frozen_inputs": the sha256 hex digest of frozen_inputs, taken before scoring}. Raises
    ArtifactError (missing, corrupt or failing artifact), ValueError (logits of the wrong shape or dtype,
    non-finite logits), CausalityError, PrepareError (no prepared data or val split). split="holdout" scores the
    hidden holdout split instead (the same number of tokens), for report.py --holdout.
    """
    prepared = prepared or load_prepared()
    digest = frozen_inputs(prepared)["digest"]
    device = torch.device(device) if device is not None else default_device()
    if device.type == "cuda":
        torch.backends.cuda.matmul.allow_tf32 = True
        torch.backends.cudnn.allow_tf32 = True
    program = load_artifact(path, device)
    tokenizer = Tokenizer.from_directory(prepared.tokenizer_dir)

    def model(x):
        try:
            return program(x)
        except Exception as e:
            raise ArtifactError(f"the model artifact {path} fails on validation tokens int64{list(x.shape)} ({_first_lines(e)}): "
                                f"export it through evaluate_bpb, which traces exactly that input shape") from e

    t0 = time.time()
    bpb, tokens = _score_bpb(model, tokenizer, EVAL_BATCH_ROWS, prepared, device, split)
    return {"val_bpb": bpb, "eval_seconds": time.time() - t0, "eval_tokens": tokens, "frozen_inputs": digest}


def _sha256(path):
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def frozen_inputs(prepared=None):
    """sha256 of everything that fixes the metric, keyed by role so that a copy elsewhere hashes the same.

    Roles: "prepare.py" (this file's bytes, wherever it runs from), "prepared.json" (dataset and profile
    constants), "tokenizer.pkl", "token_bytes", "val/<file name>", "holdout/<file name>" (when there is one).
    Returns {"digest": sha256 hex of the sorted "role:sha256" lines, "files": {role: sha256 hex},
    "evaluator_only": [absolute paths that the training process must not read: the val and holdout splits, and
    the --source files they were cut from], "train_reads": [absolute paths train.py reads: prepared.json, the
    tokenizer folder, the data folder (the sandbox hides evaluator_only inside it)], "eval_reads": [absolute paths
    `--evaluate` reads besides this file and the artifact: prepared.json, the tokenizer folder, the val and holdout
    splits]}. The harness shows a sandboxed run exactly those paths. Raises PrepareError if one of the files is
    missing.
    """
    prepared = prepared or load_prepared()
    val_path = (prepared.data_dir / prepared.val_name).resolve()
    paths = {"prepare.py": Path(__file__), "prepared.json": _meta_path(prepared.root),
             "tokenizer.pkl": prepared.tokenizer_dir / "tokenizer.pkl", "token_bytes": prepared.tokenizer_dir / "token_bytes.pt",
             f"val/{prepared.val_name}": val_path}
    holdout = [(prepared.data_dir / prepared.holdout_name).resolve()] if prepared.holdout_name else []
    paths.update({f"holdout/{p.name}": p for p in holdout})
    try:
        files = {role: _sha256(p) for role, p in paths.items()}
    except OSError as e:
        raise PrepareError(f"cannot read {e.filename} to hash the frozen inputs ({e.strerror}): run this outside the training "
                           f"sandbox, or re-run prepare.py with --force if the file is gone")
    digest = hashlib.sha256("".join(f"{role}:{h}\n" for role, h in sorted(files.items())).encode()).hexdigest()
    # a --source corpus holds the val documents too (convert_source re-cuts them exactly): out of reach as well
    source = [str(Path(prepared.source).resolve())] if prepared.dataset in ("local", "sample") and \
        Path(prepared.source).exists() else []
    train = [_meta_path(prepared.root), prepared.tokenizer_dir, prepared.data_dir]
    evaluated = [_meta_path(prepared.root), prepared.tokenizer_dir, val_path, *holdout]
    # the sample corpus is committed with this target: the harness leaves it out of every run dir train.py runs in
    committed = [SAMPLE_DIR.relative_to(SAMPLE_DIR.parents[1]).as_posix()] if prepared.dataset == "sample" else []
    return {"digest": digest, "files": files, "evaluator_only": [str(val_path), *map(str, holdout), *source],
            "evaluator_only_in_target": committed,
            "train_reads": [str(p.resolve()) for p in train], "eval_reads": [str(p.resolve()) for p in evaluated]}

# ---------------------------------------------------------------------------
# Main
# ---------------------------------------------------------------------------


def prepare(dataset, source, profile, num_shards, workers, force, root=None, base_url=CLIMBMIX_URL, backoff=2.0):
    """Download or convert the data, train the tokenizer, check the val split, write prepared.json.

    New data and a new tokenizer are built beside the current ones (`*.new`) and swapped in only once
    everything checked out, so a failed run (bad input, too little text, a full disk) leaves the data
    prepared earlier usable. Raises PrepareError (and OfflineError, OSError) with the fix in the message.

    Offline, with no source, the SAMPLE_PROFILES prepare the sample corpus (SAMPLE_DIR) instead of their download,
    with a line saying so, when the cache holds nothing else; later runs with no source re-use it (--force: download
    again). The default profile never falls back: its OfflineError names --source.
    """
    root = Path(root) if root is not None else cache_dir()
    root.mkdir(parents=True, exist_ok=True)
    meta_path = _meta_path(root)
    old = None
    if meta_path.exists():
        try:
            old = json.loads(meta_path.read_text())
        except ValueError:
            old = {"dataset": "?", "source": f"an unreadable {meta_path.name}", "profile": "?"}
    if source is None and not force and old is not None and old.get("dataset") == "sample":
        source = SAMPLE_DIR   # prepared offline earlier (below): it stands in until --force or --source replaces it
    if source is not None:
        source_id = str(Path(source).expanduser().resolve())
        dataset = "sample" if source_id == str(SAMPLE_DIR) else "local"
    else:
        source_id = base_url if dataset == "climbmix" else TINYSTORIES_URL
    full_eval_tokens = profile.eval_tokens
    if dataset == "sample":
        profile = dataclass_replace(profile, eval_tokens=min(profile.eval_tokens, SAMPLE_EVAL_TOKENS))
    same = False
    if old is not None:
        same = (old.get("dataset"), old.get("source"), old.get("profile"),
                old.get("eval_tokens", profile.eval_tokens)) == (dataset, source_id, profile.name, profile.eval_tokens)
        if not same and not force:
            raise PrepareError(f"{root} already holds {old.get('dataset')} data ({old.get('source')}) prepared with profile "
                               f"{old.get('profile')!r} ({old.get('eval_tokens')} eval tokens). To replace it re-run "
                               f"with --force; to keep both, set "
                               f"AUTORESEARCH_CACHE to another folder for this one")
        if same and not force and dataset != "climbmix":
            print(f"Already prepared: {dataset} data with profile {profile.name!r} in {root} (--force to redo)")
            return load_prepared(root)
    print(f"Cache: {root}   profile: {profile.name} (MAX_SEQ_LEN={profile.max_seq_len}, "
          f"EVAL_TOKENS={profile.eval_tokens}, VOCAB_SIZE={profile.vocab_size})")
    if profile.eval_tokens < full_eval_tokens:
        print(f"Sample corpus: its val split is too small for EVAL_TOKENS={full_eval_tokens} of profile "
              f"{profile.name!r}: it scores {profile.eval_tokens} tokens (a noisier val_bpb)")

    # the sample never replaces other data, nor stands in for the default profile (21M val tokens; it holds ~0.1M)
    may_fall_back = source is None and profile.name in SAMPLE_PROFILES and SAMPLE_DIR.is_dir() and \
        (old is None or old.get("dataset") == "sample")
    staged_data = staged_tokenizer = None
    offline = False
    try:
        counts = {}
        if dataset == "climbmix":  # downloads are validated file by file and shared by every climbmix profile
            data_dir, val_name, holdout_name = root / "data" / "climbmix", VAL_SHARD_NAME, HOLDOUT_SHARD_NAME
            download_climbmix(data_dir, num_shards, workers, base_url=base_url, backoff=backoff)
        else:
            if dataset == "tinystories":
                downloads = root / "downloads"
                downloads.mkdir(parents=True, exist_ok=True)
                print("Data: downloading karpathy/tinystories-gpt4-clean")
                files = [download_file(TINYSTORIES_URL, downloads / "tinystories_gpt4_clean.parquet", backoff=backoff,
                                       progress=True)]
            else:
                files = source_files(source)
            data_dir, val_name, holdout_name = root / "data" / dataset, LOCAL_VAL_NAME, LOCAL_HOLDOUT_NAME
            staged_data = root / "data" / f"{dataset}.new"
            print(f"Data: converting {len(files)} file(s) -> {data_dir}")
            counts = convert_source(files, staged_data, profile.doc_chars)
        reuse_tokenizer = same and not force  # climbmix re-run that only adds shards
        staged_tokenizer = None if reuse_tokenizer else root / "tokenizer.new"
        staged = Prepared(root, dataset, source_id, profile, staged_data or data_dir, val_name, staged_tokenizer,
                          holdout_name)
        if reuse_tokenizer:
            print(f"Tokenizer: already trained at {staged.tokenizer_dir}")
        else:
            shutil.rmtree(staged_tokenizer, ignore_errors=True)
            train_tokenizer(staged)

        # The evaluator must score fresh text only: make sure the val split holds EVAL_TOKENS without wrapping.
        tokenizer = Tokenizer.from_directory(staged.tokenizer_dir)
        loader = make_dataloader(tokenizer, 1, profile.max_seq_len, "val", prepared=staged)
        for _ in range(profile.eval_tokens // profile.max_seq_len):
            _, _, epoch = next(loader)
            if epoch > 1:
                raise PrepareError(f"the validation split is smaller than EVAL_TOKENS={profile.eval_tokens} of profile "
                                   f"{profile.name!r}: add more text or choose a profile with fewer eval tokens")

        # Swap in. Between the unlink and the new record train.py finds no prepared data, never a mix.
        meta_path.unlink(missing_ok=True)
        if staged_data is not None:
            shutil.rmtree(data_dir, ignore_errors=True)
            staged_data.rename(data_dir)
        if staged_tokenizer is not None:
            shutil.rmtree(root / "tokenizer", ignore_errors=True)
            staged_tokenizer.rename(root / "tokenizer")
    except OfflineError:
        if not may_fall_back:
            raise
        offline = True
    finally:
        for leftover in (staged_data, staged_tokenizer):
            if leftover is not None and leftover.exists():
                shutil.rmtree(leftover, ignore_errors=True)
    if offline:
        size = sum(f.stat().st_size for f in source_files(SAMPLE_DIR)) / 2 ** 20
        print(f"offline: preparing the sample corpus shipped in data/sample/ ({size:.1f} MB of public-domain English "
              f"text) instead of {dataset}; for real data run `uv run prepare.py --force` online, or add "
              f"`--source PATH --force` for local text")
        return prepare(dataset, SAMPLE_DIR, profile, num_shards, workers, force, root, base_url, backoff)
    meta = {"dataset": dataset, "source": source_id, "profile": profile.name, "data_dir": str(data_dir.relative_to(root)),
            "val_name": val_name, "holdout_name": holdout_name, "max_seq_len": profile.max_seq_len, "eval_tokens": profile.eval_tokens,
            "vocab_size": profile.vocab_size, "doc_chars": profile.doc_chars,
            "prepared_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), **counts}
    _write_atomic(meta_path, json.dumps(meta, indent=2).encode())
    print(f"Done: {dataset} data with profile {profile.name!r} ready in {root}. Next: uv run train.py (one run), or "
          "the experiments of program.md / README.md")
    return load_prepared(root)


def speed_probe():
    """`--probe`: the seconds a fixed workload (PROBE_WORK) takes on the device the evaluator would use (cuda, else
    mps, else cpu; on a CPU one thread: what the allowance scales, start-up work, is mostly one thread, and a
    multi-threaded matmul slows 10x and more when another process takes a core). The harness runs it from the
    pristine copy before and after every run (harness.conditions): a device made busier or slower shows as a longer
    probe, so the wall-time allowance and the comparison with the best follow the machine, not train.py's word.
    Prints `probe_s: SECONDS` (the median chunk's time x PROBE_CHUNKS); returns 0."""
    torch.set_num_threads(1)
    device = default_device()
    n, reps = PROBE_WORK[device.type]
    dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
    generator = torch.Generator().manual_seed(0)
    a = (torch.randn(n, n, generator=generator) / math.sqrt(n)).to(device, dtype)
    x = torch.randn(n, n, generator=generator).to(device, dtype)

    def sync():
        if device.type == "cuda":
            torch.cuda.synchronize()
        elif device.type == "mps":
            torch.mps.synchronize()

    torch.tanh(a @ x)                                   # warm-up: kernels chosen, memory allocated
    sync()
    chunks = []
    for _ in range(PROBE_CHUNKS):
        t0 = time.perf_counter()
        for _ in range(reps // PROBE_CHUNKS):
            x = torch.tanh(a @ x)
        sync()
        chunks.append(time.perf_counter() - t0)
    print(f"probe_s: {sorted(chunks)[PROBE_CHUNKS // 2] * PROBE_CHUNKS:.6f}")
    print(f"probe_device: {device.type}")
    return 0


def evaluate_main(artifact, device=None, split="val"):
    """`--evaluate`: score the artifact and print the summary block the harness parses (`split: holdout` added when
    it scored the holdout). Returns the exit code. $AUTORESEARCH_THREADS, when set, fixes the CPU thread count (as
    train.py's)."""
    if os.environ.get("AUTORESEARCH_THREADS"):
        torch.set_num_threads(int(os.environ["AUTORESEARCH_THREADS"]))
    if device is not None:
        available = {"cpu": True, "cuda": torch.cuda.is_available(), "mps": torch.backends.mps.is_available()}
        try:
            device = torch.device(device)
        except RuntimeError:
            raise PrepareError(f"--device {device}: not a device name; use cpu, cuda, cuda:N or mps")
        if not available.get(device.type, False):
            raise PrepareError(f"--device {device}: not available here; leave --device out to pick cuda, mps or cpu")
    device = device if device is not None else default_device()
    print(f"evaluate: {artifact} on {device.type}, {split} split", flush=True)
    try:
        result = evaluate_artifact(artifact, device, split=split)
    except (ArtifactError, CausalityError, ValueError) as e:
        print(f"prepare.py: error: {e}", file=sys.stderr)
        return 1
    print("---")
    print(f"val_bpb:          {result['val_bpb']:.6f}")
    print(f"eval_seconds:     {result['eval_seconds']:.1f}")
    print(f"eval_tokens:      {result['eval_tokens']}")
    print(f"frozen_inputs:    {result['frozen_inputs']}")
    if split != "val":
        print(f"split:            {split}")
    return 0


def with_eval_tokens(profile, eval_tokens):
    """The profile, scoring eval_tokens val tokens when given (--eval-tokens). Raises PrepareError unless it is a
    positive multiple of the profile's MAX_SEQ_LEN (the evaluator scores whole rows)."""
    if eval_tokens is None:
        return profile
    if eval_tokens <= 0 or eval_tokens % profile.max_seq_len:
        raise PrepareError(f"--eval-tokens {eval_tokens}: use a positive multiple of MAX_SEQ_LEN="
                           f"{profile.max_seq_len} of profile {profile.name!r}, e.g. {8 * profile.max_seq_len}")
    return dataclass_replace(profile, eval_tokens=eval_tokens)


def main(argv=None):
    parser = argparse.ArgumentParser(description="Prepare data, tokenizer and evaluation constants for autoresearch (FROZEN).")
    parser.add_argument("--dataset", choices=["climbmix", "tinystories"],
                        help="dataset to download from Hugging Face (default: climbmix, as karpathy/autoresearch, for "
                             "the default profile; tinystories for small and cpu, which fall back to the sample in "
                             "data/sample when offline)")
    parser.add_argument("--source", metavar="PATH", help="use local .txt/.jsonl(text)/.parquet(text) files instead of downloading (offline)")
    parser.add_argument("--profile", choices=sorted(PROFILES),
                        help="evaluation constants: default (H100), small (Mac / small GPU), cpu (300 s on a CPU), lab "
                             "(60 s on 2 CPU cores, the shipped sample: research you can measure on a laptop) "
                             "(default: the class of this machine's device: default with CUDA, small with MPS, cpu "
                             "otherwise)")
    parser.add_argument("--num-shards", type=int, default=10, help="climbmix training shards to download, -1 = all (default: 10)")
    parser.add_argument("--download-workers", type=int, default=8, help="parallel downloads (default: 8)")
    parser.add_argument("--eval-tokens", type=int, metavar="N",
                        help="score N val tokens instead of the profile's EVAL_TOKENS: a quicker, noisier "
                             "evaluation for smoke tests and CI (a multiple of MAX_SEQ_LEN, e.g. 8192 with --profile "
                             "cpu); recorded with the data, so every run on it is scored alike")
    parser.add_argument("--force", action="store_true", help="replace a cache prepared with another dataset or profile")
    parser.add_argument("--check", action="store_true", help="only check that prepared data exists; exit 0 if so")
    parser.add_argument("--frozen-inputs", action="store_true",
                        help="print JSON: sha256 digest of prepare.py, tokenizer and val split, and the evaluator-only paths")
    parser.add_argument("--evaluate", metavar="ARTIFACT", help="score a model artifact written by evaluate_bpb (AUTORESEARCH_ARTIFACT)")
    parser.add_argument("--split", choices=("val", "holdout"), default="val",
                        help="with --evaluate: the split to score (holdout: hidden from the search; report.py --holdout)")
    parser.add_argument("--device", help="device for --evaluate (default: cuda, else mps, else cpu)")
    parser.add_argument("--probe", action="store_true", help="time a fixed workload on this device and print "
                        "probe_s (the harness's speed probe around each run)")
    args = parser.parse_args(argv)
    if args.eval_tokens is not None and (args.check or args.evaluate or args.frozen_inputs):
        parser.error("--eval-tokens is for preparing data (recorded with it); --check, --evaluate and "
                     "--frozen-inputs read the count from the prepared data")
    try:
        if args.probe:
            return speed_probe()
        if args.frozen_inputs:
            print(json.dumps(frozen_inputs()))
            return 0
        if args.evaluate:
            return evaluate_main(args.evaluate, args.device, args.split)
        if args.check:
            prepared = load_prepared()
            val_path = prepared.data_dir / prepared.val_name
            if not parquet_ok(val_path):
                raise PrepareError(f"prepared data in {prepared.root} is incomplete ({val_path} is missing or unreadable): "
                                   f"re-run prepare.py with --force")
            print(f"ready: {prepared.dataset} data in {prepared.root}")
            print(f"profile: {prepared.profile.name}")  # agent.py reads this line (train.py's PROFILE branch)
            return 0
        num_shards = MAX_SHARD if args.num_shards == -1 else args.num_shards
        if num_shards < 1:
            raise PrepareError(f"--num-shards {args.num_shards}: need at least 1 training shard (or -1 for all)")
        profile = args.profile or device_profile()
        dataset = args.dataset or ("climbmix" if profile == "default" else "tinystories")
        source = SAMPLE_DIR if profile == "lab" and args.source is None and args.dataset is None else args.source
        prepare(dataset, source, with_eval_tokens(PROFILES[profile], args.eval_tokens), num_shards,
                args.download_workers, args.force)
        return 0
    except PrepareError as e:
        print(f"prepare.py: error: {e}", file=sys.stderr)
        return 1
    except OSError as e:
        if e.errno == errno.ENOSPC:
            print(f"prepare.py: error: disk full while writing {e.filename or cache_dir()}: free space or set "
                  f"AUTORESEARCH_CACHE to a folder on a bigger disk", file=sys.stderr)
            return 1
        raise


if __name__ == "__main__":
    sys.exit(main())
