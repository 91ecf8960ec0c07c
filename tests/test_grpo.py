"""Tests of the GRPO target (grpo/): offline, CPU, a tiny Qwen2 built from a config (grpo/tiny.py)."""

import ast
import hashlib
import http.server
import importlib.util
import json
import math
import os
import random
import re
import shlex
import shutil
import subprocess
import sys
import threading
from fractions import Fraction
from pathlib import Path

import pytest
import torch

REPO = Path(__file__).resolve().parents[1]
GRPO = REPO / "grpo"
GSM8K = REPO.parent / "shared" / "data" / "gsm8k"


def _load(name: str, prepare_module=None, path: Path | None = None):
    """Import grpo/<name>.py (or `path`) under a private name. train.py and tiny.py say `from prepare import ...`,
    which must mean grpo/prepare.py, not the pretraining prepare.py at the repo root: bind it for the import only."""
    spec = importlib.util.spec_from_file_location(f"grpo_{name}", path or GRPO / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    saved = sys.modules.get("prepare")
    if prepare_module is not None:
        sys.modules["prepare"] = prepare_module
    try:
        spec.loader.exec_module(module)
    finally:
        if saved is None:
            sys.modules.pop("prepare", None)
        else:
            sys.modules["prepare"] = saved
    return module


# One thread: on a small shared CPU, torch's second OpenMP thread makes generation ~20x slower, not faster.
torch.set_num_threads(1)


class _OnFirstUse:
    """grpo/<name>.py, imported on first use: tiny.py imports transformers' model classes (seconds), which
    `pytest -m "not slow"` never needs."""

    def __init__(self, name):
        self._name, self._module = name, None

    def __getattr__(self, attr):
        if attr.startswith("_"):        # pytest looking for fixtures and marks in the test module's names
            raise AttributeError(attr)
        if self._module is None:
            self._module = _load(self._name, prepare)
        return getattr(self._module, attr)


prepare = _load("prepare")
tiny = _OnFirstUse("tiny")
train = _load("train", prepare)


def _env(cache: Path, model: Path | None = None, **extra) -> dict:
    env = {k: v for k, v in os.environ.items() if not k.startswith("AUTORESEARCH_")}
    env["AUTORESEARCH_CACHE"] = str(cache)
    env["OMP_NUM_THREADS"] = "1"
    if model is not None:
        env["AUTORESEARCH_GRPO_MODEL"] = str(model)
    env.update(extra)
    return env


def _run(args: list[str], env: dict, timeout: int = 120) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, *args], cwd=GRPO, env=env, capture_output=True, text=True, timeout=timeout)


def _summary(stdout: str) -> list[tuple[str, str]]:
    """The last `---` block as (key, value) pairs in order, parsed the way agent.py does."""
    block = stdout.rsplit("\n---\n", 1)[1]
    return [tuple(part.strip() for part in line.split(":", 1)) for line in block.splitlines() if ":" in line]


@pytest.fixture(autouse=True)
def _isolated(monkeypatch, tmp_path):
    for key in [k for k in os.environ if k.startswith("AUTORESEARCH_")]:
        monkeypatch.delenv(key)
    monkeypatch.setenv("AUTORESEARCH_CACHE", str(tmp_path / "cache"))


@pytest.fixture(scope="session")
def tiny_dir(tiny_build) -> Path:
    """Warm-started tiny model (format only) and the one-digit sums task: the session's one `tiny.py` build
    (conftest.py), read-only."""
    return tiny_build


@pytest.fixture(scope="session")
def random_dir(tmp_path_factory) -> Path:
    """A randomly initialised tiny model: it cannot do GSM8K."""
    out = tmp_path_factory.mktemp("random")
    tiny.make_tiny(out, warm_start_steps=0)
    return out


def _tiny_model(model_dir: Path, monkeypatch):
    monkeypatch.setenv("AUTORESEARCH_GRPO_MODEL", str(model_dir))
    return prepare.load_model(torch.device("cpu"))


def _problems(rows: list[dict]) -> list:
    return [prepare.parse_row(row, f"row {i}") for i, row in enumerate(rows)]


# ---------------------------------------------------------------------------
# Contract constants
# ---------------------------------------------------------------------------

def test_contract_constants_are_plain_literals():
    tree = ast.parse((GRPO / "prepare.py").read_text())
    literals = {node.targets[0].id: node.value.value for node in tree.body
                if isinstance(node, ast.Assign) and isinstance(node.value, ast.Constant)
                and isinstance(node.targets[0], ast.Name)}
    assert literals["METRIC_NAME"] == "pass@1"
    assert literals["METRIC_GOAL"] == "max"
    assert literals["METRIC_TOLERANCE"] == 0.02  # 10 of the 500 evaluation problems
    assert literals["PREFLIGHT"] is True
    assert literals["TIME_BUDGET"] == 600
    assert literals["BASE_MODEL"] == "Qwen/Qwen2.5-0.5B-Instruct"
    assert (GRPO / "prepare.py").read_text().splitlines()[1].startswith("FROZEN")
    assert (GRPO / "train.py").read_text().splitlines()[1].startswith("MUTABLE")


def test_time_budget_override(monkeypatch):
    assert prepare.time_budget() == (600.0, False)
    monkeypatch.setenv("AUTORESEARCH_TIME_BUDGET", "12.5")
    assert prepare.time_budget() == (12.5, True)
    monkeypatch.setenv("AUTORESEARCH_TIME_BUDGET", "soon")
    with pytest.raises(SystemExit, match="AUTORESEARCH_TIME_BUDGET='soon' is not a positive, finite number of seconds"):
        prepare.time_budget()


# ---------------------------------------------------------------------------
# Answer extraction and reward
# ---------------------------------------------------------------------------

