"""
FROZEN: data, prompt, answer extraction, reward, evaluator and preflight gate of the GRPO target.

The agent edits grpo/train.py only. It may not change this file: the metric (pass@1 on the fixed
evaluation subset, greedy decoding, MAX_NEW_TOKENS), the prompt, the answer extraction and the reward
are defined here, once, so that an experiment cannot improve its score by redefining it.

Usage (cwd = grpo/):
    uv run prepare.py                     # download GSM8K (parquet) from Hugging Face into the cache
    uv run prepare.py --source DIR        # or copy DIR/train.jsonl and DIR/test.jsonl (GSM8K format)
    uv run prepare.py --source DIR --force    # replace data prepared from another source
    uv run prepare.py --check             # exit 0 if the prepared data is usable and the base model resolves
    uv run prepare.py --preflight         # exit 0 if the base model gives a usable training signal
    uv run prepare.py --evaluate DIR      # score DIR/model.safetensors (saved by train.py) in this fresh process
    uv run prepare.py --frozen-inputs     # JSON: digest of this file, the test split and the base model's config and
                                          # tokenizer; what training and the evaluator may read (see frozen_inputs)

Scoring happens in two places that share one code path (evaluate + print_summary). Standalone, train.py
ends with evaluate_and_report(), which scores the policy in its own process. Under the harness, train.py
also saves the policy's weights (AUTORESEARCH_ARTIFACT) and cannot read the test split; the ranked pass@1
then comes from `prepare.py --evaluate DIR` in a fresh interpreter that takes nothing from train.py but
the weights: architecture, config, tokenizer, chat template, reward and decoding all come from here and
from the base model, so nothing train.py patches at run time can change the number.

Environment:
    AUTORESEARCH_CACHE        cache root (default ~/.cache/autoresearch); data lives in its grpo/ subfolder
    AUTORESEARCH_GRPO_MODEL   base model (default BASE_MODEL): an absolute path (or ~/...) to a local model directory, or
                              a hub id resolved through huggingface_hub and its cache (HF_HOME; HF_HUB_OFFLINE=1: the
                              cache only). A relative name is never read as a local folder (resolve_model)
    AUTORESEARCH_TIME_BUDGET  seconds of training, overrides TIME_BUDGET for smoke tests
    AUTORESEARCH_ARTIFACT     folder where evaluate_and_report() saves the policy's weights for --evaluate
    HF_ENDPOINT               Hugging Face mirror (default https://huggingface.co)
"""

import argparse
import contextlib
import hashlib
import json
import math
import os
import random
import re
import sys
import time
from dataclasses import dataclass, field
from fractions import Fraction
from pathlib import Path

import torch

try:  # transformers is an optional extra (`uv sync --extra rl`); --check reports its absence clearly
    import safetensors.torch
    import transformers
except ImportError:
    transformers = None

# ---------------------------------------------------------------------------
# Constants (fixed, do not modify)
# ---------------------------------------------------------------------------

METRIC_NAME = "pass@1"        # read by agent.py with ast: keep these five plain literals
METRIC_GOAL = "max"
# The largest honest |in-process pass@1 - `--evaluate` pass@1|. Both run the same code on the same float32
# weights, so on CPU they agree exactly (measured: 0 with the tiny model). 0.02 (10 of the 500 problems) covers
# GPU runs: the evaluator always builds a float32 model under bf16 autocast, so a train.py that keeps its policy
# in bf16 decodes with a bf16 residual stream in-process and an fp32 one in the evaluator; over ~300 greedy
# tokens some answers diverge and a few flip either way (about +-1.5 points by a binomial estimate, not yet
# measured on a GPU). A larger gap means train.py changed its own scoring.
METRIC_TOLERANCE = 0.02
TIME_BUDGET = 600             # seconds of GRPO training per experiment (evaluation comes on top, ~2 min on one H100)
PREFLIGHT = True              # agent.py runs `prepare.py --preflight` once before the loop

BASE_MODEL = "Qwen/Qwen2.5-0.5B-Instruct"
MAX_NEW_TOKENS = 512          # Qwen2.5-0.5B-Instruct's GSM8K solutions are ~150-300 tokens; 512 leaves room
EVAL_SIZE = 500               # problems of the test split scored per experiment (all of them if the split is smaller)
EVAL_SEED = 1234              # which 500: a seeded sample of the test split, the same for every experiment
HOLDOUT_SEED = 4321           # the hidden holdout: up to 500 more test problems, never scored during a search
EVAL_BATCH_SIZE = 64          # fixed, so that padding (and with it bf16 rounding) is the same in every run

PROMPT_TEMPLATE = (
    "{question}\n\n"
    "Solve the problem step by step. Then write the final answer as a plain number inside \\boxed{{}}."
)

PREFLIGHT_SIZE = 32           # greedy pass@1 of the base model on this many training problems
PREFLIGHT_GROUPS = 4          # ... and this many prompts sampled PREFLIGHT_GROUP_SIZE times each
PREFLIGHT_GROUP_SIZE = 8
PREFLIGHT_TEMPERATURE = 1.0   # plain sampling, the distribution GRPO rollouts start from
PREFLIGHT_SEED = 0

GSM8K_REPO = "datasets/openai/gsm8k/resolve/main/main"
GSM8K_ROWS = {"train": 7473, "test": 1319}
SPLITS = ("train", "test")
DOWNLOAD_ATTEMPTS = 3
DOWNLOAD_BACKOFF_S = 2.0      # wait 2 s, then 4 s between attempts


def cache_dir() -> Path:
    """The grpo data folder: $AUTORESEARCH_CACHE/grpo (default ~/.cache/autoresearch/grpo)."""
    root = os.environ.get("AUTORESEARCH_CACHE") or "~/.cache/autoresearch"
    return Path(root).expanduser() / "grpo"


def model_name() -> str:
    """The base model as configured: $AUTORESEARCH_GRPO_MODEL (absolute local directory or hub id) or BASE_MODEL.

    Only a name: resolve_model() turns it into the folder that is loaded and hashed."""
    return os.environ.get("AUTORESEARCH_GRPO_MODEL") or BASE_MODEL


# Files of the model folder left out of the frozen inputs' digest: the evaluator overwrites every weight with the
# artifact's (load_artifact is strict), and hashing a gigabyte on every summary would be slow. Everything else in
# the folder (config, generation config, tokenizer files, chat template) defines how the evaluator decodes.
WEIGHT_SUFFIXES = (".safetensors", ".bin", ".pt", ".pth", ".gguf", ".h5", ".msgpack", ".onnx")


