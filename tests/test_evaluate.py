"""Tests of the separate evaluator: the model artifact, `prepare.py --evaluate`, `--frozen-inputs`.

The score that ranks an experiment comes from a fresh interpreter running a pristine prepare.py on the
program that evaluate_bpb exported (AUTORESEARCH_ARTIFACT). These tests export small models, run that
evaluator in a subprocess (or through main() where only the error path matters) and compare its number
with the in-process one and with values computed by hand.
"""

import hashlib
import json
import math
import os
import re
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

import prepare as P
from helpers import CORPORA, REPO, Bigram, opened_outside, parse_summary
# Six evaluator batches of EVAL_BATCH_ROWS rows: enough for the random causality probe to matter.
ROWS = 6 * P.EVAL_BATCH_ROWS
EVAL = P.Profile("eval-test", max_seq_len=64, eval_tokens=64 * ROWS, vocab_size=320, doc_chars=160)


@pytest.fixture(scope="module")
def cache(tmp_path_factory):
    """tinyshakespeare prepared with a small profile in a throwaway cache."""
    return P.prepare("climbmix", str(CORPORA / "tinyshakespeare.txt"), EVAL, 1, 1, False, root=tmp_path_factory.mktemp("cache"))


@pytest.fixture(scope="module")
def tokenizer(cache):
    return P.Tokenizer.from_directory(cache.tokenizer_dir)


def evaluate(artifact, cache_root, script=REPO / "prepare.py", cwd=None):
    """`python prepare.py --evaluate artifact` in a fresh interpreter, as the harness runs it."""
    env = {**os.environ, "AUTORESEARCH_CACHE": str(cache_root)}
    env.pop(P.ARTIFACT_ENV, None)
    return subprocess.run([sys.executable, str(script), "--evaluate", str(artifact), "--device", "cpu"],
                          cwd=cwd or script.parent, env=env, capture_output=True, text=True, timeout=600)


def export(model, path, cache, monkeypatch, tokenizer, batch_size=7):
    """Export through evaluate_bpb as train.py does; returns the in-process val_bpb."""
    monkeypatch.setenv(P.ARTIFACT_ENV, str(path))
    bpb = P.evaluate_bpb(model, tokenizer, batch_size, prepared=cache)
    monkeypatch.delenv(P.ARTIFACT_ENV)
    assert path.is_file()
    return bpb


def cli_error(capsys, artifact, cache, monkeypatch):
    """main(['--evaluate', artifact]) in this process: (exit code, stderr). For the error paths only."""
    monkeypatch.setenv("AUTORESEARCH_CACHE", str(cache.root))
    code = P.main(["--evaluate", str(artifact), "--device", "cpu"])
    return code, capsys.readouterr().err


class Uniform(torch.nn.Module):
    """Equal logits for every token: the model that knows nothing."""

    def __init__(self, V):
        super().__init__()
        self.V = V

    def forward(self, x):
        return torch.zeros(*x.shape, self.V)


class PeeksOnSomeRows(Bigram):
    """A bigram that reads the next token, but only in rows whose first token after BOS is a trigger."""

    def __init__(self, V, triggers):
        super().__init__(V)
        self.register_buffer("trigger", torch.zeros(V, dtype=torch.bool).index_fill_(0, torch.tensor(sorted(triggers)), True))

    def forward(self, x):
        peek = self.trigger[x[:, 1]][:, None, None]
        return torch.where(peek, self.table[torch.roll(x, -1, dims=1)], self.table[x])

# ---------------------------------------------------------------------------
# round trips: the separate evaluator reproduces the in-process number