EXTRACTION_TABLE = [
    ("Janet sells 16 - 3 - 4 = 9 eggs.\nShe makes 9 * 2 = $18 every day.\n#### 18", 18),
    ("She has 5 + 3 = 8 apples. Therefore the final answer is \\boxed{8}.", 8),
    ("The total cost is $1,234.50.\nThe answer is $1,234.50.", Fraction(2469, 2)),
    ("So she makes 18 dollars per day at the market.", 18),
    ("The answer is 18. Check: 16 - 3 - 4 = 9 eggs, 9 * 2 = 18.", 18),
    ("Half of the pie is left: \\boxed{\\frac{1}{2}}", Fraction(1, 2)),
    ("The temperature fell to -5 degrees.", -5),
    ("It dropped to \u221212\u00b0C overnight.", -12),
    ("First, 5-3=2.", 2),
    ("So the toy costs 18.00 dollars.", 18),
    ("The answer is 50%.", 50),
    ("The company earned 1,000,000 dollars.", 1000000),
    ("I count 3,4, and 5 marbles in the bags", 5),
    ("I am not sure how to solve this.", None),
    ("", None),
    ("Total eggs: \\boxed{18 \\text{ eggs}}", 18),
    ("He pays 70,000 in total.\n#### $70,000", 70000),
    ("Adding everything up.\n\nThe final answer is: **42**", 42),
    ("So \\boxed{3}. Wait, I forgot the last box: \\boxed{5}", 5),
    ("Answer: 7 apples. (At first I thought it was 6.)", 7),
    ("The trip takes 2.5 hours.", Fraction(5, 2)),
    ("Let's compute 12 * 3 = 36, then 36 +", 36),
    ("She saves $\\boxed{1{,}000}$ dollars.", 1000),
    ("The answer is 5.\n\n#### 6", 6),
    ("The balance is $\\boxed{-3}$.", -3),
    ("The difference is \\boxed{-\\frac{3}{4}}", Fraction(-3, 4)),
    ("There are 12 - 5 left", 5),
    ("It costs \\$\\boxed{\\$18}", 18),
    ("The 3rd day she runs 4 miles, so the answer is 4 miles.", 4),
    ("答案是18", 18),                                   # Qwen sometimes answers in Chinese
    ("她每天赚18美元。", 18),
    ("答案：18，不是20", 18),
    ("第3天她跑了4英里", 4),
    ("x2", None),                                       # ASCII letters still glue: a name, not a number
]


@pytest.mark.parametrize("text, expected", EXTRACTION_TABLE)
def test_extract_answer(text, expected):
    assert prepare.extract_answer(text) == (None if expected is None else Fraction(expected))


def test_extraction_survives_enormous_numbers():
    """int() refuses strings over 4,300 digits; a rambling model must cost a reward of 0, never a crash."""
    huge = "9" * 5000
    assert prepare.extract_answer(f"The answer is {huge}") is None
    assert prepare.reward(f"The answer is {huge}", Fraction(18)) == 0.0
    # the rules pick the huge number and do not fall back to an earlier, matching one
    assert prepare.reward(f"I think 18.\n#### {huge}", Fraction(18)) == 0.0
    assert prepare.reward(f"\\boxed{{\\frac{{{huge}}}{{2}}}} so 18", Fraction(18)) == 0.0
    assert prepare.extract_answer("1" * 100) == int("1" * 100)  # the longest number still read
    with pytest.raises(ValueError, match=r"row 3: no number \(of at most 100 characters\) after '####'"):
        prepare.parse_row({"question": "q", "answer": f"#### {huge}"}, "row 3")


def test_reward_is_exact_numeric_match():
    gold = prepare.parse_row({"question": "q", "answer": "2 + 2 = <<2+2=4>>4 dollars... 1,000 - 4 = 996\n#### 1,000"},
                             "row").gold
    assert gold == 1000
    assert prepare.reward("That is \\boxed{1000}.", gold) == 1.0
    assert prepare.reward("The answer is $1,000.00.", gold) == 1.0
    assert prepare.reward("The answer is 100.", gold) == 0.0
    assert prepare.reward("The answer is 10000.", gold) == 0.0
    assert prepare.reward("no idea", gold) == 0.0
    assert prepare.reward("#### 7", Fraction(7)) == 1.0


# ---------------------------------------------------------------------------
# Data
# ---------------------------------------------------------------------------

@pytest.mark.slow
def test_check_then_source_then_check(tiny_dir, monkeypatch, capsys):
    monkeypatch.setenv("AUTORESEARCH_GRPO_MODEL", str(tiny_dir / "model"))  # --check also resolves the base model
    assert prepare.main(["--check"]) == 1
    err = capsys.readouterr().err
    assert "uv run prepare.py --source DIR`, e.g. ../../shared/data/gsm8k" in err
    assert len(err.strip().splitlines()) == 1
    assert prepare.main(["--source", str(GSM8K)]) == 0
    out = capsys.readouterr().out
    assert "train: 7473 problems" in out and "test: 1319 problems" in out
    assert prepare.main(["--check"]) == 0
    assert capsys.readouterr().out == "profile: cpu\n"  # agent.py's random proposer edits train.py's cpu branch
    assert [len(prepare.load_problems(s)) for s in ("train", "test")] == [7473, 1319]
    # the fixed evaluation subset: 500 distinct test problems, the same on every call
    subset = prepare.eval_problems()
    assert len(subset) == 500 and len({p.question for p in subset}) == 500
    assert [p.question for p in subset] == [p.question for p in prepare.eval_problems()]
    # the hidden holdout (report.py --holdout): 500 other test problems, never in the evaluation subset
    holdout = prepare.holdout_problems()
    assert len(holdout) == 500 and not {p.question for p in holdout} & {p.question for p in subset}
    assert [p.question for p in holdout] == [p.question for p in prepare.holdout_problems()]


@pytest.mark.slow
def test_another_source_is_refused_without_force(tiny_dir):
    assert prepare.main(["--source", str(GSM8K)]) == 0
    assert prepare.main(["--source", str(GSM8K)]) == 0  # the same source again is fine
    with pytest.raises(SystemExit, match=r"already holds data prepared from .*gsm8k; re-run with --force to replace "
                                         r"it, or set AUTORESEARCH_CACHE to another folder"):
        prepare.main(["--source", str(tiny_dir / "sums")])
    assert len(prepare.load_problems("test")) == 1319  # untouched
    assert prepare.main(["--source", str(tiny_dir / "sums"), "--force"]) == 0
    assert len(prepare.load_problems("test")) == 100


def test_source_rejects_bad_rows(tmp_path):
    src = tmp_path / "src"
    src.mkdir()
    (src / "train.jsonl").write_text(json.dumps({"question": "q", "answer": "4"}) + "\n")
    (src / "test.jsonl").write_text(json.dumps({"question": "q", "answer": "#### 4"}) + "\n")
    with pytest.raises(SystemExit, match=r"train.jsonl:1: the answer has no final '#### N' line"):
        prepare.import_source(src)
    (src / "train.jsonl").unlink()
    with pytest.raises(SystemExit, match="train.jsonl is missing"):
        prepare.import_source(src)
    assert not (prepare.cache_dir() / "test.jsonl").exists()  # nothing half-written


class _Parquet(http.server.SimpleHTTPRequestHandler):
    def log_message(self, *args):
        pass