def resolve_model() -> Path:
    """The base model's folder, absolute: what load_model() loads and frozen_inputs() hashes.

    model_name() is either an absolute path (or one starting with ~, expanded) to a local model directory, or a
    hub id such as BASE_MODEL, resolved only through huggingface_hub.snapshot_download: the hub, or its local
    cache (HF_HOME, default ~/.cache/huggingface; with HF_HUB_OFFLINE=1 the cache only), giving the absolute
    snapshot folder .../models--Org--Name/snapshots/<revision>. A relative name is NEVER read as a local folder,
    whatever exists in the working directory: a training run could plant its own config, tokenizer and chat
    template under the hub id's name. Raises SystemExit naming the fix for a relative path ("./x", "../x"), a
    missing directory, or a hub id that cannot be resolved.
    """
    name = model_name()
    path = Path(name).expanduser() if name.startswith("~") else Path(name)
    if path.is_absolute():
        if not path.exists():
            raise SystemExit(f"model directory {name} does not exist: fix AUTORESEARCH_GRPO_MODEL (the absolute path "
                             f"of a directory written by save_pretrained, or a hub id such as {BASE_MODEL})")
        if not path.is_dir():
            raise SystemExit(f"model path {name} is not a directory: fix AUTORESEARCH_GRPO_MODEL (the absolute path "
                             f"of a directory written by save_pretrained, or a hub id such as {BASE_MODEL})")
        return path.resolve()
    parts = name.split("/")
    if name.startswith(".") or "\\" in name or len(parts) > 2 or any(part in ("", ".", "..") for part in parts):
        raise SystemExit(f"AUTORESEARCH_GRPO_MODEL={name!r} is a relative path; a relative name is never read as a "
                         "local folder (it is a hub id or nothing): give the model directory as an absolute path "
                         f"(e.g. AUTORESEARCH_GRPO_MODEL={Path(name).absolute()}), or a hub id such as {BASE_MODEL}")
    try:
        import huggingface_hub
    except ImportError:
        raise SystemExit("huggingface_hub is not installed: run `uv sync --extra rl`") from None
    try:
        return Path(huggingface_hub.snapshot_download(repo_id=name)).resolve()
    except Exception as e:  # offline without a cached snapshot, an unknown or invalid repo id, a network error
        raise SystemExit(f"could not resolve model {name!r} through the Hugging Face hub or its cache "
                         f"({type(e).__name__}: {e}). A relative name is a hub id, never a local folder. Offline? "
                         "Download it once where the hub is reachable (it is cached under $HF_HOME, default "
                         "~/.cache/huggingface; HF_HUB_OFFLINE=1 then uses only the cache), or set "
                         "AUTORESEARCH_GRPO_MODEL to the absolute path of a local directory with the model and "
                         "tokenizer") from None


def model_files(model_dir: Path) -> dict[str, Path]:
    """{"model/<path relative to model_dir>": file} for every file under model_dir except weights (WEIGHT_SUFFIXES)
    and hidden entries (a path part starting with ".": .git, .gitattributes, the download metadata that
    huggingface_hub keeps in .cache/; none is read to load a model). Symlinks count as the files they point to."""
    files = {}
    for path in sorted(model_dir.rglob("*")):
        relative = path.relative_to(model_dir)
        if any(part.startswith(".") for part in relative.parts) or path.name.lower().endswith(WEIGHT_SUFFIXES):
            continue
        if path.is_file():
            files[f"model/{relative.as_posix()}"] = path
    return files


def model_reads(model_dir: Path) -> list[str]:
    """Absolute paths that loading model_dir reads: model_dir itself, then the targets of any of its files that are
    symlinks out of it (a Hugging Face cache snapshot .../models--Org--Name/snapshots/<revision> links each file
    into ../../blobs: those blobs alone, not the repository's other revisions; a local directory linking into a
    download cache). The harness's sandbox shows train.py and the evaluator exactly these."""
    outside = {path.resolve() for path in model_dir.rglob("*") if path.is_file()}
    return [str(model_dir)] + sorted(str(p) for p in outside if not p.is_relative_to(model_dir))


def time_budget() -> tuple[float, bool]:
    """Training seconds and whether AUTORESEARCH_TIME_BUDGET changes them (a shortened smoke run), as prepare.py's
    time_budget() and the harness (harness.target.effective_budget) read it: setting it to TIME_BUDGET changes nothing.

    Raises SystemExit if the override is not a positive, finite number.
    """
    raw = os.environ.get("AUTORESEARCH_TIME_BUDGET")
    if not raw:
        return float(TIME_BUDGET), False
    try:
        seconds = float(raw)
    except ValueError:
        seconds = -1.0
    if not (seconds > 0 and math.isfinite(seconds)):
        raise SystemExit(f"AUTORESEARCH_TIME_BUDGET={raw!r} is not a positive, finite number of seconds; unset it or "
                         "fix it")
    return seconds, seconds != TIME_BUDGET


# ---------------------------------------------------------------------------
# Answer extraction and reward (one function for training and evaluation)
# ---------------------------------------------------------------------------

# A number as written in a model's answer: optional minus (ASCII, unicode minus, en dash) glued to it, optional
# currency, digits with proper thousands separators or plain digits, optional decimals. The lookbehind keeps
# "5-3" from reading as "-3" and "x2" from reading as "2"; a spaced " - 3" is subtraction, so the sign must touch
# the digits. Only ASCII letters count as glued: Qwen sometimes answers in Chinese ("答案是18"), and CJK
# characters are word characters too. Units, "%" and a sentence's final period simply follow the match.
_NUMBER = re.compile(
    r"(?<![A-Za-z_.\d])(?P<minus>[-\u2212\u2013])?(?:[$\u20ac\u00a3\u00a5]\s?)?"
    r"(?P<digits>\d{1,3}(?:,\d{3})+(?!\d)(?:\.\d+)?|\d+(?:\.\d+)?|\.\d+)"
)
_FRAC = re.compile(r"\\[dt]?frac\{([^{}]*)\}\{([^{}]*)\}")
_ANSWER_IS = re.compile(r"answer\s*(?:is\b|:)|答案\s*(?:是|为|為|:|：)", re.IGNORECASE)
# No GSM8K answer comes near this; Python refuses int() of a string over 4,300 digits (ValueError), and a
# model can ramble out a number that long.
_MAX_NUMBER_CHARS = 100


