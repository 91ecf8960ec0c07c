"""Tests of prepare.py (the frozen side): local sources, downloads, tokenizer, dataloader, evaluator."""

import errno
import http.server
import io
import json
import math
import os
import random
import socket
import subprocess
import sys
import threading
import time

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import torch

import prepare as P

from helpers import CORPORA, REPO, Bigram

# A small profile so the tests train a tokenizer and evaluate in well under a second.
TINY = P.Profile("tiny", max_seq_len=64, eval_tokens=64 * 20, vocab_size=320, doc_chars=160)


@pytest.fixture(scope="module")
def tiny_cache(tmp_path_factory):
    """tinyshakespeare prepared with the tiny profile in a throwaway cache."""
    root = tmp_path_factory.mktemp("cache")
    return P.prepare("climbmix", str(CORPORA / "tinyshakespeare.txt"), TINY, 1, 1, False, root=root)


@pytest.fixture(scope="module")
def tokenizer(tiny_cache):
    return P.Tokenizer.from_directory(tiny_cache.tokenizer_dir)


def run_prepare(*args, cache):
    env = {**os.environ, "AUTORESEARCH_CACHE": str(cache)}
    return subprocess.run([sys.executable, "prepare.py", *args], cwd=REPO, env=env, capture_output=True, text=True, timeout=300)

# ---------------------------------------------------------------------------
# tokenizer


def test_tokenizer_round_trip_and_bos(tokenizer):
    text = "First Citizen:\nBefore we proceed any further, hear me speak. Ünïcödé 你好 🙂\t\ttabs"
    ids = tokenizer.encode(text)
    assert tokenizer.decode(ids) == text
    assert tokenizer.get_vocab_size() == 320
    assert tokenizer.encode([text, "a"], prepend=tokenizer.get_bos_token_id())[1][0] == tokenizer.get_bos_token_id()
    # special-token text is ordinary text, never the BOS id
    assert tokenizer.get_bos_token_id() not in tokenizer.encode(P.BOS_TOKEN)


def test_token_bytes_come_from_raw_bytes(tiny_cache, tokenizer):
    enc = tokenizer.enc
    table = P.get_token_bytes(prepared=tiny_cache)
    assert table.dtype == torch.int32 and table.shape == (320,)
    for name in P.SPECIAL_TOKENS:
        assert table[enc.encode_single_token(name)] == 0
    for i in range(enc.n_vocab - len(P.SPECIAL_TOKENS)):
        assert table[i] == len(enc.decode_single_token_bytes(i))
    # byte 0xE4 alone is not valid UTF-8: decode-then-encode would count 3 bytes (U+FFFD), the truth is 1
    lone = enc.encode_single_token(b"\xe4")
    assert len(enc.decode([lone]).encode()) == 3
    assert table[lone] == 1
    # every byte of a real text is counted exactly once
    text = "Ünïcödé 你好 and plain words."
    assert sum(table[i].item() for i in enc.encode_ordinary(text)) == len(text.encode())

# ---------------------------------------------------------------------------
# local sources


def test_split_text_groups_paragraphs_deterministically():
    text = "a" * 50 + "\n\n" + "b" * 50 + "\n\n\n" + "c" * 30 + "\n\n" + ("word " * 60).strip()
    docs = P.split_text(text, 120)
    assert docs[0] == "a" * 50 + "\n\n" + "b" * 50
    assert docs[1] == "c" * 30  # the next piece would overflow 120 characters
    assert all(len(d) <= 120 for d in docs)
    assert "".join(docs).replace("\n", "").replace(" ", "") == ("a" * 50 + "b" * 50 + "c" * 30 + "word" * 60)
    assert P.split_text(text, 120) == docs