@pytest.fixture
def hub(tmp_path, monkeypatch):
    """A local stand-in for huggingface.co serving GSM8K's parquet layout (HF_ENDPOINT points at it)."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    root = tmp_path / "hub"
    folder = root / prepare.GSM8K_REPO
    folder.mkdir(parents=True)
    for split in ("train", "test"):
        rows = [json.loads(line) for line in (GSM8K / f"{split}.jsonl").read_text().splitlines()]
        pq.write_table(pa.Table.from_pylist(rows), folder / f"{split}-00000-of-00001.parquet")
    handler = lambda *a, **k: _Parquet(*a, directory=str(root), **k)  # noqa: E731
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    monkeypatch.setenv("HF_ENDPOINT", f"http://127.0.0.1:{server.server_port}")
    monkeypatch.setattr(prepare, "DOWNLOAD_BACKOFF_S", 0.0)
    yield folder
    server.shutdown()


def test_download_from_hub(hub):
    prepare.download()
    test = prepare.load_problems("test")
    assert len(prepare.load_problems("train")) == 7473 and len(test) == 1319
    first = json.loads((GSM8K / "test.jsonl").read_text().splitlines()[0])
    assert (test[0].question, test[0].answer, test[0].gold) == (first["question"], first["answer"], 18)
    assert sorted(p.name for p in prepare.cache_dir().iterdir()) == ["source.json", "test.jsonl", "train.jsonl"]  # no temp files left


def test_download_errors_name_the_offline_fix(hub, capsys):
    (hub / "test-00000-of-00001.parquet").write_bytes(b"not a parquet file")
    with pytest.raises(SystemExit, match=r"could not download GSM8K test .*--source DIR`, DIR holding train.jsonl"):
        prepare.download()
    assert capsys.readouterr().err.count("attempt") == prepare.DOWNLOAD_ATTEMPTS  # retried, then gave up
    (hub / "test-00000-of-00001.parquet").unlink()
    with pytest.raises(SystemExit, match="HTTP 404"):
        prepare.download()
    assert not prepare.cache_dir().joinpath("train.jsonl").exists()  # all or nothing


# ---------------------------------------------------------------------------
# Model loading
# ---------------------------------------------------------------------------

@pytest.mark.slow
def test_load_model_errors(tmp_path, monkeypatch):
    monkeypatch.setenv("AUTORESEARCH_GRPO_MODEL", str(tmp_path / "nowhere"))
    with pytest.raises(SystemExit, match="does not exist: fix AUTORESEARCH_GRPO_MODEL"):
        prepare.load_model(torch.device("cpu"))
    tokenizer = tiny.build_tokenizer()
    tokenizer.chat_template = None
    tokenizer.save_pretrained(tmp_path / "plain")
    tiny.build_model(tokenizer).save_pretrained(tmp_path / "plain")
    monkeypatch.setenv("AUTORESEARCH_GRPO_MODEL", str(tmp_path / "plain"))
    with pytest.raises(SystemExit, match="has no chat template"):
        prepare.load_model(torch.device("cpu"))


# ---------------------------------------------------------------------------
# Evaluator
# ---------------------------------------------------------------------------

@pytest.mark.slow
def test_evaluator_on_tiny_model(tiny_dir, monkeypatch, capsys):
    model, tokenizer = _tiny_model(tiny_dir / "model", monkeypatch)
    prepare.import_source(tiny_dir / "sums")
    capsys.readouterr()
    problems = prepare.eval_problems()
    assert len(problems) == 100  # the split is smaller than EVAL_SIZE: all of it
    model.generation_config.min_new_tokens = 20  # left on the model by a training script: must not count
    result = prepare.evaluate(model, tokenizer)
    assert model.generation_config.min_new_tokens == 20  # restored after the call
    # The warm start taught the format and to guess, 7 most often, so greedy decoding always says 7: pass@1 is
    # exactly the share of test sums that equal 7.
    assert [c for _, c, _ in result.samples] == ["#### 7", "#### 7"]
    sevens = sum(p.gold == 7 for p in problems)
    assert (result.correct, result.total, result.truncated, result.no_answer) == (sevens, 100, 0, 0)
    monkeypatch.setenv("AUTORESEARCH_TIME_BUDGET", "5")
    prepare.print_summary(result, num_steps=3)
    summary = _summary(capsys.readouterr().out)
    assert summary[0] == ("pass@1", f"{sevens / 100:.6f}")
    values = dict(summary)
    assert (values["correct"], values["num_problems"], values["peak_vram_mb"]) == (str(sevens), "100", "0.0")
    assert values["frozen_inputs"] == prepare.frozen_inputs()["digest"]
    assert (values["budget_override"], values["num_steps"], values["max_new_tokens"]) == ("1", "3", "512")


# ---------------------------------------------------------------------------
# The separate evaluator: weights out of train.py, the score from a fresh process
# ---------------------------------------------------------------------------

def _nudged_policy(tiny_dir: Path, monkeypatch):
    """The tiny base model, then supervised towards always answering 4: weights the evaluator must carry over
    (greedy says 4 where the base says 7)."""
    model, tokenizer = _tiny_model(tiny_dir / "model", monkeypatch)
    tiny.warm_start(model, tokenizer, tiny.digit_sums(100, seed=5), steps=30, seed=1, answers=(4,))
    return model, tokenizer


@pytest.mark.slow
def test_separate_evaluator_scores_the_weights_and_ignores_train_side_cheats(tiny_dir, tmp_path, monkeypatch, capsys):
    prepare.import_source(tiny_dir / "sums")
    problems = prepare.eval_problems()
    policy, tokenizer = _nudged_policy(tiny_dir, monkeypatch)
    capsys.readouterr()
    monkeypatch.setenv("AUTORESEARCH_ARTIFACT", str(tmp_path / "honest"))
    honest = prepare.evaluate_and_report(policy, tokenizer, num_steps=1)
    assert honest == sum(p.gold == 4 for p in problems) / len(problems)  # greedy says 4 to every sum
    assert _summary(capsys.readouterr().out)[0] == ("pass@1", f"{honest:.6f}")
    assert (tmp_path / "honest" / "model.safetensors").is_file()

    # A hostile train.py rewires its own process before the final call: reward, extraction, decoding length,
    # problem subset, chat template. In-process that buys a perfect score ...
    monkeypatch.setattr(prepare, "reward", lambda completion, gold: 1.0)
    monkeypatch.setattr(prepare, "extract_answer", lambda text: Fraction(7))
    monkeypatch.setattr(prepare, "MAX_NEW_TOKENS", 1)
    monkeypatch.setattr(prepare, "eval_problems", lambda: problems[:3])
    tokenizer.chat_template = "{{ messages[0]['content'] }}"
    monkeypatch.setenv("AUTORESEARCH_ARTIFACT", str(tmp_path / "cheat"))
    assert prepare.evaluate_and_report(policy, tokenizer) == 1.0
    capsys.readouterr()

    # ... and nothing in the fresh process, run from a pristine copy of prepare.py in another folder
    pristine = tmp_path / "evaluator" / "prepare.py"
    pristine.parent.mkdir()
    shutil.copy(GRPO / "prepare.py", pristine)
    env = _env(prepare.cache_dir().parent, tiny_dir / "model")
    result = subprocess.run([sys.executable, str(pristine), "--evaluate", str(tmp_path / "cheat")], cwd=tmp_path,
                            env=env, capture_output=True, text=True, timeout=180)
    assert result.returncode == 0, result.stderr[-2000:]
    summary = _summary(result.stdout)
    assert summary[0][0] == "pass@1"
    separate = float(summary[0][1])
    assert abs(separate - honest) <= prepare.METRIC_TOLERANCE
    assert separate == honest  # same float32 weights, same code, same CPU: exactly equal
    values = dict(summary)
    assert values["num_problems"] == "100" and float(values["eval_seconds"]) > 0
    assert values["frozen_inputs"] == prepare.frozen_inputs()["digest"]


@pytest.mark.slow
def test_artifact_holds_weights_only_and_loads_strictly(tiny_dir, tmp_path, monkeypatch):
    import safetensors.torch

    policy, _ = _nudged_policy(tiny_dir, monkeypatch)
    path = prepare.save_artifact(policy, tmp_path / "good")
    assert sorted(p.name for p in path.parent.iterdir()) == ["model.safetensors"]  # no config, no tokenizer
    assert path.stat().st_mode & 0o777 == 0o644  # readable by an evaluator running as another user
    weights = safetensors.torch.load_file(path)
    state = policy.state_dict()
    assert sorted(weights) == sorted(k for k in state if k != "lm_head.weight")  # the tied head is stored once
    base, _ = _tiny_model(tiny_dir / "model", monkeypatch)
    prepare.load_artifact(base, tmp_path / "good")
    assert all(torch.equal(base.state_dict()[k], v) for k, v in state.items())
    assert base.lm_head.weight.data_ptr() == base.model.embed_tokens.weight.data_ptr()  # still tied

    def bad(name: str, tensors: dict) -> Path:
        (tmp_path / name).mkdir()
        safetensors.torch.save_file(tensors, tmp_path / name / "model.safetensors")
        return tmp_path / name

    fresh, _ = _tiny_model(tiny_dir / "model", monkeypatch)
    before = {k: v.clone() for k, v in fresh.state_dict().items()}
    embed = weights["model.embed_tokens.weight"]
    cases = {
        "shape": ({**weights, "model.embed_tokens.weight": embed[:-1].clone()},
                  r"1 wrong shapes or non-float tensors \(model.embed_tokens.weight: float32 \(258, 64\), base "
                  r"\(259, 64\)\)"),
        "extra": ({**weights, "lm_head.weight": embed.clone()}, r"1 unexpected keys \(lm_head.weight\)"),
        "missing": ({k: v for k, v in weights.items() if k != "model.norm.weight"},
                    r"1 missing keys \(model.norm.weight\)"),
        "dtype": ({**weights, "model.norm.weight": weights["model.norm.weight"].long()},
                  r"model.norm.weight: int64 \(64,\), base \(64,\)"),
    }
    for name, (tensors, message) in cases.items():
        with pytest.raises(SystemExit, match=message) as error:
            prepare.load_artifact(fresh, bad(name, tensors))
        assert "does not fit the base model" in str(error.value) and "merge LoRA adapters" in str(error.value)
    (tmp_path / "garbage").mkdir()
    (tmp_path / "garbage" / "model.safetensors").write_bytes(b"not safetensors")
    with pytest.raises(SystemExit, match="is not a readable safetensors file"):
        prepare.load_artifact(fresh, tmp_path / "garbage")
    with pytest.raises(SystemExit, match=r"nowhere/model.safetensors does not exist. train.py must end with "
                                         r"prepare.evaluate_and_report"):
        prepare.load_artifact(fresh, tmp_path / "nowhere")
    assert all(torch.equal(fresh.state_dict()[k], v) for k, v in before.items())  # nothing half-loaded


@pytest.mark.slow
def test_hidden_test_split_saves_then_defers_to_the_evaluator(tiny_dir, tmp_path, monkeypatch, capsys):
    policy, tokenizer = _tiny_model(tiny_dir / "model", monkeypatch)
    prepare.import_source(tiny_dir / "sums")
    test = prepare.cache_dir() / "test.jsonl"
    test.write_text("")  # as a sandbox mounting an empty file over it
    assert prepare.is_test_split_hidden()
    assert len(prepare.load_problems("train")) == 2000  # training still reads its own split
    capsys.readouterr()
    monkeypatch.setenv("AUTORESEARCH_ARTIFACT", str(tmp_path / "artifact"))
    assert math.isnan(prepare.evaluate_and_report(policy, tokenizer, num_steps=3))
    out = capsys.readouterr().out
    assert f"`prepare.py --evaluate {tmp_path / 'artifact'}`" in out.splitlines()[0]
    summary = dict(line.split(":", 1) for line in out.split("---\n")[1].splitlines())
    assert summary["pass@1"].strip() == "nan" and summary["num_steps"].strip() == "3"
    assert summary["time_budget_s"].strip() == f"{prepare.time_budget()[0]:g}"
    assert (tmp_path / "artifact" / "model.safetensors").is_file()
    test.unlink()  # or left out of the sandbox altogether
    assert prepare.is_test_split_hidden()
    monkeypatch.delenv("AUTORESEARCH_ARTIFACT")
    with pytest.raises(SystemExit, match="AUTORESEARCH_ARTIFACT is not set, so nothing can score this run"):
        prepare.evaluate_and_report(policy, tokenizer)
    (tmp_path / "a-file").write_text("")
    monkeypatch.setenv("AUTORESEARCH_ARTIFACT", str(tmp_path / "a-file"))
    with pytest.raises(SystemExit, match=r"could not save the policy's weights to .*a-file/model.safetensors "
                                         r"\(.*\); without them this run cannot be scored. Make "
                                         r"AUTORESEARCH_ARTIFACT=.*a-file a writable folder with 0.4 MB free"):
        prepare.evaluate_and_report(policy, tokenizer)


def _sha(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


# The tiny model's folder as save_pretrained writes it; all but the weights define how the evaluator decodes.
TINY_MODEL_FILES = ["chat_template.jinja", "config.json", "generation_config.json", "tokenizer.json",
                    "tokenizer_config.json"]


@pytest.mark.slow
def test_frozen_inputs_digest(tiny_dir, tmp_path, monkeypatch, capsys):
    model = tmp_path / "base"
    shutil.copytree(tiny_dir / "model", model)
    monkeypatch.setenv("AUTORESEARCH_GRPO_MODEL", str(model))
    prepare.import_source(tiny_dir / "sums")
    test = prepare.cache_dir() / "test.jsonl"
    assert sorted(p.name for p in model.iterdir()) == sorted(TINY_MODEL_FILES + ["model.safetensors"])
    files = {"prepare.py": _sha(GRPO / "prepare.py"), "test.jsonl": _sha(test),
             **{f"model/{name}": _sha(model / name) for name in TINY_MODEL_FILES}}
    lines = "\n".join(f"{role}:{files[role]}" for role in sorted(files))
    reads = [str(model.resolve())]
    expected = {"digest": hashlib.sha256(lines.encode()).hexdigest(), "files": files,
                "evaluator_only": [str(test.resolve()), str((tiny_dir / "sums").resolve())],
                "train_reads": [str((prepare.cache_dir() / "train.jsonl").resolve())] + reads,
                "eval_reads": [str(test.resolve())] + reads,
                "env": {"AUTORESEARCH_GRPO_MODEL": str(model.resolve())}}
    assert prepare.frozen_inputs() == expected

    # the same bytes elsewhere give the same digest, through the command line
    copy = tmp_path / "elsewhere" / "prepare.py"
    copy.parent.mkdir()
    shutil.copy(GRPO / "prepare.py", copy)
    capsys.readouterr()
    assert _load("prepare_copy", path=copy).main(["--frozen-inputs"]) == 0
    assert json.loads(capsys.readouterr().out) == expected

    # an edited evaluator or an edited test split changes it
    copy.write_text(copy.read_text().replace("EVAL_SIZE = 500", "EVAL_SIZE = 50"))
    edited = _load("prepare_edited", path=copy).frozen_inputs()
    assert edited["files"]["test.jsonl"] == files["test.jsonl"] and edited["digest"] != expected["digest"]
    test.write_text(test.read_text().replace("What is", "What's", 1))
    changed = prepare.frozen_inputs()
    assert changed["files"]["prepare.py"] == files["prepare.py"] and changed["digest"] != expected["digest"]
    test.unlink()
    with pytest.raises(SystemExit, match="GSM8K test split missing at .*: run `uv run prepare.py`"):
        prepare.frozen_inputs()


@pytest.mark.slow
def test_frozen_inputs_digest_covers_the_model_folder_but_not_its_weights(tiny_dir, random_dir, tmp_path, monkeypatch):
    """A base model folder with another chat template, tokenizer config or generation config decodes differently in
    the evaluator: the digest must change. New weights do not count (the artifact's replace them all), nor does a
    copy of the same folder elsewhere (files are hashed by role)."""
    model = tmp_path / "base"
    shutil.copytree(tiny_dir / "model", model)
    monkeypatch.setenv("AUTORESEARCH_GRPO_MODEL", str(model))
    prepare.import_source(tiny_dir / "sums")
    base = prepare.frozen_inputs()
    assert sorted(r for r in base["files"] if r.startswith("model/")) == [f"model/{n}" for n in TINY_MODEL_FILES]
    assert base["files"]["model/chat_template.jinja"] == _sha(tiny_dir / "model" / "chat_template.jinja")

    edits = {"chat_template.jinja": lambda t: t.replace("assistant", "assistant\nAnswers: 3+4=7, 2+2=4"),
             "tokenizer_config.json": lambda t: t.replace('"pad_token"', '"padding_side": "right",\n  "pad_token"'),
             "generation_config.json": lambda t: t.replace("{", '{\n  "repetition_penalty": 1.3,', 1)}
    for name, edit in edits.items():
        original = (model / name).read_text()
        (model / name).write_text(edit(original))
        changed = prepare.frozen_inputs()
        assert changed["digest"] != base["digest"], name
        assert {r for r in base["files"] if changed["files"][r] != base["files"][r]} == {f"model/{name}"}
        (model / name).write_text(original)
        assert prepare.frozen_inputs() == base  # back to the same bytes, back to the same digest

    added = model / "special_tokens_map.json"  # a file the folder did not have before counts too
    added.write_text(json.dumps({"eos_token": "<|endoftext|>"}))
    assert prepare.frozen_inputs()["files"]["model/special_tokens_map.json"] == _sha(added)
    assert prepare.frozen_inputs()["digest"] != base["digest"]
    added.unlink()

    # other weights (the random model's), weight files of other formats and hidden download metadata: same digest
    shutil.copy(random_dir / "model" / "model.safetensors", model / "model.safetensors")
    assert _sha(model / "model.safetensors") != _sha(tiny_dir / "model" / "model.safetensors")
    for name in ("pytorch_model.bin", "model.pt", "model.pth", "model.gguf", "tf_model.h5", "flax_model.msgpack",
                 "model.onnx", "model-00001-of-00002.safetensors"):
        (model / name).write_bytes(b"weights")
    (model / ".cache" / "huggingface").mkdir(parents=True)
    (model / ".cache" / "huggingface" / "config.json.metadata").write_text("downloaded at 12:00")
    assert prepare.frozen_inputs()["digest"] == base["digest"]

    # the same folder elsewhere hashes the same
    monkeypatch.setenv("AUTORESEARCH_GRPO_MODEL", str(tiny_dir / "model"))
    assert prepare.frozen_inputs()["digest"] == base["digest"]


@pytest.mark.slow
def test_source_folder_is_evaluator_only(tiny_dir, tmp_path, monkeypatch):
    """source.json (readable by train.py) names the folder the splits were copied from, test split included: it is
    hidden too, resolved, however --source named it."""
    monkeypatch.setenv("AUTORESEARCH_GRPO_MODEL", str(tiny_dir / "model"))
    shutil.copytree(tiny_dir / "sums", tmp_path / "data" / "gsm8k")
    (tmp_path / "grpo").mkdir()
    monkeypatch.chdir(tmp_path / "grpo")
    assert prepare.main(["--source", "../data/gsm8k"]) == 0
    assert json.loads((prepare.cache_dir() / "source.json").read_text()) == {"source": str(tmp_path / "data" / "gsm8k")}
    test = str((prepare.cache_dir() / "test.jsonl").resolve())
    assert prepare.frozen_inputs()["evaluator_only"] == [test, str(tmp_path / "data" / "gsm8k")]
    assert prepare.source_folder() == tmp_path / "data" / "gsm8k"
    # a download records the hub path, relative: never a local folder, even where one of that name exists
    (tmp_path / "grpo" / prepare.GSM8K_REPO).mkdir(parents=True)
    (prepare.cache_dir() / "source.json").write_text(json.dumps({"source": prepare.GSM8K_REPO}))
    assert prepare.frozen_inputs()["evaluator_only"] == [test]
    # a source folder that is gone, or an unreadable record: nothing more to hide
    (prepare.cache_dir() / "source.json").write_text(json.dumps({"source": str(tmp_path / "gone")}))
    assert prepare.frozen_inputs()["evaluator_only"] == [test]
    (prepare.cache_dir() / "source.json").write_text("{not json")
    assert prepare.frozen_inputs()["evaluator_only"] == [test]


@pytest.mark.slow
def test_frozen_inputs_reads_of_a_local_model_folder(tiny_dir, tmp_path, monkeypatch):
    """train_reads / eval_reads / env for a plain local folder (given as ~/...), and for one whose files link out of it
    (as `download --local-dir` used to make): the link targets are read too."""
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    model = tmp_path / "home" / "models" / "tiny"
    shutil.copytree(tiny_dir / "model", model)
    monkeypatch.setenv("AUTORESEARCH_GRPO_MODEL", "~/models/tiny")
    prepare.import_source(tiny_dir / "sums")
    cache = prepare.cache_dir().resolve()
    assert prepare.resolve_model() == model
    found = prepare.frozen_inputs()
    assert found["train_reads"] == [str(cache / "train.jsonl"), str(model)]
    assert found["eval_reads"] == [str(cache / "test.jsonl"), str(model)]
    assert found["env"] == {"AUTORESEARCH_GRPO_MODEL": str(model)}
    assert "source.json" not in json.dumps(found["train_reads"])  # train.py does not need it
    blobs = tmp_path / "blobs"
    blobs.mkdir()
    for name in ("model.safetensors", "tokenizer.json"):
        (model / name).rename(blobs / name)
        (model / name).symlink_to(blobs / name)
    linked = prepare.frozen_inputs()
    assert linked["train_reads"] == [str(cache / "train.jsonl"), str(model), str(blobs / "model.safetensors"),
                                     str(blobs / "tokenizer.json")]
    assert linked["eval_reads"] == [str(cache / "test.jsonl")] + linked["train_reads"][1:]
    assert linked["digest"] == found["digest"]  # hashed by role: the same bytes through a link


def _hf_cache(home: Path, repo_id: str, model_dir: Path, revision: str = "0123456789abcdef" * 2 + "01234567") -> Path:
    """A Hugging Face cache under home (HF_HOME) holding model_dir's files as huggingface_hub lays them out: blobs by
    sha256, a snapshot of relative symlinks into ../../blobs, refs/main naming the revision. Returns the snapshot."""
    repo = home / "hub" / f"models--{repo_id.replace('/', '--')}"
    snapshot = repo / "snapshots" / revision
    snapshot.mkdir(parents=True)
    (repo / "blobs").mkdir()
    (repo / "refs").mkdir()
    (repo / "refs" / "main").write_text(revision)
    for path in model_dir.iterdir():
        blob = _sha(path)
        shutil.copy(path, repo / "blobs" / blob)
        (snapshot / path.name).symlink_to(f"../../blobs/{blob}")
    return snapshot


def _hub_env(cache: Path, hf_home: Path, **extra) -> dict:
    env = {k: v for k, v in _env(cache, **extra).items() if k not in ("HF_HUB_CACHE", "HUGGINGFACE_HUB_CACHE")}
    env.update(HF_HOME=str(hf_home), HF_HUB_OFFLINE="1")
    return env


@pytest.mark.slow
def test_a_hub_id_is_never_read_as_a_local_folder(tiny_dir, tmp_path, monkeypatch, capsys):
    """The hole: a train.py wrote Qwen/Qwen2.5-0.5B-Instruct (its own chat template, holding an answer table) into
    its run folder, and the evaluator, started there, loaded it as the base model. A relative name is a hub id
    resolved through the Hugging Face cache only; "./x" and "../x" are refused with the fix."""
    prepare.import_source(tiny_dir / "sums")
    policy, tokenizer = _tiny_model(tiny_dir / "model", monkeypatch)
    honest = prepare.evaluate(policy, tokenizer).pass_at_1
    prepare.save_artifact(policy, tmp_path / "artifact")
    monkeypatch.delenv("AUTORESEARCH_GRPO_MODEL")
    run = tmp_path / "run"
    planted = run / prepare.BASE_MODEL
    shutil.copytree(tiny_dir / "model", planted)
    template = planted / "chat_template.jinja"
    template.write_text(template.read_text().replace("assistant\n", "assistant\n{{ {'1 + 6': '#### 7'}.get('') }}"))
    cache = prepare.cache_dir().parent
    evaluate = [str(GRPO / "prepare.py"), "--evaluate", str(tmp_path / "artifact")]

    def run_in(cwd: Path, args: list[str], env: dict) -> subprocess.CompletedProcess:
        return subprocess.run([sys.executable, *args], cwd=cwd, env=env, capture_output=True, text=True, timeout=180)

    # no cached snapshot of the hub id, offline: a clear error, not the planted folder (unset or set to the name)
    empty = tmp_path / "hf-empty"
    empty.mkdir()
    unresolved = (r"could not resolve model 'Qwen/Qwen2.5-0.5B-Instruct' through the Hugging Face hub or its cache "
                  r"\(LocalEntryNotFoundError: .*\). A relative name is a hub id, never a local folder. .* set "
                  r"AUTORESEARCH_GRPO_MODEL to the absolute path of a local directory")
    for args, extra in ((evaluate, {}), ([str(GRPO / "prepare.py"), "--frozen-inputs"],
                                         {"AUTORESEARCH_GRPO_MODEL": prepare.BASE_MODEL})):
        result = run_in(run, args, _hub_env(cache, empty, **extra))
        assert result.returncode == 1, result.stdout[-2000:]
        assert re.search(unresolved, result.stderr), result.stderr[-2000:]
        assert "pass@1" not in result.stdout and "digest" not in result.stdout

    # relative paths: refused before anything is read, by every entry point that needs the model
    monkeypatch.chdir(run)
    for name in (f"./{prepare.BASE_MODEL}", f"../run/{prepare.BASE_MODEL}", f"Qwen/../{prepare.BASE_MODEL}", "."):
        monkeypatch.setenv("AUTORESEARCH_GRPO_MODEL", name)
        refused = (rf"AUTORESEARCH_GRPO_MODEL={re.escape(repr(name))} is a relative path; a relative name is never "
                   r"read as a local folder .*: give the model directory as an absolute path \(e.g. "
                   rf"AUTORESEARCH_GRPO_MODEL={re.escape(str(run / name))}\), or a hub id such as")
        for call in (prepare.resolve_model, lambda: prepare.load_model(torch.device("cpu")), prepare.frozen_inputs,
                     lambda: prepare.evaluate_artifact(tmp_path / "artifact"), lambda: prepare.main(["--preflight"])):
            with pytest.raises(SystemExit, match=refused):
                call()
        capsys.readouterr()
        assert prepare.main(["--check"]) == 1
        assert re.search(refused, capsys.readouterr().err)

    # with the genuine model in the cache, the hub id resolves to its snapshot, from the planted folder's cwd too
    hf = tmp_path / "hf"
    snapshot = _hf_cache(hf, prepare.BASE_MODEL, tiny_dir / "model")
    other = snapshot.parent / ("f" * 40)                  # another revision of the same repository: never in view
    other.mkdir()
    (other / "model.safetensors").write_text("a checkpoint planted beside the pinned revision")
    result = run_in(run, [str(GRPO / "prepare.py"), "--frozen-inputs"], _hub_env(cache, hf))
    assert result.returncode == 0, result.stderr[-2000:]
    found = json.loads(result.stdout)
    blobs = sorted(str(p.resolve()) for p in snapshot.iterdir())     # the pinned revision's files, no other's
    assert found["env"] == {"AUTORESEARCH_GRPO_MODEL": str(snapshot)}
    assert found["train_reads"] == [str((prepare.cache_dir() / "train.jsonl").resolve()), str(snapshot), *blobs]
    assert found["eval_reads"] == [str((prepare.cache_dir() / "test.jsonl").resolve()), str(snapshot), *blobs]
    assert found["files"]["model/chat_template.jinja"] == _sha(tiny_dir / "model" / "chat_template.jinja")
    assert found["files"]["model/chat_template.jinja"] != _sha(template)

    # the harness passes env on: the evaluator then needs no hub and no cache beyond the snapshot, scores the
    # genuine model and prints the same digest as --frozen-inputs at tag start
    result = run_in(run, evaluate, _hub_env(cache, empty, **found["env"]))
    assert result.returncode == 0, result.stderr[-2000:]
    values = dict(_summary(result.stdout))
    assert float(values["pass@1"]) == honest
    assert values["frozen_inputs"] == found["digest"]
    again = run_in(run, [str(GRPO / "prepare.py"), "--frozen-inputs"], _hub_env(cache, empty, **found["env"]))
    assert json.loads(again.stdout) == found


# ---------------------------------------------------------------------------
# Preflight gate
# ---------------------------------------------------------------------------

def test_preflight_verdict():
    healthy = prepare.PreflightReport(3, 32, [[0.0] * 8, [0.0] * 7 + [1.0]], 0, 0, [])
    assert prepare.preflight_verdict(healthy) is None
    none_right = prepare.PreflightReport(0, 32, [[0.0] * 8, [1.0] + [0.0] * 7], 0, 0, [])
    assert "answered 0 of 32" in prepare.preflight_verdict(none_right)
    flat = prepare.PreflightReport(5, 32, [[0.0] * 8, [1.0] * 8], 0, 0, [])
    message = prepare.preflight_verdict(flat)
    assert "identical rewards" in message and "answered 0" not in message


# ---------------------------------------------------------------------------
# GRPO
# ---------------------------------------------------------------------------

def test_group_advantages_hand_computed():
    rewards = torch.tensor([1.0, 0.0, 0.0, 0.0, 1.0, 1.0, 1.0, 1.0])
    # group 1: mean 0.25, unbiased std sqrt((0.75^2 + 3 * 0.25^2) / 3) = 0.5; group 2 carries no preference
    expected = torch.tensor([0.75, -0.25, -0.25, -0.25, 0, 0, 0, 0]) / (0.5 + train.ADV_EPS)
    assert torch.allclose(train.group_advantages(rewards, 4), expected)


def test_grpo_loss_hand_computed():
    logp = torch.log(torch.tensor([[0.6, 0.5], [0.3, 0.2]]))
    old = torch.log(torch.tensor([[0.4, 0.5], [0.3, 0.4]]))
    ref = torch.log(torch.tensor([[0.3, 0.5], [0.3, 0.2]]))
    adv = torch.tensor([1.0, -1.0])
    mask = torch.tensor([[1.0, 1.0], [1.0, 0.0]])  # the second sequence has one token
    loss = train.grpo_loss(logp, old, ref, adv, mask, clip_eps=0.2, kl_coef=0.0)
    # seq 1: ratios 1.5 (clipped to 1.2, A > 0) and 1.0 -> -(1.2 + 1.0) / 2; seq 2: ratio 1 -> -(-1)
    assert torch.allclose(loss, torch.tensor([-1.1, 1.0]))
    with_kl = train.grpo_loss(logp, old, ref, adv, mask, clip_eps=0.2, kl_coef=0.5)
    k3 = 0.5 - torch.log(torch.tensor(0.5)) - 1  # token 1 of seq 1: ref / pi = 0.5; others: 1 -> k3 = 0
    assert torch.allclose(with_kl, torch.tensor([-1.1 + 0.5 * k3 / 2, 1.0]))


@pytest.mark.slow
def test_completion_logprobs_match_generation(random_dir, monkeypatch):
    """The loss pass must score each sampled token as the sampler did, left padding included."""
    model, tokenizer = _tiny_model(random_dir / "model", monkeypatch)
    problems = _problems(tiny.digit_sums(2, seed=3)) + _problems([json.loads((GSM8K / "test.jsonl").open().readline())])
    prompts = [prepare.build_prompt(tokenizer, p.question) for p in problems]
    batch = tokenizer(prompts, return_tensors="pt", padding=True, add_special_tokens=False)
    torch.manual_seed(0)
    out = model.generate(**batch, do_sample=True, top_k=0, top_p=1.0, max_new_tokens=6, output_scores=True,
                         return_dict_in_generate=True)
    sampled = torch.stack(out.scores, dim=1).log_softmax(-1).gather(-1, out.sequences[:, -6:, None]).squeeze(-1)
    mask = torch.cat([batch["attention_mask"], torch.ones(3, 6, dtype=torch.long)], dim=1)
    scored = train.completion_logprobs(model, out.sequences, mask, 6, temperature=1.0)
    assert batch["attention_mask"][:, 0].tolist() == [0, 0, 1]  # the two short prompts are left-padded
    assert torch.allclose(scored, sampled, atol=1e-5)


@pytest.mark.slow
def test_grpo_raises_mean_reward(tiny_dir, monkeypatch):
    """Proof that the update learns: on "always answer 4", reward alone moves the policy to the answer."""
    model, tokenizer = _tiny_model(tiny_dir / "model", monkeypatch)
    train_set = _problems(tiny.digit_sums(200, seed=10, total=4))
    held_out = _problems(tiny.digit_sums(50, seed=11, total=4))
    before = prepare.evaluate(model, tokenizer, held_out).pass_at_1
    torch.manual_seed(0)
    rng = random.Random(0)
    optimizer = torch.optim.AdamW(model.parameters(), lr=3e-3)
    rewards = []
    for _ in range(15):
        stats = train.grpo_step(model, None, optimizer, tokenizer, rng.sample(train_set, 8), group_size=8,
                                max_new_tokens=8, kl_coef=0.0)
        rewards.append(stats["reward"])
    after = prepare.evaluate(model, tokenizer, held_out).pass_at_1
    assert before == 0.0                      # greedy says 7 before training
    assert rewards[0] < 0.3                   # sampled answers are 4 by chance only
    assert sum(rewards[-3:]) / 3 > rewards[0] + 0.4
    assert after >= 0.9


@pytest.mark.slow
def test_cpu_defaults_learn_on_the_tiny_task(tiny_dir, monkeypatch):
    """The smoke runs' hyperparameters (train.py's cpu branch) must move the tiny model within a 30 s run: the
    old 2e-6 left it unchanged (KL 0) for a whole run. It learns that 8 and 9, the commonest sums, beat its 7."""
    assert (train.PROFILE, train.LEARNING_RATE, train.PROMPTS_PER_STEP) == ("cpu", 1e-3, 8)
    prepare.import_source(tiny_dir / "sums")
    policy, tokenizer = _tiny_model(tiny_dir / "model", monkeypatch)
    reference, _ = _tiny_model(tiny_dir / "model", monkeypatch)
    reference.requires_grad_(False)
    test, train_set = prepare.eval_problems(), prepare.load_problems("train")
    before = prepare.evaluate(policy, tokenizer, test).pass_at_1
    assert before == sum(p.gold == 7 for p in test) / len(test)  # greedy says 7 to every sum
    random.seed(train.SEED)
    torch.manual_seed(train.SEED)
    optimizer = torch.optim.AdamW(policy.parameters(), lr=train.LEARNING_RATE, betas=train.ADAM_BETAS)
    kl = [train.grpo_step(policy, reference, optimizer, tokenizer, random.sample(train_set, train.PROMPTS_PER_STEP))["kl"]
          for _ in range(20)]
    after = prepare.evaluate(policy, tokenizer, test).pass_at_1
    assert kl[0] == 0.0 and max(kl) > 0.01  # the policy left the reference
    assert after >= before + 0.1


@pytest.mark.slow
def test_train_script_end_to_end(tiny_dir, tmp_path, monkeypatch):
    env = _env(tmp_path / "cache", tiny_dir / "model", AUTORESEARCH_TIME_BUDGET="3",
               AUTORESEARCH_ARTIFACT=str(tmp_path / "artifact"))
    prepare.import_source(tiny_dir / "sums")
    result = _run(["train.py"], env)
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-2000:]
    summary = _summary(result.stdout)
    assert summary[0][0] == "pass@1" and 0.0 <= float(summary[0][1]) <= 1.0
    values = dict(summary)
    assert values["num_problems"] == "100" and values["budget_override"] == "1" and int(values["num_steps"]) >= 1
    assert float(values["training_seconds"]) >= 3.0
    assert "step 0001 | reward" in result.stdout and "Loading weights" not in result.stderr
    base, _ = _tiny_model(tiny_dir / "model", monkeypatch)
    prepare.load_artifact(base, tmp_path / "artifact")  # train.py saved weights the evaluator accepts

# ---------------------------------------------------------------------------
# docs/grpo.md's offline recipe, line by line
# ---------------------------------------------------------------------------

def _readme_recipe() -> list[str]:
    """The command lines of docs/grpo.md's offline GRPO recipe (the bash block after "Offline, on a CPU")."""
    section = (REPO / "docs" / "grpo.md").read_text().split("<!-- section: grpo -->", 1)[1].split("<!-- section:", 1)[0]
    block = section.split("Offline, on a CPU", 1)[1].split("```bash\n", 1)[1].split("```", 1)[0]
    return [line for line in block.splitlines() if line.strip()]