def _numbers(text: str) -> list[Fraction | None]:
    """Every number in text, in order; None stands for one too long to be an answer (it can match nothing)."""
    values = []
    for m in _NUMBER.finditer(text):
        if len(m.group("digits")) > _MAX_NUMBER_CHARS:
            values.append(None)
            continue
        value = Fraction(m.group("digits").replace(",", ""))
        values.append(-value if m.group("minus") else value)
    return values


def _boxed(text: str) -> list[str]:
    """Contents of every \\boxed{...} in order, nested braces allowed (e.g. \\boxed{\\frac{1}{2}})."""
    contents = []
    start = text.find("\\boxed{")
    while start != -1:
        depth, i = 1, start + len("\\boxed{")
        while i < len(text) and depth:
            depth += {"{": 1, "}": -1}.get(text[i], 0)
            i += 1
        if depth == 0:
            contents.append(text[start + len("\\boxed{"):i - 1])
        start = text.find("\\boxed{", i)
    return contents


def extract_answer(text: str) -> Fraction | None:
    """The final numeric answer in a model's output, or None if it states no number it can read.

    Rules, first that yields a number wins: the first number after the last "####" (GSM8K's own format);
    the last \\boxed{...} (a \\frac{a}{b} inside counts as a/b); the first number after the last
    "answer is" / "answer:"; else the last number in the text. Numbers may carry thousands separators
    (1,234 and LaTeX 1{,}234), currency signs, units, a percent sign, a minus sign and decimals; a
    trailing period is punctuation; "答案是" / "答案：" count as "answer is". Returns an exact Fraction so that
    18, 18.0 and $18.00 compare equal. A number the rules pick that is over _MAX_NUMBER_CHARS characters long
    gives None (never an exception): no answer is that long, and the rules do not fall back to another number.
    """
    text = text.replace("{,}", ",").replace("\\$", "$").replace("\\%", "%")
    if "####" in text:
        after = _numbers(text.rsplit("####", 1)[1])
        if after:
            return after[0]
    for content in reversed(_boxed(text)):
        frac = _FRAC.search(content)
        if frac:
            num, den = _numbers(frac.group(1)), _numbers(frac.group(2))
            if len(num) == 1 and len(den) == 1 and None not in (num[0], den[0]) and den[0] != 0:
                negative = content[:frac.start()].strip().endswith(("-", "\u2212"))
                return -num[0] / den[0] if negative else num[0] / den[0]
        inside = _numbers(content)
        if inside:
            return inside[0]
    said = list(_ANSWER_IS.finditer(text))
    if said:
        after = _numbers(text[said[-1].end():])
        if after:
            return after[0]
    found = _numbers(text)
    return found[-1] if found else None


def reward(completion: str, gold: Fraction) -> float:
    """1.0 if the completion's extracted answer equals gold exactly (as numbers), else 0.0.

    The only reward of this target: train.py scores rollouts with it and evaluate() scores pass@1 with it.
    """
    answer = extract_answer(completion)
    return 1.0 if answer is not None and answer == gold else 0.0


# ---------------------------------------------------------------------------
# Data: GSM8K from Hugging Face (parquet) or a local directory of jsonl files
# ---------------------------------------------------------------------------

@dataclass
class Problem:
    question: str
    answer: str        # the reference solution, ending in "#### N"
    gold: Fraction     # N


def parse_row(row: object, where: str) -> Problem:
    """One GSM8K record {"question": str, "answer": "... #### N"} -> Problem. Raises ValueError naming `where`."""
    if not isinstance(row, dict) or not isinstance(row.get("question"), str) or not isinstance(row.get("answer"), str):
        raise ValueError(f"{where}: expected an object with string fields 'question' and 'answer'")
    if "####" not in row["answer"]:
        raise ValueError(f"{where}: the answer has no final '#### N' line (GSM8K format)")
    gold = extract_answer(row["answer"])
    if gold is None:
        raise ValueError(f"{where}: no number (of at most {_MAX_NUMBER_CHARS} characters) after '####' in the answer")
    return Problem(row["question"], row["answer"], gold)


def read_jsonl(path: Path) -> list[Problem]:
    """Problems from a GSM8K-format jsonl file. Raises ValueError naming the file and line of a bad row."""
    problems = []
    with open(path, encoding="utf-8") as f:
        for lineno, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                row = json.loads(line)
            except json.JSONDecodeError as e:
                raise ValueError(f"{path}:{lineno}: not valid JSON ({e.msg})") from None
            problems.append(parse_row(row, f"{path}:{lineno}"))
    if not problems:
        raise ValueError(f"{path}: no problems in the file")
    return problems