def test_convert_source_holds_out_val_and_holdout_blocks_disjoint_from_training(tmp_path):
    src = tmp_path / "src"
    src.mkdir()
    lines = [json.dumps({"text": f"document number {i}"}) for i in range(200)]
    (src / "a.jsonl").write_text("\n".join(lines) + "\n")
    counts = P.convert_source(P.source_files(src), tmp_path / "data", 100)
    # val: blocks 9 and 19 of 8 documents; holdout: blocks 4, 14 and 24
    assert counts == {"train_docs": 160, "val_docs": 16, "holdout_docs": 24, "replaced_chars": 0}
    val = pq.read_table(tmp_path / "data" / "val.parquet").column("text").to_pylist()
    assert val == [f"document number {i}" for i in list(range(72, 80)) + list(range(152, 160))]
    holdout = pq.read_table(tmp_path / "data" / "holdout.parquet").column("text").to_pylist()
    assert holdout == [f"document number {i}" for i in [*range(32, 40), *range(112, 120), *range(192, 200)]]
    train = pq.read_table(tmp_path / "data" / "shard_00000.parquet").column("text").to_pylist()
    assert len(train) == 160 and not set(val) & set(train) and not set(holdout) & (set(train) | set(val))
    prepared = P.Prepared(tmp_path, "local", "x", TINY, tmp_path / "data", "val.parquet", holdout_name="holdout.parquet")
    assert [p.name for p in P.train_files(prepared)] == ["shard_00000.parquet"]


def test_undecodable_bytes_replaced_and_counted_or_rejected(tmp_path):
    ok = tmp_path / "ok.txt"
    ok.write_bytes(("hello world. " * 100).encode() + b"\xff\xfe" + b" more text")
    docs, replaced = P.read_source_file(ok, 4000)
    assert replaced == 2 and "\ufffd\ufffd" in docs[0]
    bad = tmp_path / "latin1.txt"
    bad.write_bytes("café naïve déjà vu ".encode("latin-1") * 50)
    with pytest.raises(P.PrepareError, match="not UTF-8.*iconv"):
        P.read_source_file(bad, 4000)


def test_jsonl_without_text_field_names_the_line(tmp_path):
    f = tmp_path / "x.jsonl"
    f.write_text('{"text": "fine"}\n{"body": "no text field"}\n')
    with pytest.raises(P.PrepareError, match=r"x.jsonl:2: expected a JSON object with a string field \"text\""):
        P.read_source_file(f, 100)


def test_parquet_source_and_missing_column(tmp_path):
    good = tmp_path / "good.parquet"
    pq.write_table(pa.table({"text": ["one", "", "two"]}), good)
    assert P.read_source_file(good, 100) == (["one", "two"], 0)
    bad = tmp_path / "bad.parquet"
    pq.write_table(pa.table({"body": ["one"]}), bad)
    with pytest.raises(P.PrepareError, match="text"):
        P.read_source_file(bad, 100)


@pytest.mark.parametrize("setup, message", [
    (lambda d: d / "nope", "does not exist"),
    (lambda d: d, "holds no .txt, .jsonl or .parquet files"),
    (lambda d: (d / "empty.txt").write_text("\n\n  \n") and d, "source is empty"),
])
@pytest.mark.slow
def test_bad_sources_exit_with_a_message(tmp_path, setup, message):
    src = tmp_path / "src"
    src.mkdir()
    result = run_prepare("--source", str(setup(src)), "--profile", "cpu", cache=tmp_path / "cache")
    assert result.returncode == 1
    assert message in result.stderr and "Traceback" not in result.stderr


@pytest.mark.slow
def test_check_and_profile_mismatch(tiny_cache, tmp_path):
    missing = run_prepare("--check", cache=tmp_path / "empty")
    assert missing.returncode == 1 and "run prepare.py first" in missing.stderr
    ok = run_prepare("--check", cache=tiny_cache.root)
    assert ok.returncode == 0 and "\nprofile: tiny\n" in ok.stdout
    # a different profile on the same cache is refused, never mixed in silently
    clash = run_prepare("--source", str(CORPORA / "tinyshakespeare.txt"), "--profile", "cpu", cache=tiny_cache.root)
    assert clash.returncode == 1 and "--force" in clash.stderr and "AUTORESEARCH_CACHE" in clash.stderr
    assert P.load_prepared(tiny_cache.root).profile == TINY