@pytest.mark.slow
def test_tiny_gpt_round_trip_matches_in_process(cache, tokenizer, tmp_path, monkeypatch, train_defs):
    T = train_defs
    torch.manual_seed(0)
    cfg = T["GPTConfig"](sequence_len=64, vocab_size=320, n_layer=2, n_head=2, n_embd=32, window_pattern="SL")
    model = T["GPT"](cfg)
    model.init_weights()
    with torch.no_grad():  # init leaves the projections at zero; perturb so attention really mixes positions
        for p in model.parameters():
            p.add_(0.05 * torch.randn_like(p))
    in_process = export(model, tmp_path / "gpt.pt2", cache, monkeypatch, tokenizer)
    # a pristine copy of prepare.py elsewhere, run from yet another directory
    pristine = tmp_path / "pristine"
    pristine.mkdir()
    shutil.copy(REPO / "prepare.py", pristine / "prepare.py")
    result = evaluate(tmp_path / "gpt.pt2", cache.root, script=pristine / "prepare.py", cwd=tmp_path)
    assert result.returncode == 0, result.stderr[-3000:]
    summary = parse_summary(result.stdout)
    assert list(summary) == ["val_bpb", "eval_seconds", "eval_tokens", "frozen_inputs"]
    assert abs(float(summary["val_bpb"]) - in_process) < 1e-5  # float32 in both: equal up to summation order
    assert 4 < in_process < 12  # a perturbed random model: a little worse than uniform (log2(320)/~3 bytes)
    assert int(summary["eval_tokens"]) == ROWS * 64
    assert summary["frozen_inputs"] == P.frozen_inputs(cache)["digest"]


@pytest.mark.slow
def test_uniform_artifact_scores_log2_vocab_times_tokens_per_byte(cache, tokenizer, tmp_path, monkeypatch):
    V, T = 320, 64
    _, y, _ = next(P.make_dataloader(tokenizer, ROWS, T, "val", prepared=cache))
    nbytes = P.get_token_bytes(prepared=cache)[y.reshape(-1)]
    scored_tokens = (nbytes > 0).sum().item()
    expected = math.log2(V) * scored_tokens / nbytes.sum().item()
    assert scored_tokens < ROWS * T  # BOS targets are excluded from the sum
    P.export_model(Uniform(V), tmp_path / "uniform.pt2", cache)
    result = P.evaluate_artifact(tmp_path / "uniform.pt2", "cpu", cache)
    assert result["val_bpb"] == pytest.approx(expected, rel=1e-6)
    assert result["eval_tokens"] == ROWS * T
    # and through the CLI of a fresh interpreter, printed to 6 decimals
    cli = evaluate(tmp_path / "uniform.pt2", cache.root)
    assert cli.returncode == 0, cli.stderr[-3000:]
    assert float(parse_summary(cli.stdout)["val_bpb"]) == pytest.approx(expected, abs=1e-6)


@pytest.mark.slow
def test_the_holdout_split_is_scored_the_same_way_on_its_own_tokens(cache, tokenizer, tmp_path):
    """--split holdout: the same metric on the hidden holdout split (report.py --holdout), hand-computed for the
    uniform model from that split's own tokens, and marked in the summary."""
    V, T = 320, 64
    _, y, _ = next(P.make_dataloader(tokenizer, ROWS, T, "holdout", prepared=cache))
    nbytes = P.get_token_bytes(prepared=cache)[y.reshape(-1)]
    expected = math.log2(V) * (nbytes > 0).sum().item() / nbytes.sum().item()
    P.export_model(Uniform(V), tmp_path / "uniform.pt2", cache)
    assert P.evaluate_artifact(tmp_path / "uniform.pt2", "cpu", cache, split="holdout")["val_bpb"] == \
        pytest.approx(expected, rel=1e-6)
    env = {**os.environ, "AUTORESEARCH_CACHE": str(cache.root)}
    env.pop(P.ARTIFACT_ENV, None)
    cli = subprocess.run([sys.executable, str(REPO / "prepare.py"), "--evaluate", str(tmp_path / "uniform.pt2"),
                          "--device", "cpu", "--split", "holdout"], cwd=REPO, env=env, capture_output=True, text=True,
                         timeout=600)
    summary = parse_summary(cli.stdout)
    assert summary["split"] == "holdout" and float(summary["val_bpb"]) == pytest.approx(expected, abs=1e-6)