def write_jsonl(problems: list[Problem], path: Path) -> None:
    """Write problems as GSM8K jsonl through a temp file and a rename, so a crash never leaves half a split."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".jsonl.tmp")
    with open(tmp, "w", encoding="utf-8") as f:
        for p in problems:
            f.write(json.dumps({"question": p.question, "answer": p.answer}) + "\n")
    tmp.replace(path)


def claim_source(source_id: str, force: bool) -> None:
    """Refuse to replace data prepared from another source unless force: pass@1 on two different tasks must
    never mix in one results.tsv. Raises SystemExit naming --force and AUTORESEARCH_CACHE."""
    record = cache_dir() / "source.json"
    try:
        old = json.loads(record.read_text())["source"] if record.exists() else None
    except (OSError, ValueError, KeyError):
        old = "an unreadable source.json"
    has_data = any((cache_dir() / f"{split}.jsonl").exists() for split in SPLITS)
    if has_data and old != source_id and not force:
        raise SystemExit(f"{cache_dir()} already holds data prepared from {old or 'an unrecorded source'}; re-run with "
                         "--force to replace it, or set AUTORESEARCH_CACHE to another folder to keep both")


def record_source(source_id: str) -> None:
    cache_dir().mkdir(parents=True, exist_ok=True)
    (cache_dir() / "source.json").write_text(json.dumps({"source": source_id}) + "\n")


def import_source(source: Path, force: bool = False) -> None:
    """Validate DIR/train.jsonl and DIR/test.jsonl and copy them into the cache. Raises SystemExit on bad input
    or when the cache holds data from another source (unless force)."""
    splits = {}
    for split in SPLITS:
        path = source / f"{split}.jsonl"
        if not path.is_file():
            raise SystemExit(f"--source {source}: {path.name} is missing; the directory needs train.jsonl and "
                             "test.jsonl with one {\"question\": ..., \"answer\": \"... #### N\"} object per line")
        try:
            splits[split] = read_jsonl(path)
        except ValueError as e:
            raise SystemExit(f"--source {source}: {e}") from None
    source_id = str(source.resolve())
    claim_source(source_id, force)
    for split, problems in splits.items():
        write_jsonl(problems, cache_dir() / f"{split}.jsonl")
        print(f"{split}: {len(problems)} problems from {source / f'{split}.jsonl'}")
    record_source(source_id)


def download_split(split: str) -> list[Problem]:
    """Download one GSM8K split as parquet from Hugging Face (or $HF_ENDPOINT), validated, with retries.

    The file is streamed to a temp file and read with pyarrow; a wrong schema or row count counts as a
    failed attempt. Raises SystemExit naming `--source` when every attempt fails (e.g. offline).
    """
    import pyarrow.parquet as pq
    import requests

    endpoint = (os.environ.get("HF_ENDPOINT") or "https://huggingface.co").rstrip("/")
    url = f"{endpoint}/{GSM8K_REPO}/{split}-00000-of-00001.parquet"
    tmp = cache_dir() / f"{split}.parquet.tmp"
    tmp.parent.mkdir(parents=True, exist_ok=True)
    error = ""
    for attempt in range(DOWNLOAD_ATTEMPTS):
        if attempt:
            time.sleep(DOWNLOAD_BACKOFF_S * 2 ** (attempt - 1))
        try:
            with requests.get(url, stream=True, timeout=60) as r:
                if r.status_code == 404:  # retrying cannot help
                    error = f"HTTP 404 for {url}"
                    break
                r.raise_for_status()
                with open(tmp, "wb") as f:
                    for chunk in r.iter_content(chunk_size=1 << 20):
                        f.write(chunk)
            table = pq.read_table(tmp)
            if not {"question", "answer"} <= set(table.column_names):
                raise ValueError(f"columns {table.column_names}, expected question and answer")
            if table.num_rows != GSM8K_ROWS[split]:
                raise ValueError(f"{table.num_rows} rows, expected {GSM8K_ROWS[split]}")
            rows = table.select(["question", "answer"]).to_pylist()
            return [parse_row(row, f"{url} row {i}") for i, row in enumerate(rows)]
        except Exception as e:  # network, HTTP, truncated or foreign file: all worth another attempt
            error = f"{type(e).__name__}: {e}"
            print(f"download {split} attempt {attempt + 1}/{DOWNLOAD_ATTEMPTS} failed: {error}", file=sys.stderr)
        finally:
            tmp.unlink(missing_ok=True)
    raise SystemExit(f"could not download GSM8K {split} from {url} ({error}). Offline? Use local files instead: "
                     "`uv run prepare.py --source DIR`, DIR holding train.jsonl and test.jsonl (this workspace has "
                     "../../shared/data/gsm8k)")


def download(force: bool = False) -> None:
    """Download both GSM8K splits into the cache (nothing is written unless both succeed)."""
    claim_source(GSM8K_REPO, force)
    splits = {split: download_split(split) for split in SPLITS}
    for split, problems in splits.items():
        write_jsonl(problems, cache_dir() / f"{split}.jsonl")
        print(f"{split}: {len(problems)} problems -> {cache_dir() / f'{split}.jsonl'}")
    record_source(GSM8K_REPO)


def check(splits: tuple[str, ...] = SPLITS) -> str | None:
    """None if transformers and the prepared `splits` are usable, else a one-line message naming the fix."""
    if transformers is None:
        return "transformers is not installed: run `uv sync --extra rl`"
    for split in splits:
        path = cache_dir() / f"{split}.jsonl"
        if not path.is_file():
            return (f"GSM8K {split} split missing at {path}: run `uv run prepare.py` in grpo/ "
                    "(offline: `uv run prepare.py --source DIR`, e.g. ../../shared/data/gsm8k)")
        try:
            read_jsonl(path)
        except (OSError, ValueError) as e:
            return f"{path} is unusable ({e}): run `uv run prepare.py` (or `--source DIR`) again"
    return None


def load_problems(split: str) -> list[Problem]:
    """The cached split ("train" or "test"). Raises SystemExit naming the prepare command if it is missing.

    Only that split is checked: under the harness, train.py runs where the test split is hidden.
    """
    problem = check((split,))
    if problem:
        raise SystemExit(problem)
    return read_jsonl(cache_dir() / f"{split}.jsonl")


def eval_problems() -> list[Problem]:
    """The fixed evaluation subset: EVAL_SIZE problems of the test split drawn with EVAL_SEED, in file order."""
    test = load_problems("test")
    if len(test) <= EVAL_SIZE:
        return test
    keep = sorted(random.Random(EVAL_SEED).sample(range(len(test)), EVAL_SIZE))
    return [test[i] for i in keep]


def holdout_problems() -> list[Problem]:
    """The hidden holdout (report.py --holdout): up to EVAL_SIZE problems of the test split outside eval_problems(),
    drawn with HOLDOUT_SEED, in file order; the search never scores them. Raises SystemExit when the test split has
    none beyond the evaluation subset."""
    test = load_problems("test")
    used = set(random.Random(EVAL_SEED).sample(range(len(test)), EVAL_SIZE)) if len(test) > EVAL_SIZE else set(
        range(len(test)))
    rest = [i for i in range(len(test)) if i not in used]
    if not rest:
        raise SystemExit(f"no holdout: the test split's {len(test)} problems are all in the evaluation subset")
    keep = sorted(random.Random(HOLDOUT_SEED).sample(rest, min(EVAL_SIZE, len(rest))))
    return [test[i] for i in keep]


def is_test_split_hidden() -> bool:
    """True if this process cannot read the test split: missing, unreadable or empty.

    The harness runs train.py in a sandbox that hides the evaluator-only files (frozen_inputs()) by leaving
    them out, denying access or mounting an empty file over them; all three read as hidden.
    """
    try:
        with open(cache_dir() / "test.jsonl", "rb") as f:
            return not f.read(1)
    except OSError:
        return True


# ---------------------------------------------------------------------------
# Frozen inputs: what the metric depends on, hashed, so the harness can pin it
# ---------------------------------------------------------------------------

def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()


def source_folder() -> Path | None:
    """The local folder the cached splits were copied from (`--source DIR`, recorded in source.json), resolved, if
    it still exists; None for a download, a missing or unreadable record, or a folder that is gone. It holds the
    test split too, so it is as evaluator-only as the cached copy."""
    try:
        source = json.loads((cache_dir() / "source.json").read_text())["source"]
    except (OSError, ValueError, KeyError, TypeError):
        return None
    if not isinstance(source, str) or not Path(source).is_absolute() or not Path(source).exists():
        return None  # GSM8K_REPO, the download's record, is a relative hub path: never a local folder
    return Path(source).resolve()


def frozen_inputs() -> dict:
    """The files that define pass@1, hashed by role (not by path, so any copy of them gives the same digest), and
    what each process of a run may read. `prepare.py --frozen-inputs` prints it as one JSON object:

      "digest":         sha256 hex of the sorted "role:sha256" lines of `files`, joined by newlines.
      "files":          {role: sha256 hex of the file's bytes}: "prepare.py" (this file), "test.jsonl" (the cached
                        test split) and "model/<name>" for every file of the base model's folder (resolve_model)
                        except weights and hidden entries (model_files): config.json, generation_config.json,
                        tokenizer files, chat template. A changed chat template or config changes the digest;
                        the weights do not count (the evaluator overwrites all of them with the artifact's).
      "evaluator_only": [absolute paths the training process must not read]: the test split and, when the data
                        came from `--source DIR` and DIR still exists, DIR (resolved; it holds the test split too).
      "train_reads":    [absolute paths train.py needs to read, besides its run folder and the Python environment]:
                        the cached train split, then the base model's folder (model_reads: a Hugging Face
                        snapshot .../models--Org--Name/snapshots/<revision> and the blobs its files link to, no
                        other revision or model; a local folder itself and any target of a symlink out of it).
                        source.json is not needed.
      "eval_reads":     [absolute paths `prepare.py --evaluate DIR` (also with --split holdout) needs to read,
                        besides its own copy of prepare.py and DIR]: the test split, then the same model paths.
      "env":            {"AUTORESEARCH_GRPO_MODEL": absolute path of the resolved model folder}: to be set for every
                        later training and evaluation run, so that the base model is resolved once (at tag start)
                        and never again through a name.

    Raises SystemExit naming the prepare command if the test split is missing, and resolve_model()'s SystemExit
    if the base model cannot be resolved.
    """
    test = cache_dir() / "test.jsonl"
    if not test.is_file():
        raise SystemExit(f"GSM8K test split missing at {test}: run `uv run prepare.py` in grpo/ "
                         "(offline: `uv run prepare.py --source DIR`) with the same AUTORESEARCH_CACHE")
    model = resolve_model()
    files = {"prepare.py": _sha256(Path(__file__)), "test.jsonl": _sha256(test)}
    files.update({role: _sha256(path) for role, path in model_files(model).items()})
    lines = "\n".join(f"{role}:{sha}" for role, sha in sorted(files.items()))
    source = source_folder()
    reads = model_reads(model)
    return {"digest": hashlib.sha256(lines.encode()).hexdigest(), "files": files,
            "evaluator_only": [str(test.resolve())] + ([str(source)] if source else []),
            "train_reads": [str((cache_dir() / "train.jsonl").resolve())] + reads,
            "eval_reads": [str(test.resolve())] + reads,
            "env": {"AUTORESEARCH_GRPO_MODEL": str(model)}}


# ---------------------------------------------------------------------------
# Runtime utilities (imported by train.py)
# ---------------------------------------------------------------------------

def get_device() -> torch.device:
    """cuda if available, else cpu."""
    return torch.device("cuda" if torch.cuda.is_available() else "cpu")


def load_model(device: torch.device, dtype: torch.dtype | None = None):
    """Load the base model, resolve_model()'s folder, as (model, tokenizer) on `device`, in eval mode.

    dtype defaults to bfloat16 on cuda and float32 on cpu. The tokenizer pads on the left (decoder-only
    batched generation) and must have a chat template. The model's own sampling defaults (a hub
    generation_config may set temperature, top_k, repetition_penalty) are cleared, so that decoding is
    exactly what generate() below asks for. Raises SystemExit with the fix on any loading problem.
    """
    if transformers is None:
        raise SystemExit("transformers is not installed: run `uv sync --extra rl`")
    name = model_name()
    source = str(resolve_model())  # a local folder, absolute: never a relative one, never a hub download from here on
    if dtype is None:
        dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
    transformers.utils.logging.disable_progress_bar()  # keep run.log readable
    try:
        tokenizer = transformers.AutoTokenizer.from_pretrained(source, local_files_only=True)
        model = transformers.AutoModelForCausalLM.from_pretrained(source, dtype=dtype, local_files_only=True)
    except (OSError, ValueError) as e:
        raise SystemExit(f"could not load model {name!r} from {source}: {e}\nThe folder needs the model and its "
                         "tokenizer (save_pretrained of both): point AUTORESEARCH_GRPO_MODEL at the absolute path of "
                         "such a directory, or at a hub id whose snapshot is complete in the Hugging Face cache."
                         ) from None
    if not getattr(tokenizer, "chat_template", None):
        raise SystemExit(f"the tokenizer of {name!r} has no chat template; prompts are built with it, so use an "
                         f"instruction-tuned model (e.g. {BASE_MODEL}) or save a tokenizer with chat_template set")
    tokenizer.padding_side = "left"
    if tokenizer.pad_token_id is None:
        tokenizer.pad_token = tokenizer.eos_token
    eos = eos_ids(model)
    if tokenizer.eos_token_id is not None and tokenizer.eos_token_id not in eos:
        eos.append(tokenizer.eos_token_id)
    if not eos:
        raise SystemExit(f"model {name!r} defines no end-of-sequence token; generation could not stop early")
    model.generation_config = transformers.GenerationConfig(eos_token_id=eos, pad_token_id=tokenizer.pad_token_id)
    return model.to(device).eval(), tokenizer


def build_prompt(tokenizer, question: str) -> str:
    """The chat-formatted prompt for one question (a single user turn, generation prompt appended)."""
    messages = [{"role": "user", "content": PROMPT_TEMPLATE.format(question=question)}]
    return tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)


def eos_ids(model) -> list[int]:
    """The model's end-of-sequence token ids as a list (generation_config may hold an int, a list or None)."""
    eos = model.generation_config.eos_token_id
    return [eos] if isinstance(eos, int) else list(eos or [])