def test_eval_tokens_are_checked_recorded_and_never_mixed(tmp_path, capsys, monkeypatch):
    """--eval-tokens: a multiple of MAX_SEQ_LEN (else a message, nothing prepared), recorded in prepared.json (what
    both evaluators read), and a cache prepared with another count is refused without --force, like a profile."""
    cache, source = tmp_path / "cache", str(CORPORA / "tinyshakespeare.txt")
    monkeypatch.setenv("AUTORESEARCH_CACHE", str(cache))
    for bad in ("0", "100", "-256"):
        assert P.main(["--source", source, "--profile", "cpu", "--eval-tokens", bad]) == 1
        assert f"--eval-tokens {bad}: use a positive multiple of MAX_SEQ_LEN=256 of profile 'cpu'" in \
            capsys.readouterr().err
    assert not (cache / "prepared.json").exists()
    assert P.main(["--source", source, "--profile", "cpu", "--eval-tokens", "2048"]) == 0
    assert P.load_prepared(cache).eval_tokens == 2048 and P.load_prepared(cache).profile.name == "cpu"
    assert P.main(["--source", source, "--profile", "cpu"]) == 1
    assert "prepared with profile 'cpu' (2048 eval tokens). To replace it re-run with --force" in \
        capsys.readouterr().err
    assert P.main(["--source", source, "--profile", "cpu", "--eval-tokens", "2048"]) == 0
    assert "Already prepared" in capsys.readouterr().out
    with pytest.raises(SystemExit):                 # the count is the prepared data's, never a reader's flag
        P.main(["--check", "--eval-tokens", "999"])
    assert "--eval-tokens is for preparing data" in capsys.readouterr().err


def test_val_split_smaller_than_eval_tokens_is_refused(tmp_path):
    big = P.Profile("big-eval", max_seq_len=64, eval_tokens=64 * 10_000, vocab_size=320, doc_chars=160)
    with pytest.raises(P.PrepareError, match="validation split is smaller than EVAL_TOKENS"):
        P.prepare("climbmix", str(CORPORA / "tinyshakespeare.txt"), big, 1, 1, False, root=tmp_path)
    assert not (tmp_path / "prepared.json").exists()


def test_time_budget_override(monkeypatch):
    monkeypatch.delenv(P.TIME_BUDGET_ENV, raising=False)
    assert P.time_budget() == (300.0, False)
    monkeypatch.setenv(P.TIME_BUDGET_ENV, "12.5")
    assert P.time_budget() == (12.5, True)
    for same in ("300", "300.0", " 300 "):  # the budget itself is no override: the run is a real one
        monkeypatch.setenv(P.TIME_BUDGET_ENV, same)
        assert P.time_budget() == (300.0, False)
    monkeypatch.setenv(P.TIME_BUDGET_ENV, "299")
    assert P.time_budget() == (299.0, True)
    for bad in ("soon", "-5", "0", "inf", "nan"):
        monkeypatch.setenv(P.TIME_BUDGET_ENV, bad)
        with pytest.raises(P.PrepareError, match="positive, finite number"):
            P.time_budget()

# ---------------------------------------------------------------------------
# dataloader


def test_dataloader_rows_start_with_bos_and_are_full(tiny_cache, tokenizer):
    B, T = 4, 64
    loader = P.make_dataloader(tokenizer, B, T, "train", prepared=tiny_cache)
    bos = tokenizer.get_bos_token_id()
    for _ in range(5):
        x, y, epoch = next(loader)
        assert x.shape == (B, T) and y.shape == (B, T) and x.dtype == torch.int64
        assert (x[:, 0] == bos).all()
        assert torch.equal(x[:, 1:], y[:, :-1])
        assert ((x >= 0) & (x < 320)).all() and ((y >= 0) & (y < 320)).all()  # no padding or ignore index
        assert epoch == 1


def test_a_seed_gives_its_own_training_order_the_same_every_time(tiny_cache, tokenizer):
    """AUTORESEARCH_SEED's data order: the same seed, the same batches; another seed, other batches; the same
    documents either way (a reordering, not a resampling); the val split has one fixed order."""
    def first(seed, k=3):
        loader = P.make_dataloader(tokenizer, 4, 64, "train", prepared=tiny_cache, seed=seed)
        return [next(loader)[0] for _ in range(k)]
    same = [torch.equal(a, b) for a, b in zip(first(1), first(1))]
    other = [torch.equal(a, b) for a, b in zip(first(1), first(2))]
    plain = [torch.equal(a, b) for a, b in zip(first(None), first(None))]
    assert all(same) and all(plain) and not all(other)
    paths = P.train_files(tiny_cache)
    texts = sorted(t for t in P._iter_texts(paths) if t)
    assert sorted(t for t in P._iter_texts(paths, random.Random("2:1")) if t) == texts
    with pytest.raises(ValueError, match="no seed"):
        next(P.make_dataloader(tokenizer, 4, 64, "val", prepared=tiny_cache, seed=1))