def test_plain_function_and_compiled_module_export(cache, tmp_path):
    """train.py may pass a torch.compile'd module (its _orig_mod is exported) or a plain function."""
    model = Bigram(320)
    P.export_model(torch.compile(model), tmp_path / "compiled.pt2", cache)
    P.export_model(lambda x: model(x) * 2, tmp_path / "function.pt2", cache)
    x = torch.randint(0, 320, (P.EVAL_BATCH_ROWS, 64))
    torch.testing.assert_close(P.load_artifact(tmp_path / "compiled.pt2")(x), model(x))
    torch.testing.assert_close(P.load_artifact(tmp_path / "function.pt2")(x), 2 * model(x))

# ---------------------------------------------------------------------------
# the causality probe runs on random batches


def test_leak_on_later_batches_only_is_caught(cache, tokenizer, tmp_path, capsys, monkeypatch):
    loader = P.make_dataloader(tokenizer, P.EVAL_BATCH_ROWS, 64, "val", prepared=cache)
    batches = [next(loader)[0] for _ in range(ROWS // P.EVAL_BATCH_ROWS)]
    first_row_tokens = [set(x[:, 1].tolist()) for x in batches]
    triggers = set().union(*first_row_tokens[1:]) - first_row_tokens[0]
    assert all(tokens & triggers for tokens in first_row_tokens[1:])  # every later batch has rows that leak
    model = PeeksOnSomeRows(320, triggers)
    # on the first batch it is exactly the causal bigram: probing only that batch could not see the leak
    torch.testing.assert_close(model(batches[0]), Bigram(320)(batches[0]), rtol=0, atol=0)
    with pytest.raises(P.CausalityError, match="not causal"):
        P.check_causality(model, batches[1], 320)
    # with 6 batches and 2 random probes, at least one probe lands on a leaking batch, every time
    P.export_model(model, tmp_path / "leaky.pt2", cache)
    for _ in range(3):
        code, err = cli_error(capsys, tmp_path / "leaky.pt2", cache, monkeypatch)
        assert code == 1 and "the model is not causal" in err
    with pytest.raises(P.CausalityError):
        P.evaluate_bpb(model, tokenizer, 32, prepared=cache)


class Remembers(Bigram):
    """Reads the next token, and keeps its last input and output in buffers so that it could answer a probe (the
    same rows with a changed suffix) from memory: a hand-edited or exported stateful program."""

    def __init__(self, V, T):
        super().__init__(V)
        self.register_buffer("last", torch.zeros(P.EVAL_BATCH_ROWS, T, dtype=torch.long))

    def forward(self, x):
        self.last.copy_(x)
        return self.table[torch.roll(x, -1, dims=1)]


def test_a_program_that_keeps_state_between_calls_is_refused(cache, tmp_path):
    P.export_model(Remembers(cache.vocab_size, cache.max_seq_len), tmp_path / "stateful.pt2", cache)
    with pytest.raises(P.ArtifactError, match="updates its own buffers|calls copy_"):   # functionalised or not
        P.load_artifact(tmp_path / "stateful.pt2")


class Loud(Bigram):
    """Reads the next token everywhere, and puts one logit of 1e8 at position (0, 0): under a tolerance scaled by the
    batch's largest logit, every leak would pass."""

    def forward(self, x):
        logits = self.table[torch.roll(x, -1, dims=1)]
        return logits + torch.zeros_like(logits).index_put_((torch.tensor([0]), torch.tensor([0])), torch.tensor(1e8))


def test_one_huge_logit_does_not_loosen_the_probe_elsewhere(cache):
    x = torch.randint(1, 320, (4, 64), generator=torch.Generator().manual_seed(0))
    with pytest.raises(P.CausalityError, match="not causal"):
        P.check_causality(Loud(320), x, 320)


class LeaksUnderAHugeLogit(Bigram):
    """A hostile tester's cheat: add `boost` to the true next token's logit, and -1e6 on a token that never occurs at
    every position, which loosened a tolerance scaled by each position's largest |logit| to ~1000 everywhere."""

    def __init__(self, vocab, boost):
        super().__init__(vocab)
        self.boost = boost

    def forward(self, x):
        logits = super().forward(x)
        V = logits.size(-1)
        following = F.pad(F.one_hot(x[:, 1:], V).to(logits.dtype), (0, 0, 0, 1))
        return logits + self.boost * following - 1e6 * (torch.arange(V) == V - 1).to(logits.dtype)


@pytest.mark.parametrize("boost", [30.0, 0.4, 0.05])
def test_a_leak_under_a_huge_negative_logit_is_caught(cache, tmp_path, boost):
    x = torch.randint(1, 319, (P.EVAL_BATCH_ROWS, 64), generator=torch.Generator().manual_seed(0))
    with pytest.raises(P.CausalityError, match="not causal"):
        P.check_causality(LeaksUnderAHugeLogit(320, boost), x, 320)
    # and through the separate evaluator, as agent.py runs it
    P.export_model(LeaksUnderAHugeLogit(320, boost), tmp_path / "leak.pt2", cache)
    with pytest.raises(P.CausalityError, match="not causal"):
        P.evaluate_artifact(tmp_path / "leak.pt2", "cpu", cache)
    P.check_causality(LeaksUnderAHugeLogit(320, 0.0), x, 320)     # the huge logit alone is no leak


def test_a_graph_that_reads_or_writes_files_is_refused_before_it_runs(cache, tmp_path):
    """A crafted archive: an exported program whose empty() is rewritten into from_file(shared=True) and whose copy
    into copy_ (in place), i.e. a write of the model's bytes to a file of the attacker's choice when it runs."""
    class Writes(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.register_buffer("payload", torch.tensor(list(b"owned"), dtype=torch.uint8))

        def forward(self, x):
            t = torch.ops.aten.copy.default(torch.empty(5, dtype=torch.uint8), self.payload)
            return x.float()[..., None] * 0 + t[:1].float() * 0

    import io
    buf = io.BytesIO()
    torch.export.save(torch.export.export(Writes(), (torch.zeros(2, 8, dtype=torch.long),)), buf)
    target = tmp_path / "written.txt"
    with zipfile.ZipFile(io.BytesIO(buf.getvalue())) as zin, zipfile.ZipFile(tmp_path / "evil.pt2", "w") as zout:
        for info in zin.infolist():
            data = zin.read(info.filename)
            if info.filename.endswith("models/model.json"):
                graph = json.loads(data)
                for node in graph["graph_module"]["graph"]["nodes"]:
                    if node["target"] == "torch.ops.aten.empty.memory_format":
                        node["target"] = "torch.ops.aten.from_file.default"
                        node["inputs"] = [{"name": "filename", "arg": {"as_string": str(target)}, "kind": 1},
                                          {"name": "shared", "arg": {"as_bool": True}, "kind": 1},
                                          {"name": "size", "arg": {"as_int": 5}, "kind": 1},
                                          {"name": "dtype", "arg": {"as_scalar_type": 1}, "kind": 2}]
                    elif node["target"] == "torch.ops.aten.copy.default":
                        node["target"] = "torch.ops.aten.copy_.default"
                data = json.dumps(graph).encode()
            zout.writestr(info, data)
    with pytest.raises(P.ArtifactError, match="from_file|copy_"):
        P.load_artifact(tmp_path / "evil.pt2")
    assert not target.exists()


def test_probe_cuts_cover_late_positions(cache):
    """A leak confined to the last positions of a row (beyond the old fixed cuts at T/3 and 2T/3) is caught."""
    class PeeksNearTheEnd(Bigram):
        def forward(self, x):
            late = torch.arange(x.shape[1]) > 2 * x.shape[1] // 3
            return torch.where(late[None, :, None], self.table[torch.roll(x, -1, dims=1)], self.table[x])
    x = torch.randint(0, 320, (P.EVAL_BATCH_ROWS, 64), generator=torch.Generator().manual_seed(0))
    for _ in range(5):
        with pytest.raises(P.CausalityError):
            P.check_causality(PeeksNearTheEnd(320), x, 320)
    P.check_causality(Bigram(320), x, 320)  # a causal model passes

# ---------------------------------------------------------------------------
# bad artifacts: a clear message and a non-zero exit


@pytest.mark.slow
def test_missing_artifact_exits_non_zero_with_a_message(cache, tmp_path):
    result = evaluate(tmp_path / "nothing.pt2", cache.root)
    assert result.returncode == 1
    assert "no model artifact at" in result.stderr and P.ARTIFACT_ENV in result.stderr
    assert "Traceback" not in result.stderr and "val_bpb" not in result.stdout


def test_corrupt_and_truncated_artifacts_are_refused(cache, tmp_path, capsys, monkeypatch):
    (tmp_path / "garbage.pt2").write_bytes(b"this is not a zip archive")
    code, err = cli_error(capsys, tmp_path / "garbage.pt2", cache, monkeypatch)
    assert code == 1 and "is not a torch.export archive" in err
    P.export_model(Bigram(320), tmp_path / "good.pt2", cache)
    data = (tmp_path / "good.pt2").read_bytes()
    (tmp_path / "cut.pt2").write_bytes(data[: len(data) // 2])
    code, err = cli_error(capsys, tmp_path / "cut.pt2", cache, monkeypatch)
    assert code == 1 and "torch.export archive" in err


def test_pickled_objects_in_the_archive_are_refused(cache, tmp_path, capsys, monkeypatch):
    """torch.export.load would unpickle these (arbitrary code); the evaluator refuses them before loading."""
    P.export_model(Bigram(320), tmp_path / "good.pt2", cache)
    with zipfile.ZipFile(tmp_path / "good.pt2") as src, zipfile.ZipFile(tmp_path / "evil.pt2", "w") as dst:
        prefix = src.namelist()[0].split("/")[0]
        for name in src.namelist():
            dst.writestr(name, src.read(name))
        dst.writestr(f"{prefix}/data/constants/opaque_obj_0", b"cos\nsystem\n(S'echo pwned'\ntR.")
    code, err = cli_error(capsys, tmp_path / "evil.pt2", cache, monkeypatch)
    assert code == 1 and "pickled Python objects" in err and "opaque_obj_0" in err


class WrongVocab(Bigram):
    def forward(self, x):
        return torch.cat([self.table[x], torch.zeros(*x.shape, 1)], dim=-1)


class IntegerLogits(Bigram):
    def forward(self, x):
        return self.table[x].round().long()


class NonFinite(Bigram):
    def forward(self, x):
        # inf wherever the input is the row's first token (at least once a row, whatever the tokens): a fixed token
        # such as 7 (the byte BEL) never occurs in the val split, only at times in the causality probe's random tokens
        return self.table[x] / (x != x[:, :1]).float()[..., None]


@pytest.mark.parametrize("model, message", [
    (WrongVocab(320), r"needs floating-point logits of shape \(32, 64, 320\), got \(32, 64, 321\) float32"),
    (IntegerLogits(320), r"needs floating-point logits .* got \(32, 64, 320\) int64"),
    (NonFinite(320), r"non-finite logits \(NaN or inf\)"),
])
def test_bad_logits_are_refused(cache, tmp_path, capsys, monkeypatch, model, message):
    P.export_model(model, tmp_path / "bad.pt2", cache)
    code, err = cli_error(capsys, tmp_path / "bad.pt2", cache, monkeypatch)
    assert code == 1 and re.search(message, err), err


def test_artifact_of_another_input_shape_is_refused(cache, tmp_path, capsys, monkeypatch):
    program = torch.export.export(Bigram(320), (torch.zeros(4, 64, dtype=torch.long),))
    torch.export.save(program, tmp_path / "small-batch.pt2")
    code, err = cli_error(capsys, tmp_path / "small-batch.pt2", cache, monkeypatch)
    assert code == 1 and "fails on validation tokens int64[32, 64]" in err and "evaluate_bpb" in err


def test_untraceable_model_names_the_fix(cache, tmp_path):
    class BranchesOnValues(Bigram):
        def forward(self, x):
            if x.sum() > 0:  # Python control flow on a tensor value: torch.export cannot trace it
                return self.table[x]
            return -self.table[x]
    with pytest.raises(P.ArtifactError, match="could not be exported.*use only torch ops that torch.export can trace"):
        P.export_model(BranchesOnValues(320), tmp_path / "x.pt2", cache)
    assert not (tmp_path / "x.pt2").exists()

# ---------------------------------------------------------------------------
# the training process without the val split (the harness's sandbox)


def test_hidden_val_split_gives_nan_after_exporting(cache, tokenizer, tmp_path, monkeypatch, capsys):
    root = tmp_path / "cache"
    shutil.copytree(cache.root, root)
    hidden = P.load_prepared(root)
    (hidden.data_dir / hidden.val_name).unlink()
    assert P.load_prepared(root).val_name == hidden.val_name  # train.py still starts without the val split
    monkeypatch.setenv(P.ARTIFACT_ENV, str(tmp_path / "model.pt2"))
    assert math.isnan(P.evaluate_bpb(Bigram(320), tokenizer, 32, prepared=hidden))
    assert "the score comes from the separate evaluator" in capsys.readouterr().out
    assert (tmp_path / "model.pt2").is_file()
    # the evaluator, which sees the val split, scores the artifact as the in-process evaluation would
    monkeypatch.delenv(P.ARTIFACT_ENV)
    expected = P.evaluate_bpb(Bigram(320), tokenizer, 32, prepared=cache)
    assert P.evaluate_artifact(tmp_path / "model.pt2", "cpu", cache)["val_bpb"] == pytest.approx(expected, abs=1e-6)
    # without an artifact to hand over, a missing val split is an error that says what to do
    with pytest.raises(P.PrepareError, match="val split .* is missing or unreadable: re-run prepare.py with --force"):
        P.evaluate_bpb(Bigram(320), tokenizer, 32, prepared=hidden)
    monkeypatch.setenv("AUTORESEARCH_CACHE", str(root))
    assert P.main(["--check"]) == 1 and "is missing or unreadable" in capsys.readouterr().err

# ---------------------------------------------------------------------------
# frozen inputs


def frozen_cli(script, cache_root, cwd):
    env = {**os.environ, "AUTORESEARCH_CACHE": str(cache_root)}
    result = subprocess.run([sys.executable, str(script), "--frozen-inputs"], cwd=cwd, env=env,
                            capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]
    return json.loads(result.stdout)


@pytest.mark.slow
def test_frozen_inputs_digest_is_stable_across_copies_and_tracks_changes(cache, tmp_path):
    here = P.frozen_inputs(cache)
    assert set(here["files"]) == {"prepare.py", "prepared.json", "tokenizer.pkl", "token_bytes", "val/val.parquet",
                                  "holdout/holdout.parquet"}
    # the val and holdout splits, and the --source text they were cut from (which holds their documents too)
    assert here["evaluator_only"] == [str((cache.data_dir / "val.parquet").resolve()),
                                      str((cache.data_dir / "holdout.parquet").resolve()), str(Path(cache.source).resolve())]
    lines = "".join(f"{role}:{h}\n" for role, h in sorted(here["files"].items()))
    assert here["digest"] == hashlib.sha256(lines.encode()).hexdigest()
    # a pristine copy of prepare.py elsewhere, run from another directory, gives the same digest
    for name in ("a", "b"):
        (tmp_path / name).mkdir()
        shutil.copy(REPO / "prepare.py", tmp_path / name / "prepare.py")
    assert frozen_cli(tmp_path / "a" / "prepare.py", cache.root, cwd=tmp_path) == here
    # an edited prepare.py changes it
    with open(tmp_path / "b" / "prepare.py", "a") as f:
        f.write("\n# an edit\n")
    edited = frozen_cli(tmp_path / "b" / "prepare.py", cache.root, cwd=tmp_path / "b")
    assert edited["digest"] != here["digest"]
    assert {r for r in here["files"] if here["files"][r] != edited["files"][r]} == {"prepare.py"}
    # so does a changed val file (in a copy of the cache)
    root = tmp_path / "cache"
    shutil.copytree(cache.root, root)
    copy = P.load_prepared(root)
    assert P.frozen_inputs(copy)["digest"] == here["digest"]  # keyed by role, not by absolute path
    with open(copy.data_dir / copy.val_name, "ab") as f:
        f.write(b"\0")
    changed = P.frozen_inputs(copy)
    assert {r for r in here["files"] if here["files"][r] != changed["files"][r]} == {"val/val.parquet"}
    assert changed["digest"] != here["digest"]

# ---------------------------------------------------------------------------
# a real train.py run, scored by the separate evaluator


@pytest.mark.slow
def test_train_run_artifact_scores_within_metric_tolerance(cpu_cache, gpt_run, tmp_path):
    result, artifact = gpt_run                    # the real run of conftest.py, its artifact exported
    assert result.returncode == 0, result.stderr[-3000:]
    assert "nanobind" not in result.stdout + result.stderr
    in_process = float(parse_summary(result.stdout)["val_bpb"])
    assert artifact.is_file()
    separate = evaluate(artifact, cpu_cache, cwd=tmp_path)
    assert separate.returncode == 0, separate.stderr[-3000:]
    summary = parse_summary(separate.stdout)
    assert abs(float(summary["val_bpb"]) - in_process) <= P.METRIC_TOLERANCE, (summary["val_bpb"], in_process)
    assert int(summary["eval_tokens"]) == P.load_prepared(cpu_cache).eval_tokens == 8192   # conftest's --eval-tokens
    assert summary["frozen_inputs"] == P.frozen_inputs(P.load_prepared(cpu_cache))["digest"]


@pytest.mark.slow
def test_the_evaluator_opens_nothing_but_its_declared_reads_and_the_artifact(cache, tmp_path):
    """Traced with strace: every file `prepare.py --evaluate` opens is the system's, the Python environment's, its
    own pristine copy's, one of --frozen-inputs' eval_reads, or the artifact (so the sandbox's view of the evaluator,
    which shows exactly these, is complete, and the digest covers what decides the score)."""
    frozen = tmp_path / "frozen"
    frozen.mkdir()
    shutil.copy(REPO / "prepare.py", frozen / "prepare.py")
    P.export_model(Uniform(320), tmp_path / "uniform.pt2", cache)
    env = {**os.environ, "AUTORESEARCH_CACHE": str(cache.root)}
    inputs = json.loads(subprocess.run([sys.executable, "prepare.py", "--frozen-inputs"], cwd=frozen, env=env,
                                       capture_output=True, text=True, timeout=300).stdout.strip().splitlines()[-1])
    opened, outside = opened_outside([sys.executable, "prepare.py", "--evaluate", tmp_path / "uniform.pt2", "--device",
                                      "cpu"], frozen, env, tmp_path / "trace",
                                     [frozen, tmp_path / "uniform.pt2", *inputs["eval_reads"]])
    assert len(opened) > 100 and outside == []
    # what decides the score is in the digest: every data file it opened is one of the hashed roles (the holdout is
    # opened to hash it)
    data = {p for p in opened if p.is_relative_to(Path(cache.root).resolve())}
    assert {p.name for p in data} == {"prepared.json", "tokenizer.pkl", "token_bytes.pt", cache.val_name,
                                      cache.holdout_name}
    hashed = {name.split("/")[-1] for name in inputs["files"] if name != "prepare.py"}   # roles: token_bytes
    assert {p.name.removesuffix(".pt") if p.name == "token_bytes.pt" else p.name for p in data} == hashed