@dataclass
class Completion:
    text: str          # decoded new tokens, special tokens removed
    num_tokens: int    # new tokens up to and including the first end-of-sequence token
    truncated: bool    # stopped by max_new_tokens rather than by end-of-sequence


@torch.no_grad()
def generate(model, tokenizer, prompts: list[str], max_new_tokens: int, temperature: float | None = None,
             batch_size: int = EVAL_BATCH_SIZE) -> list[Completion]:
    """Complete each prompt: greedy if temperature is None, else plain sampling at `temperature`.

    Prompts are chat-formatted strings (build_prompt); they are batched `batch_size` at a time with left
    padding. On cuda the forward passes run under bf16 autocast, so a float32 policy decodes as a bf16 one.
    Sampling draws from torch's global RNG (seed it for reproducibility). Only eos and pad are taken from the
    model's generation_config: it is swapped for a neutral one during the call, so that settings a training
    script left on the model (say no_repeat_ngram_size) cannot change what the evaluator decodes.
    """
    device = next(model.parameters()).device
    eos = eos_ids(model)
    if temperature is None:
        config = transformers.GenerationConfig(max_new_tokens=max_new_tokens, do_sample=False, repetition_penalty=1.0,
                                               eos_token_id=eos, pad_token_id=tokenizer.pad_token_id)
    else:
        config = transformers.GenerationConfig(max_new_tokens=max_new_tokens, do_sample=True, temperature=temperature,
                                               top_k=0, top_p=1.0, repetition_penalty=1.0,
                                               eos_token_id=eos, pad_token_id=tokenizer.pad_token_id)
    completions = []
    saved = model.generation_config
    model.generation_config = transformers.GenerationConfig(eos_token_id=eos, pad_token_id=tokenizer.pad_token_id)
    try:
        for start in range(0, len(prompts), batch_size):
            batch = tokenizer(prompts[start:start + batch_size], return_tensors="pt", padding=True,
                              add_special_tokens=False).to(device)
            with torch.autocast("cuda", dtype=torch.bfloat16, enabled=device.type == "cuda"):
                out = model.generate(**batch, generation_config=config)
            for row in out[:, batch["input_ids"].shape[1]:].tolist():
                ends = [i for i, t in enumerate(row) if t in eos]
                n = ends[0] + 1 if ends else len(row)
                completions.append(Completion(tokenizer.decode(row[:n], skip_special_tokens=True), n, not ends))
    finally:
        model.generation_config = saved
    return completions