@pytest.mark.slow
def test_readme_offline_recipe_runs_as_written(tmp_path, monkeypatch, capsys):
    """Every line in order, in this process: `uv run X.py args` calls X's main(args), with /tmp moved under
    tmp_path. The two preflights are the real gate (random model on GSM8K: refused; tiny model on its sums:
    passes). agent.py's loop needs a git checkout and minutes, so its line is checked by agent.py's own parser
    (harness.tag.settings.parse)."""
    from harness.tag import settings

    monkeypatch.chdir(REPO)
    ran = []
    for line in _readme_recipe():
        tokens = shlex.split(line.replace("/tmp/", f"{tmp_path}/"), comments=True)
        commands = [[]]
        for token in tokens:
            if token == "&&":
                commands.append([])
            else:
                commands[-1].append(token)
        for command in commands:
            env = {}
            while re.fullmatch(r"[A-Z_]+=\S+", command[0]):
                key, value = command.pop(0).split("=", 1)
                env[key] = value
            if command[0] == "cd":
                monkeypatch.chdir(Path.cwd() / command[1])
                continue
            if command[0] == "export":
                for pair in command[1:]:
                    monkeypatch.setenv(*pair.split("=", 1))
                continue
            assert command[:2] == ["uv", "run"], line
            script, argv = command[2], command[3:]
            ran.append(script + " " + " ".join(argv).replace(str(tmp_path), "/tmp"))
            if script == "agent.py":
                assert Path.cwd() == REPO
                args = settings.parse(argv)  # exits 2 on a missing --tag or a bad flag
                assert (args.target, args.proposer, args.max_experiments) == ("grpo", "random", 2)
                continue
            assert Path.cwd() == GRPO, line
            with monkeypatch.context() as scoped:
                for key, value in env.items():
                    scoped.setenv(key, value)
                status = {"tiny.py": tiny.main, "prepare.py": prepare.main}[script](argv)
            out, err = capsys.readouterr()
            if "--preflight" in argv and "trips" in line:
                assert status == 1, out + err
                assert "PREFLIGHT FAILED: degenerate training signal" in err
                assert "answered 0 of 32 problems correctly" in err
                for cause in ("answer extraction", "max new tokens", "prompt format", "model path"):
                    assert cause in err
            else:
                assert status == 0, out + err
                if "--preflight" in argv:
                    assert "preflight: OK" in out
    assert ran == [
        "tiny.py --out /tmp/grpo-tiny", "tiny.py --out /tmp/grpo-random --warm-start-steps 0",
        "prepare.py --source ../../shared/data/gsm8k --force", "prepare.py --preflight",
        "prepare.py --source /tmp/grpo-tiny/sums --force", "prepare.py --preflight",
        "agent.py --target grpo --tag grpo-tiny --proposer random --max-experiments 2",
    ]
    assert len(prepare.load_problems("test")) == 100  # the tiny sums replaced GSM8K in the recipe's cache