def test_dataloader_wraps_epochs_on_a_tiny_corpus(tmp_path, tiny_cache, tokenizer):
    data = tmp_path / "data"
    data.mkdir()
    pq.write_table(pa.table({"text": ["a tiny corpus of two documents", "the second one"]}), data / "shard_00000.parquet")
    pq.write_table(pa.table({"text": ["val"]}), data / "val.parquet")
    prepared = P.Prepared(tiny_cache.root, "local", "x", TINY, data, "val.parquet")
    loader = P.make_dataloader(tokenizer, 2, 64, "train", prepared=prepared)
    epochs = [next(loader)[2] for _ in range(3)]
    assert epochs[0] >= 2 and epochs == sorted(epochs)  # 128 tokens a batch need several passes over ~20 tokens


def test_dataloader_without_training_data_says_so(tmp_path, tiny_cache, tokenizer):
    data = tmp_path / "data"
    data.mkdir()
    pq.write_table(pa.table({"text": ["val"]}), data / "val.parquet")
    prepared = P.Prepared(tiny_cache.root, "local", "x", TINY, data, "val.parquet")
    with pytest.raises(P.PrepareError, match="no training shards"):
        next(P.make_dataloader(tokenizer, 2, 64, "train", prepared=prepared))

# ---------------------------------------------------------------------------
# evaluator


class Uniform(torch.nn.Module):
    """Equal logits for every token: the model that knows nothing."""

    def __init__(self, V):
        super().__init__()
        self.V = V
        self.dummy = torch.nn.Parameter(torch.zeros(1))

    def forward(self, x):
        return torch.zeros(*x.shape, self.V)


class PeeksAhead(Bigram):
    """Uses the next token at every position: sees the future."""

    def forward(self, x):
        return self.table[torch.roll(x, -1, dims=1)]


def test_uniform_logits_give_log2_vocab_times_tokens_per_byte(tiny_cache, tokenizer):
    V, T = 320, 64
    rows = TINY.eval_tokens // T
    table = P.get_token_bytes(prepared=tiny_cache)
    loader = P.make_dataloader(tokenizer, rows, T, "val", prepared=tiny_cache)
    _, y, _ = next(loader)
    nbytes = table[y.reshape(-1)]
    scored_tokens = (nbytes > 0).sum().item()
    expected = math.log2(V) * scored_tokens / nbytes.sum().item()
    assert scored_tokens < rows * T  # BOS targets are excluded from the sum
    assert P.evaluate_bpb(Uniform(V), tokenizer, 8, prepared=tiny_cache) == pytest.approx(expected, rel=1e-6)  # CE is float32


def test_bpb_does_not_depend_on_eval_batch_size(tiny_cache, tokenizer):
    model = Bigram(320)
    scores = {b: P.evaluate_bpb(model, tokenizer, b, prepared=tiny_cache) for b in (3, 7, 20)}
    assert scores[3] == pytest.approx(scores[7], rel=1e-6) and scores[3] == pytest.approx(scores[20], rel=1e-6)


def test_causality_probe_rejects_a_model_that_sees_the_future(tiny_cache, tokenizer):
    with pytest.raises(P.CausalityError, match="not causal"):
        P.evaluate_bpb(PeeksAhead(320), tokenizer, 8, prepared=tiny_cache)
    x = torch.randint(0, 320, (4, 64))
    P.check_causality(Bigram(320), x, 320)  # a causal model passes


def test_evaluator_requires_logits_of_the_vocab_shape(tiny_cache, tokenizer):
    with pytest.raises(ValueError, match="needs floating-point logits of shape"):
        P.evaluate_bpb(Uniform(384), tokenizer, 8, prepared=tiny_cache)

# ---------------------------------------------------------------------------
# downloads against a real HTTP server on 127.0.0.1


def parquet_bytes(n):
    buf = io.BytesIO()
    pq.write_table(pa.table({"text": [f"document {i} " * 20 for i in range(n)]}), buf)
    return buf.getvalue()


@pytest.fixture()
def server():
    """Serves files from a dict path -> bytes (or a list of bytes served in turn); anything else is 404."""
    files, hits = {}, {}

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self):
            hits[self.path] = hits.get(self.path, 0) + 1
            body = files.get(self.path)
            if isinstance(body, list):
                body = body[min(hits[self.path], len(body)) - 1]
            if body is None:
                self.send_error(404)
                return
            self.send_response(200)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args):
            pass

    httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{httpd.server_port}", files, hits
    httpd.shutdown()
    httpd.server_close()