def peak_memory_mb() -> float:
    """Peak GPU memory allocated by torch in this process (MB); 0.0 on cpu."""
    return torch.cuda.max_memory_allocated() / 1024**2 if torch.cuda.is_available() else 0.0


# ---------------------------------------------------------------------------
# Evaluation (DO NOT CHANGE — this is the fixed metric)
# ---------------------------------------------------------------------------

@dataclass
class EvalResult:
    correct: int
    total: int
    truncated: int       # outputs cut off at MAX_NEW_TOKENS
    no_answer: int       # outputs with no number extract_answer could read
    seconds: float
    samples: list = field(default_factory=list)   # (question, completion, gold) of the first few problems

    @property
    def pass_at_1(self) -> float:
        return self.correct / self.total


def evaluate(model, tokenizer, problems: list[Problem] | None = None) -> EvalResult:
    """pass@1 of `model` with greedy decoding and MAX_NEW_TOKENS on `problems` (default: eval_problems()).

    One greedy completion per problem, scored by reward(); pass@1 = correct / total.
    """
    problems = eval_problems() if problems is None else problems
    model.eval()
    t0 = time.time()
    prompts = [build_prompt(tokenizer, p.question) for p in problems]
    completions = generate(model, tokenizer, prompts, MAX_NEW_TOKENS)
    correct = sum(reward(c.text, p.gold) for c, p in zip(completions, problems))
    return EvalResult(
        correct=int(correct), total=len(problems),
        truncated=sum(c.truncated for c in completions),
        no_answer=sum(extract_answer(c.text) is None for c in completions),
        seconds=time.time() - t0,
        samples=[(p.question, c.text, p.gold) for p, c in zip(problems[:2], completions[:2])],
    )


def print_summary(result: EvalResult, **extra) -> None:
    """Print example outputs, then the summary block agent.py parses: `---`, then `key: value` lines.

    pass@1 comes first, then counts, timing and peak memory, then the fixed settings and the frozen_inputs()
    digest, then `extra` (train.py's own numbers, e.g. training_seconds, num_steps), in the order given.
    """
    for question, completion, gold in result.samples:
        print(f"example question: {question[:200]!r}\nexample output:   {completion[:400]!r}\ngold: {gold}")
    budget, overridden = time_budget()
    lines = {
        "pass@1": f"{result.pass_at_1:.6f}",
        "correct": result.correct,
        "num_problems": result.total,
        "truncated": result.truncated,
        "no_answer": result.no_answer,
        "eval_seconds": f"{result.seconds:.1f}",
        "peak_vram_mb": f"{peak_memory_mb():.1f}",
        "max_new_tokens": MAX_NEW_TOKENS,
        "model": model_name(),
        "time_budget_s": f"{budget:g}",
        "frozen_inputs": frozen_inputs()["digest"],
    }
    if overridden:
        lines["budget_override"] = 1
    lines.update(extra)
    print("---")
    for key, value in lines.items():
        print(f"{key + ':':<18}{value}")


# ---------------------------------------------------------------------------
# The policy's weights as an artifact, scored in a fresh process (`--evaluate DIR`)
# ---------------------------------------------------------------------------

ARTIFACT_WEIGHTS = "model.safetensors"   # Hugging Face's name for a one-file safetensors state dict


def _unique_tensors(state: dict) -> dict:
    """state without the later names of tied tensors (Qwen2.5-0.5B's lm_head is its embedding matrix): kept
    under the first name, as save_pretrained does. safetensors refuses two names for one memory."""
    seen, unique = set(), {}
    for name, tensor in state.items():
        key = (tensor.untyped_storage().data_ptr(), tensor.storage_offset(), tuple(tensor.shape))
        if key not in seen:
            seen.add(key)
            unique[name] = tensor
    return unique