@pytest.mark.slow
def test_the_evaluator_opens_nothing_but_its_declared_reads_and_the_artifact(tiny_dir, tmp_path, monkeypatch):
    """Traced with strace: `prepare.py --evaluate DIR` of the GRPO target opens only the system's, the environment's,
    its pristine copy's files, --frozen-inputs' eval_reads (the test split, the base model) and the artifact."""
    from helpers import opened_outside
    prepare.import_source(tiny_dir / "sums")
    policy, _ = _tiny_model(tiny_dir / "model", monkeypatch)
    prepare.save_artifact(policy, tmp_path / "artifact")
    inputs = prepare.frozen_inputs()
    pristine = tmp_path / "frozen"
    pristine.mkdir()
    shutil.copy(GRPO / "prepare.py", pristine / "prepare.py")
    env = _env(prepare.cache_dir().parent, tiny_dir / "model", **inputs["env"])
    opened, outside = opened_outside([sys.executable, "prepare.py", "--evaluate", tmp_path / "artifact"], pristine, env,
                                     tmp_path / "trace", [pristine, tmp_path / "artifact", *inputs["eval_reads"]])
    assert len(opened) > 100 and outside == []
    assert (prepare.cache_dir() / "test.jsonl").resolve() in opened and not (prepare.cache_dir() / "train.jsonl") in opened