def test_download_good_file(server, tmp_path):
    url, files, hits = server
    files["/shard_00000.parquet"] = parquet_bytes(5)
    path = P.download_file(f"{url}/shard_00000.parquet", tmp_path / "shard_00000.parquet", backoff=0)
    assert pq.read_table(path).num_rows == 5
    # a valid file already there counts as done: no second request
    P.download_file(f"{url}/shard_00000.parquet", path, backoff=0)
    assert hits["/shard_00000.parquet"] == 1


def test_truncated_download_is_retried_then_accepted(server, tmp_path):
    url, files, hits = server
    good = parquet_bytes(5)
    files["/s.parquet"] = [good[: len(good) // 2], good]
    path = P.download_file(f"{url}/s.parquet", tmp_path / "s.parquet", backoff=0)
    assert hits["/s.parquet"] == 2 and path.read_bytes() == good


def test_always_truncated_download_fails_and_leaves_nothing(server, tmp_path):
    url, files, hits = server
    good = parquet_bytes(5)
    files["/s.parquet"] = good[:-20]
    with pytest.raises(P.PrepareError, match="after 3 attempts"):
        P.download_file(f"{url}/s.parquet", tmp_path / "s.parquet", attempts=3, backoff=0)
    assert hits["/s.parquet"] == 3 and list(tmp_path.iterdir()) == []


def test_corrupt_existing_file_is_fetched_again(server, tmp_path):
    url, files, hits = server
    files["/s.parquet"] = parquet_bytes(3)
    (tmp_path / "s.parquet").write_bytes(b"PAR1 garbage from an interrupted run")
    P.download_file(f"{url}/s.parquet", tmp_path / "s.parquet", backoff=0)
    assert hits["/s.parquet"] == 1 and P.parquet_ok(tmp_path / "s.parquet")


def test_missing_file_is_a_404_error_without_retries(server, tmp_path):
    url, files, hits = server
    with pytest.raises(P.PrepareError, match="404"):
        P.download_file(f"{url}/nope.parquet", tmp_path / "nope.parquet", backoff=0)
    assert hits["/nope.parquet"] == 1


def test_offline_error_names_source(tmp_path):
    with socket.socket() as s:  # a port nobody listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    with pytest.raises(P.OfflineError, match="--source"):
        P.download_file(f"http://127.0.0.1:{port}/s.parquet", tmp_path / "s.parquet", attempts=2, backoff=0)


def test_unresolvable_host_fails_at_once_without_retries(tmp_path, capsys):
    """A name that does not resolve is not transient (offline, no resolver): no backoff, no retry lines."""
    t0 = time.time()
    with pytest.raises(P.OfflineError, match=r"cannot reach nonexistent.invalid \(offline\?\).*--source"):
        P.download_file("http://nonexistent.invalid/shard_00000.parquet", tmp_path / "s.parquet", attempts=5, backoff=2.0)
    assert time.time() - t0 < 1.9  # the first retry alone would wait backoff = 2 s
    assert "attempt" not in capsys.readouterr().out and list(tmp_path.iterdir()) == []


@pytest.fixture()
def offline(monkeypatch):
    """A URL on 127.0.0.1 that nobody listens on (connection refused: what download_file calls offline), also set as
    the tinystories URL. No test reaches a real host."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        url = f"http://127.0.0.1:{s.getsockname()[1]}"
    monkeypatch.setattr(P, "TINYSTORIES_URL", f"{url}/tinystories_gpt4_clean.parquet")
    return url


@pytest.mark.parametrize("profile, documents", [("cpu", 2681 + 7865), ("small", 1289 + 3903)])  # both files, cut
def test_offline_cpu_and_small_prepare_the_sample_corpus_and_keep_it(offline, profile, documents, tmp_path, monkeypatch,
                                                                      capsys):
    """Offline, no --source, an empty cache: the sample shipped in data/sample is prepared instead, with a line saying
    so; --check passes, the sample stays out of train.py's reach (evaluator_only), and a later run re-uses it."""
    cache = tmp_path / "cache"
    monkeypatch.setenv("AUTORESEARCH_CACHE", str(cache))
    P.prepare("tinystories", None, P.PROFILES[profile], 1, 1, False, backoff=0)
    out = capsys.readouterr().out
    assert "offline: preparing the sample corpus shipped in data/sample/ (4.2 MB of public-domain English text) " \
           "instead of tinystories; for real data run `uv run prepare.py --force` online, or add " \
           "`--source PATH --force` for local text\n" in out
    meta = json.loads((cache / "prepared.json").read_text())
    assert (meta["dataset"], meta["source"], meta["profile"], meta["eval_tokens"]) == \
        ("sample", str(REPO / "data" / "sample"), profile, 65536)
    assert meta["train_docs"] + meta["val_docs"] + meta["holdout_docs"] == documents and meta["val_docs"] > 0
    capped = "Sample corpus: its val split is too small for EVAL_TOKENS=1048576 of profile 'small': it scores 65536"
    assert (capped in out) == (profile == "small")

    assert P.main(["--check"]) == 0
    assert f"ready: sample data in {cache}\nprofile: {profile}\n" in capsys.readouterr().out
    assert P.main(["--frozen-inputs"]) == 0
    inputs = json.loads(capsys.readouterr().out)
    assert str(REPO / "data" / "sample") in inputs["evaluator_only"] and inputs["evaluator_only_in_target"] == \
        ["data/sample"]             # committed with the target: left out of every run dir (tests/test_search.py)

    def no_network(*args, **kwargs):
        raise AssertionError("a prepared sample is re-used without a download")
    monkeypatch.setattr(P, "download_file", no_network)
    assert P.main(["--profile", profile]) == 0
    assert f"Already prepared: sample data with profile {profile!r} in {cache} (--force to redo)" in \
        capsys.readouterr().out


def test_the_lab_profile_prepares_the_shipped_sample_with_its_own_budget(tmp_path, monkeypatch, capsys):
    """`prepare.py --profile lab` never downloads: the sample in data/sample, whatever the network, so that the lab's
    recorded table holds anywhere; its train shards mix the two books finely (TRAIN_ROW_GROUP documents per row
    group, which the seeded order shuffles); its budget is its own 60 s, which the variable overrides as usual."""
    def no_network(*args, **kwargs):
        raise AssertionError("the lab profile downloads nothing")
    monkeypatch.setattr(P, "download_file", no_network)
    monkeypatch.setenv("AUTORESEARCH_CACHE", str(tmp_path / "cache"))
    assert P.main(["--profile", "lab"]) == 0
    meta = json.loads((tmp_path / "cache" / "prepared.json").read_text())
    assert (meta["dataset"], meta["source"], meta["profile"], meta["max_seq_len"], meta["vocab_size"],
            meta["eval_tokens"]) == ("sample", str(REPO / "data" / "sample"), "lab", 128, 512, 65536)
    [shard] = (tmp_path / "cache" / "data" / "sample").glob("shard_*.parquet")
    groups = pq.ParquetFile(shard).metadata
    assert groups.num_row_groups == -(-meta["train_docs"] // 64) and groups.row_group(0).num_rows == 64
    monkeypatch.delenv(P.TIME_BUDGET_ENV, raising=False)
    assert P.time_budget("lab") == (60.0, False) and P.time_budget("cpu") == (300.0, False)
    monkeypatch.setenv(P.TIME_BUDGET_ENV, "60")
    assert P.time_budget("lab") == (60.0, False) and P.time_budget("cpu") == (60.0, True)


def test_offline_default_profile_and_other_data_never_fall_back(offline, tmp_path, capsys):
    """The default profile (an H100's 21M eval tokens) stops offline with --source in the message; a cache holding
    other data is never replaced by the sample, not even with --force."""
    with pytest.raises(P.OfflineError, match=r"cannot reach 127\.0\.0\.1:\d+ \(offline\?\): prepare local text instead "
                       r"with --source PATH, e\.g\. `uv run prepare\.py --source data/sample --profile cpu`"):
        P.prepare("climbmix", None, P.PROFILES["default"], 1, 1, False, root=tmp_path / "h100", base_url=offline,
                  backoff=0)
    assert "sample" not in capsys.readouterr().out and not (tmp_path / "h100" / "prepared.json").exists()

    P.prepare("climbmix", str(CORPORA / "tinyshakespeare.txt"), TINY, 1, 1, False, root=tmp_path / "own")
    with pytest.raises(P.OfflineError, match="--source"):
        P.prepare("tinystories", None, P.PROFILES["cpu"], 1, 1, True, root=tmp_path / "own", backoff=0)
    kept = P.load_prepared(tmp_path / "own")
    assert (kept.dataset, kept.profile) == ("local", TINY) and "offline: preparing" not in capsys.readouterr().out


def test_climbmix_download_pins_the_val_and_holdout_shards(server, tmp_path):
    url, files, _ = server
    for name in ("shard_00000.parquet", "shard_00001.parquet", P.VAL_SHARD_NAME, P.HOLDOUT_SHARD_NAME):
        files[f"/{name}"] = parquet_bytes(40)
    P.download_climbmix(tmp_path, 2, 2, base_url=url, backoff=0)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["shard_00000.parquet", "shard_00001.parquet",
                                                          "shard_06541.parquet", "shard_06542.parquet"]
    prepared = P.Prepared(tmp_path, "climbmix", url, TINY, tmp_path, P.VAL_SHARD_NAME,
                          holdout_name=P.HOLDOUT_SHARD_NAME)
    assert [p.name for p in P.train_files(prepared)] == ["shard_00000.parquet", "shard_00001.parquet"]


def test_disk_full_names_the_fix(tmp_path, monkeypatch, capsys):
    def no_space(*args, **kwargs):
        raise OSError(errno.ENOSPC, "No space left on device", str(tmp_path / "data" / "shard_00000.parquet"))
    monkeypatch.setenv("AUTORESEARCH_CACHE", str(tmp_path))
    monkeypatch.setattr(P, "_write_shards", no_space)
    assert P.main(["--source", str(CORPORA / "tinyshakespeare.txt"), "--profile", "cpu"]) == 1
    err = capsys.readouterr().err
    assert "disk full while writing" in err and "AUTORESEARCH_CACHE" in err
    assert not (tmp_path / "prepared.json").exists()


def test_failed_force_leaves_the_previous_cache_usable(tmp_path):
    good = P.prepare("climbmix", str(CORPORA / "tinyshakespeare.txt"), TINY, 1, 1, False, root=tmp_path)
    before = (good.tokenizer_dir / "tokenizer.pkl").read_bytes()
    bad = tmp_path / "latin1.txt"
    bad.write_bytes("café naïve déjà vu ".encode("latin-1") * 50)
    with pytest.raises(P.PrepareError, match="not UTF-8"):
        P.prepare("climbmix", str(bad), P.PROFILES["cpu"], 1, 1, True, root=tmp_path)
    # a profile the text cannot support fails after the tokenizer step: still nothing replaced
    with pytest.raises(P.PrepareError, match="validation split is smaller"):
        P.prepare("climbmix", str(CORPORA / "tinyshakespeare.txt"), P.PROFILES["cpu"], 1, 1, True, root=tmp_path)
    after = P.load_prepared(tmp_path)
    assert after.profile == TINY and (after.tokenizer_dir / "tokenizer.pkl").read_bytes() == before
    assert sorted(p.name for p in (tmp_path / "data").iterdir()) == ["local"]  # no staging left behind
    assert not (tmp_path / "tokenizer.new").exists()


def test_binary_file_is_not_text(tmp_path):
    f = tmp_path / "program.txt"
    f.write_bytes(b"\x7fELF\x02\x01\x01" + bytes(4000) + b"some strings inside")
    with pytest.raises(P.PrepareError, match="NUL bytes: this is not UTF-8 text. A binary file: remove it"):
        P.read_source_file(f, 4000)


def test_without_profile_and_dataset_the_device_class_chooses(tmp_path, monkeypatch, capsys):
    """No --profile: this machine's device class picks it (cpu here: no CUDA, no MPS), and with it the dataset
    (tinystories for small and cpu, climbmix for default), as a fresh machine's agent.py run relies on."""
    monkeypatch.setenv("AUTORESEARCH_CACHE", str(tmp_path))
    seen = {}
    monkeypatch.setattr(P, "prepare", lambda dataset, source, profile, *rest: seen.update(
        dataset=dataset, source=source, profile=profile.name))
    assert P.main([]) == 0 and seen == {"dataset": "tinystories", "source": None, "profile": "cpu"}
    assert "Profile: cpu (this machine's device is cpu; --profile to choose another)" in capsys.readouterr().out
    assert P.main(["--profile", "default"]) == 0 and seen["dataset"] == "climbmix"
    assert P.main(["--source", str(CORPORA)]) == 0 and seen == {"dataset": "tinystories", "source": str(CORPORA),
                                                                  "profile": "cpu"}