def save_artifact(model, directory: Path) -> Path:
    """Save the model's weights, and nothing else, to directory/ARTIFACT_WEIGHTS; returns that path.

    A safetensors state dict in the model's own dtypes, tied tensors stored once. Written to a temp file and
    renamed, so a crash never leaves half a file for the evaluator. A torch.compile wrapper is looked through.
    Raises SystemExit naming the folder and the fix if it cannot be written (permission, disk full, a file
    where the folder should be).
    """
    model = getattr(model, "_orig_mod", model)
    tensors = {k: v.detach().to("cpu").contiguous() for k, v in _unique_tensors(model.state_dict()).items()}
    megabytes = sum(t.numel() * t.element_size() for t in tensors.values()) / 1e6
    path = Path(directory) / ARTIFACT_WEIGHTS
    tmp = path.with_name(ARTIFACT_WEIGHTS + ".tmp")
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        safetensors.torch.save_file(tensors, tmp, metadata={"format": "pt"})
        tmp.chmod(0o644)  # safetensors creates it 0600; the evaluator may run as another user than train.py
        tmp.replace(path)
    except Exception as e:  # OSError, or safetensors' own error on a short write: all mean the same here
        with contextlib.suppress(OSError):
            tmp.unlink(missing_ok=True)
        raise SystemExit(f"could not save the policy's weights to {path} ({type(e).__name__}: {e}); without them "
                         f"this run cannot be scored. Make AUTORESEARCH_ARTIFACT={directory} a writable folder with "
                         f"{megabytes:.1f} MB free, or unset it to score in this process only") from None
    return path


def load_artifact(model, directory: Path) -> None:
    """Copy directory/ARTIFACT_WEIGHTS into `model`'s parameters, strictly, converting dtype and device.

    Every tensor of the model (tied ones once) must be there with its exact shape, and nothing else may be:
    the evaluator scores the base architecture, never one a training script built. Raises SystemExit
    listing missing keys, unexpected keys and wrong shapes (a few of each) and how to save correctly.
    """
    path = Path(directory) / ARTIFACT_WEIGHTS
    if not path.is_file():
        raise SystemExit(f"no weights to score: {path} does not exist. train.py must end with "
                         "prepare.evaluate_and_report(policy, tokenizer) while AUTORESEARCH_ARTIFACT names that folder")
    try:
        weights = safetensors.torch.load_file(path)
    except Exception as e:  # a truncated or foreign file: safetensors raises its own error type
        raise SystemExit(f"{path} is not a readable safetensors file ({e}); save it with prepare.save_artifact") from None
    expected = _unique_tensors(model.state_dict())
    missing = sorted(expected.keys() - weights.keys())
    unexpected = sorted(weights.keys() - expected.keys())
    wrong = [f"{k}: {str(weights[k].dtype)[6:]} {tuple(weights[k].shape)}, base {tuple(expected[k].shape)}"
             for k in expected
             if k in weights and (weights[k].shape != expected[k].shape or not weights[k].is_floating_point())]
    problems = [f"{len(items)} {what} ({', '.join(items[:3])}{', ...' if len(items) > 3 else ''})"
                for what, items in (("missing keys", missing), ("unexpected keys", unexpected),
                                    ("wrong shapes or non-float tensors", wrong)) if items]
    if problems:
        raise SystemExit(f"{path} does not fit the base model {model_name()!r}: " + "; ".join(problems) + ". The "
                         "evaluator builds the base architecture from its own config and loads weights strictly: train "
                         "that architecture (merge LoRA adapters, keep the parameter names) and save it with "
                         "prepare.evaluate_and_report")
    with torch.no_grad():
        for name, tensor in expected.items():
            tensor.copy_(weights[name])


def evaluate_and_report(model, tokenizer, **extra) -> float:
    """The end of train.py: save the weights if the harness asks for them, then score here if the test split
    is readable. Returns pass@1, or NaN when the test split is hidden (the score then comes from --evaluate).

    With AUTORESEARCH_ARTIFACT=DIR the weights go to DIR first (save_artifact), before anything that could fail.
    Standalone, it evaluates and prints the summary (print_summary, `extra` appended) as always. Under the
    harness the test split is hidden: it says so and prints the summary with `pass@1: nan` (time_budget_s, peak
    memory and `extra` still there). Raises
    SystemExit if the split is hidden and AUTORESEARCH_ARTIFACT is unset (nothing could score the run).
    """
    artifact = os.environ.get("AUTORESEARCH_ARTIFACT")
    if artifact:
        save_artifact(model, Path(artifact))
    if is_test_split_hidden():
        if not artifact:
            raise SystemExit(f"the test split {cache_dir() / 'test.jsonl'} is missing or unreadable and "
                             "AUTORESEARCH_ARTIFACT is not set, so nothing can score this run: run `uv run prepare.py` "
                             "(or --source DIR) for a standalone run, or set AUTORESEARCH_ARTIFACT=DIR and score it "
                             "with `prepare.py --evaluate DIR`")
        print(f"score: pass@1 comes from the separate evaluator, `prepare.py --evaluate {artifact}` (the test split "
              "is hidden from training)", flush=True)
        budget, overridden = time_budget()         # the rest of the summary still stands: the harness checks it
        lines = {"pass@1": "nan", "peak_vram_mb": f"{peak_memory_mb():.1f}", "time_budget_s": f"{budget:g}",
                 **({"budget_override": 1} if overridden else {}), **extra}
        print("---")
        for key, value in lines.items():
            print(f"{key + ':':<18}{value}")
        return math.nan
    result = evaluate(model, tokenizer)
    print_summary(result, **extra)
    return result.pass_at_1


def evaluate_artifact(directory: Path, split: str = "eval") -> EvalResult:
    """pass@1 of the weights in directory/ARTIFACT_WEIGHTS: `prepare.py --evaluate DIR`, in a fresh process. split:
    eval (the evaluation subset, the metric) or holdout (holdout_problems(), for report.py --holdout).

    The model is the base model (load_model: its config, tokenizer, chat template), in float32 with bf16
    autocast on cuda like train.py's policy, with the artifact's weights loaded strictly over it; scoring is
    evaluate(), the code train.py's in-process score runs. Raises SystemExit on a bad artifact (load_artifact).
    """
    problems = holdout_problems() if split == "holdout" else None
    model, tokenizer = load_model(get_device(), dtype=torch.float32)
    load_artifact(model, directory)
    return evaluate(model, tokenizer, problems)


# ---------------------------------------------------------------------------
# Preflight gate: refuse to start on a degenerate training signal
# ---------------------------------------------------------------------------

@dataclass
class PreflightReport:
    correct: int                 # greedy answers right, of `total`
    total: int
    groups: list                 # rewards of each sampled group, PREFLIGHT_GROUPS lists of PREFLIGHT_GROUP_SIZE
    truncated: int               # greedy outputs cut off at MAX_NEW_TOKENS
    no_answer: int               # greedy outputs with no readable number
    samples: list                # a few (completion, gold) pairs to show


