"""Tests of the GRPO target (grpo/): offline, CPU, a tiny Qwen2 built from a config (grpo/tiny.py)."""

import ast
import http.server
import importlib.util
import json
import os
import random
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


def _load(name: str, prepare_module=None):
    """Import grpo/<name>.py under a private name. train.py and tiny.py say `from prepare import ...`, which
    must mean grpo/prepare.py, not the pretraining prepare.py at the repo root: bind it for the import only."""
    spec = importlib.util.spec_from_file_location(f"grpo_{name}", GRPO / f"{name}.py")
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

prepare = _load("prepare")
tiny = _load("tiny", prepare)
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
def tiny_dir(tmp_path_factory) -> Path:
    """Warm-started tiny model (format only) and the one-digit sums task, built once."""
    out = tmp_path_factory.mktemp("tiny")
    tiny.make_tiny(out)
    return out


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
    with pytest.raises(SystemExit, match="AUTORESEARCH_TIME_BUDGET='soon' is not a positive number"):
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

def test_check_then_source_then_check(tmp_path):
    env = _env(tmp_path / "cache")
    before = _run(["prepare.py", "--check"], env)
    assert before.returncode == 1
    assert "uv run prepare.py --source DIR`, e.g. ../../shared/data/gsm8k" in before.stderr
    assert len(before.stderr.strip().splitlines()) == 1
    imported = _run(["prepare.py", "--source", str(GSM8K)], env)
    assert imported.returncode == 0, imported.stderr
    assert "train: 7473 problems" in imported.stdout and "test: 1319 problems" in imported.stdout
    assert prepare.check() is None
    assert [len(prepare.load_problems(s)) for s in ("train", "test")] == [7473, 1319]
    # the fixed evaluation subset: 500 distinct test problems, the same on every call
    subset = prepare.eval_problems()
    assert len(subset) == 500 and len({p.question for p in subset}) == 500
    assert [p.question for p in subset] == [p.question for p in prepare.eval_problems()]


def test_another_source_is_refused_without_force(tiny_dir, tmp_path):
    env = _env(tmp_path / "cache")
    assert _run(["prepare.py", "--source", str(GSM8K)], env).returncode == 0
    again = _run(["prepare.py", "--source", str(GSM8K)], env)  # the same source again is fine
    assert again.returncode == 0
    other = _run(["prepare.py", "--source", str(tiny_dir / "sums")], env)
    assert other.returncode == 1 and "--force" in other.stderr and "AUTORESEARCH_CACHE" in other.stderr
    assert len(prepare.load_problems("test")) == 1319  # untouched
    forced = _run(["prepare.py", "--source", str(tiny_dir / "sums"), "--force"], env)
    assert forced.returncode == 0 and len(prepare.load_problems("test")) == 100


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

def test_evaluator_on_tiny_model(tiny_dir, monkeypatch, capsys):
    model, tokenizer = _tiny_model(tiny_dir / "model", monkeypatch)
    prepare.import_source(tiny_dir / "sums")
    capsys.readouterr()
    problems = prepare.eval_problems()
    assert len(problems) == 100  # the split is smaller than EVAL_SIZE: all of it
    model.generation_config.min_new_tokens = 20  # left on the model by a training script: must not count
    result = prepare.evaluate(model, tokenizer)
    assert model.generation_config.min_new_tokens == 20  # restored after the call
    # The warm start taught the format and the answers' distribution, so greedy decoding always guesses the
    # most common answer, 9: pass@1 is exactly the share of test sums that equal 9.
    assert [c for _, c, _ in result.samples] == ["#### 9", "#### 9"]
    nines = sum(p.gold == 9 for p in problems)
    assert (result.correct, result.total, result.truncated, result.no_answer) == (nines, 100, 0, 0)
    monkeypatch.setenv("AUTORESEARCH_TIME_BUDGET", "5")
    prepare.print_summary(result, num_steps=3)
    summary = _summary(capsys.readouterr().out)
    assert summary[0] == ("pass@1", f"{nines / 100:.6f}")
    values = dict(summary)
    assert (values["correct"], values["total"], values["peak_vram_mb"]) == (str(nines), "100", "0.0")
    assert (values["budget_override"], values["num_steps"], values["max_new_tokens"]) == ("1", "3", "512")


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


def test_preflight_trips_on_random_model_with_gsm8k(random_dir, tmp_path):
    env = _env(tmp_path / "cache", random_dir / "model")
    prepare.import_source(GSM8K)  # into tmp_path / "cache" (the autouse fixture), as --source would
    result = _run(["prepare.py", "--preflight"], env)
    assert result.returncode == 1, result.stdout + result.stderr
    assert "PREFLIGHT FAILED: degenerate training signal" in result.stderr
    assert "answered 0 of 32 problems correctly" in result.stderr
    for cause in ("answer extraction", "max new tokens", "prompt format", "model path"):
        assert cause in result.stderr


def test_preflight_passes_on_tiny_sums(tiny_dir, tmp_path):
    env = _env(tmp_path / "cache", tiny_dir / "model")
    prepare.import_source(tiny_dir / "sums")
    result = _run(["prepare.py", "--preflight"], env)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "preflight: OK" in result.stdout


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


def test_grpo_raises_mean_reward(tiny_dir, monkeypatch):
    """Proof that the update learns: on "always answer 7", reward alone moves the policy to the answer."""
    model, tokenizer = _tiny_model(tiny_dir / "model", monkeypatch)
    train_set = _problems(tiny.digit_sums(200, seed=10, total=7))
    held_out = _problems(tiny.digit_sums(50, seed=11, total=7))
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
    assert before == 0.0                      # greedy says 9 before training
    assert rewards[0] < 0.3                   # sampled answers are 7 by chance only
    assert sum(rewards[-3:]) / 3 > rewards[0] + 0.4
    assert after >= 0.9


def test_train_script_end_to_end(tiny_dir, tmp_path):
    env = _env(tmp_path / "cache", tiny_dir / "model", AUTORESEARCH_TIME_BUDGET="3")
    prepare.import_source(tiny_dir / "sums")
    result = _run(["train.py"], env)
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-2000:]
    summary = _summary(result.stdout)
    assert summary[0][0] == "pass@1" and 0.0 <= float(summary[0][1]) <= 1.0
    values = dict(summary)
    assert values["total"] == "100" and values["budget_override"] == "1" and int(values["num_steps"]) >= 1
    assert float(values["training_seconds"]) >= 3.0
    assert "step 0001 | reward" in result.stdout and "Loading weights" not in result.stderr