def run_preflight(model, tokenizer, problems: list[Problem]) -> PreflightReport:
    """Greedy pass@1 on the first PREFLIGHT_SIZE of `problems` and the rewards of PREFLIGHT_GROUPS groups of
    PREFLIGHT_GROUP_SIZE samples (temperature PREFLIGHT_TEMPERATURE), seeded with PREFLIGHT_SEED."""
    greedy_set = problems[:PREFLIGHT_SIZE]
    prompts = [build_prompt(tokenizer, p.question) for p in greedy_set]
    greedy = generate(model, tokenizer, prompts, MAX_NEW_TOKENS)
    torch.manual_seed(PREFLIGHT_SEED)
    group_set = problems[:PREFLIGHT_GROUPS]
    prompts = [build_prompt(tokenizer, p.question) for p in group_set for _ in range(PREFLIGHT_GROUP_SIZE)]
    sampled = generate(model, tokenizer, prompts, MAX_NEW_TOKENS, temperature=PREFLIGHT_TEMPERATURE)
    groups = [[reward(sampled[g * PREFLIGHT_GROUP_SIZE + i].text, p.gold) for i in range(PREFLIGHT_GROUP_SIZE)]
              for g, p in enumerate(group_set)]
    return PreflightReport(
        correct=int(sum(reward(c.text, p.gold) for c, p in zip(greedy, greedy_set))),
        total=len(greedy_set),
        groups=groups,
        truncated=sum(c.truncated for c in greedy),
        no_answer=sum(extract_answer(c.text) is None for c in greedy),
        samples=[(c.text, p.gold) for c, p in zip(greedy[:3], greedy_set[:3])],
    )


def preflight_verdict(report: PreflightReport) -> str | None:
    """None if the signal is usable, else the message naming the likely causes.

    Degenerate = no greedy answer right, or every sampled group with identical rewards (then every
    group-normalised GRPO advantage is zero and training cannot move).
    """
    flat_groups = [g for g in report.groups if len(set(g)) == 1]
    problems = []
    if report.correct == 0:
        problems.append(f"the base model answered 0 of {report.total} problems correctly (greedy)")
    if len(flat_groups) == len(report.groups):
        problems.append(f"all {len(report.groups)} sampled groups of {PREFLIGHT_GROUP_SIZE} got identical rewards "
                        "(every GRPO advantage would be zero)")
    if not problems:
        return None
    return (
        "PREFLIGHT FAILED: degenerate training signal: " + "; ".join(problems) + ".\nLikely causes:\n"
        f"  - answer extraction: {report.no_answer}/{report.total} outputs had no number extract_answer could read "
        "(compare the outputs above with the expected answers)\n"
        f"  - max new tokens: {report.truncated}/{report.total} outputs hit MAX_NEW_TOKENS={MAX_NEW_TOKENS} "
        "before the end-of-sequence token\n"
        "  - prompt format: the chat template or PROMPT_TEMPLATE does not lead this model to a final answer\n"
        f"  - model path: AUTORESEARCH_GRPO_MODEL / BASE_MODEL = {model_name()!r} is not the intended "
        "instruction-tuned model\n"
        "  - data: the task may be far too hard for this model (e.g. a tiny test model on real GSM8K)\n"
        "Not starting the loop: fix the cause, then run `uv run prepare.py --preflight` again."
    )


def preflight() -> int:
    """Load data and the base model, run the gate, print the report; 0 if healthy, 1 if degenerate."""
    problems = load_problems("train")
    sample = random.Random(PREFLIGHT_SEED).sample(problems, min(PREFLIGHT_SIZE, len(problems)))
    model, tokenizer = load_model(get_device())
    t0 = time.time()
    report = run_preflight(model, tokenizer, sample)
    for completion, gold in report.samples:
        print(f"output: {completion[:300]!r}\n  extracted: {extract_answer(completion)}  expected: {gold}")
    print(f"preflight: greedy pass@1 {report.correct}/{report.total}, group rewards {report.groups}, "
          f"{time.time() - t0:.1f}s")
    verdict = preflight_verdict(report)
    if verdict:
        print(verdict, file=sys.stderr)
        return 1
    print("preflight: OK, the training signal is not degenerate")
    return 0


# ---------------------------------------------------------------------------
# Main
# ---------------------------------------------------------------------------

def main(argv: list[str] | None = None) -> int:
    """The command line (see the module docstring); returns the exit status. Failures raise SystemExit with
    a message naming the fix (exit status 1)."""
    parser = argparse.ArgumentParser(description="Prepare GSM8K for the GRPO target, check the training signal, "
                                                 "score saved weights.")
    parser.add_argument("--source", type=Path, help="directory with train.jsonl and test.jsonl in GSM8K format")
    parser.add_argument("--check", action="store_true", help="exit 0 if the prepared data is usable")
    parser.add_argument("--preflight", action="store_true", help="exit 0 if the base model's reward signal is healthy")
    parser.add_argument("--force", action="store_true", help="replace data prepared from another source")
    parser.add_argument("--evaluate", type=Path, metavar="DIR",
                        help=f"score DIR/{ARTIFACT_WEIGHTS} on the base model and print the summary")
    parser.add_argument("--split", choices=("eval", "holdout"), default="eval",
                        help="with --evaluate: the evaluation subset (pass@1), or the hidden holdout (report.py --holdout)")
    parser.add_argument("--frozen-inputs", action="store_true",
                        help="print the digest of the files that define pass@1 as JSON")
    args = parser.parse_args(argv)
    if args.frozen_inputs:
        print(json.dumps(frozen_inputs()))
        return 0
    if args.evaluate:
        extra = {"split": "holdout"} if args.split == "holdout" else {}
        print_summary(evaluate_artifact(args.evaluate, args.split), **extra)
        return 0
    if args.check:
        message = check()
        if not message:
            try:
                resolve_model()
            except SystemExit as e:
                message = str(e)
        if message:
            print(message, file=sys.stderr)
            return 1
        print(f"profile: {get_device().type}")  # agent.py's random/grid proposers edit train.py's `if PROFILE ==` branch
        return 0
    if args.preflight:
        return preflight()
    if args.source:
        import_source(args.source, args.force)
    else:
        download(args.force)
    return 0


if __name__ == "__main__":
    sys.exit(main())
