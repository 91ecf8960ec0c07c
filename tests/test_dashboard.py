"""The dashboard (harness/record/dashboard.py, `report.py --html`): a planted run in a real git repository, its page opened in
a real headless browser (Debian's chromium; CI installs it), and the inputs the issue names as bad."""

import json
import os
import re
import shutil
import subprocess
import time
import types

import pytest

import report
from harness.judge import curves
from harness.record import dashboard, pagedata
from helpers import in_ci, page_data

TAG = "dash"
PLANTED = '<script>document.title="pwned";document.body.setAttribute("data-pwned","1")</script> lr up'
BREAKOUT = ('</table></script><img src=x onerror="document.body.setAttribute(\'data-pwned\',\'2\')"> "quoted" '
            '\x1b[31mred\x07')
DIFF_LINE = "# </script><script>document.body.setAttribute('data-pwned','3')</script>"


def git(repo, *args):
    return subprocess.run(["git", *args], cwd=repo, check=True, capture_output=True, text=True).stdout.strip()


def curve_of(losses):
    """A Curve whose loss at progress p = (k + 1) / len(losses) is losses[k]."""
    return curves.Curve(curves.Point((k + 1) / len(losses), loss, 1.0, 1000.0) for k, loss in enumerate(losses))


def planted_run(tmp_path):
    """A target in a git repository: the baseline (3 runs with curves), a keep whose diff raises LR, a discard with the
    planted description and a `</script>` line in its diff, a crash with a log tail. Returns the target folder."""
    repo = tmp_path / "repo"
    repo.mkdir()
    git(repo, "init", "-q", "-b", "main")
    git(repo, "config", "user.email", "t@example.com")
    git(repo, "config", "user.name", "t")
    train = repo / "train.py"
    sources = ["LR = 0.01\nDEPTH = 4\n", "LR = 0.02\nDEPTH = 4\n", f"LR = 0.02\nDEPTH = 4\n{DIFF_LINE}\n",
               "LR = 0.02\nDEPTH = 8\n"]
    shas = []
    for k, source in enumerate(sources):
        train.write_text(source)
        git(repo, "add", "train.py")
        git(repo, "commit", "-qm", f"c{k}")
        shas.append(git(repo, "rev-parse", "HEAD"))
        if k == 1:
            keep = shas[-1]
        if k >= 1:
            git(repo, "reset", "-q", "--hard", keep)        # each candidate is built on the best
    logs = tmp_path / "logs"
    logs.mkdir()
    metric = {0: 1.0, 1: 0.98, 2: 0.99, 3: None}
    status = {0: "keep", 1: "keep", 2: "discard", 3: "crash"}
    ideas = {0: "baseline", 1: "raise LR to 0.02", 2: PLANTED, 3: BREAKOUT}
    rows, events = ["commit\tval_bpb\tmemory_gb\tstatus\tdescription"], []
    for n in range(4):
        base = None if n == 0 else shas[0] if n == 1 else keep
        runs = {0: [1.0, 1.01, 0.99], 1: [0.98, 0.981], 2: [0.99], 3: []}[n]
        for r, m in enumerate(runs):
            log = logs / f"{n:04d}-0-r{r}.log"
            log.write_text("")
            curves.save(curve_of([3.0 - 0.2 * k - 0.01 * r - 0.05 * (n == 1) for k in range(10)]), log)
            events.append({"event": "run_end", "tag": TAG, "n": n, "run": r, "commit": shas[n][:7], "metric": m,
                           "log": str(log), "log_tail": ""})
        if n == 3:
            events.append({"event": "run_end", "tag": TAG, "n": 3, "run": 0, "commit": shas[3][:7], "metric": None,
                           "log": str(logs / "0003-0.log"), "log_tail": "Traceback\nRuntimeError: <b>oom</b>\x1b[0m"})
        events.append({"event": "experiment", "tag": TAG, "n": n, "commit": shas[n][:7], "full_commit": shas[n],
                       "status": status[n], "metric": metric[n] or 0.0, "memory_gb": 1.0, "description": ideas[n],
                       "base": base, "base_metric": None if n == 0 else 1.0 if n == 1 else 0.98, "runs": runs or None,
                       "noise_sd": 0.01 if n == 0 else None, "wall_seconds": 30.0 + n, "proposer": "anthropic",
                       "input_tokens": 1000, "output_tokens": 100, "cost_usd": 0.01, "confirm": 3, "margin": None,
                       "verdict": "margin", "false_keep": None} | ({"reason": "out of memory"} if n == 3 else {}))
        rows.append(f"{shas[n][:7]}\t{metric[n] or 0.0:.6f}\t1.0\t{status[n]}\t{ideas[n]}")
    (repo / "results.tsv").write_text("\n".join(rows) + "\n")
    (repo / "events.jsonl").write_text("".join(json.dumps(e) + "\n" for e in events))
    return repo


def chromium():
    """The headless browser's path; skips without one (fails in CI, which installs it)."""
    found = shutil.which("chromium") or shutil.which("chromium-browser")
    if found is None:
        if in_ci():
            pytest.fail("chromium missing in CI (.ci/run installs it: apt-get install -y chromium)")
        pytest.skip("no chromium here: apt-get install -y chromium")
    return found


def browse(page, fragment="", tmp_path=None):
    """The page's DOM after its scripts ran, as a real headless chromium serialises it."""
    profile = tmp_path / "chromium-profile"
    done = subprocess.run([chromium(), "--headless", "--no-sandbox", "--disable-gpu", "--no-first-run",
                           f"--user-data-dir={profile}", "--virtual-time-budget=5000", "--dump-dom",
                           f"file://{page}{fragment}"], capture_output=True, text=True, timeout=120,
                          env={**os.environ, "HOME": str(tmp_path)})
    assert done.returncode == 0, done.stderr[-2000:]
    return done.stdout


def test_page_in_a_real_browser_shows_table_curve_and_diff_and_runs_no_planted_script(tmp_path):
    target = planted_run(tmp_path)
    assert report.main([str(target), "--html"]) == 0
    page = target / dashboard.PAGE
    source = page.read_text()
    assert "<script>document" not in source and "</table></script>" not in source   # nothing planted, verbatim
    dom = browse(page, "#n=2", tmp_path)
    assert "pwned" not in re.search(r"<title>(.*?)</title>", dom).group(1)
    assert "data-pwned" not in dom.split("<body", 1)[1].split(">", 1)[0]        # no planted script ran
    assert "<img src=\"x\"" not in dom                                          # nor became an element
    body = re.search(r'<tbody id="rows">(.*?)</tbody>', dom, re.S).group(1)
    assert body.count('<tr class="row') == 4
    assert "&lt;script&gt;document.title=\"pwned\"" in body                     # shown as text
    assert "&lt;/table&gt;&lt;/script&gt;&lt;img src=x" in body
    assert "\u241b[31mred\u2407" in body                                        # control characters made visible
    assert re.search(r"<td[^>]*>0\.980000</td>", body)                          # the keep's metric ...
    assert re.search(r"<td[^>]*>-0\.020000</td>", body)                         # ... and its delta vs its base
    detail = re.search(r'<div id="detail">(.*?)</div>', dom, re.S).group(1)
    assert "#2 discard" in detail
    assert len(re.findall(r'<polyline[^>]*class="own"', detail)) == 1           # its run's curve
    assert re.search(r'<polyline[^>]*class="best"', detail)                    # over the best's
    assert re.search(r'<polygon[^>]*class="band"', detail)                     # and the baseline band
    assert '<span class="add">+# &lt;/script&gt;&lt;script&gt;' in detail      # the diff, as text
    kept = re.search(r'<ol id="kept">(.*?)</ol>', dom, re.S).group(1)
    assert kept.count("<li>") == 2 and "raise LR to 0.02" in kept
    assert "<th>judged by</th>" in dom and re.search(r"<td[^>]*>margin 0\.020000</td>", body)   # the margin rule's
    crash = browse(page, "#n=3", tmp_path)
    assert "RuntimeError: &lt;b&gt;oom&lt;/b&gt;\u241b[0m" in crash              # the log tail, as text


def test_gathered_figures_match_the_run(tmp_path):
    target = planted_run(tmp_path)
    data = dashboard.gather(report.load_run(target))
    rows = {r["n"]: r for r in data["rows"]}
    assert rows[1]["delta"] == pytest.approx(-0.02) and rows[1]["runs"] == [0.98, 0.981]
    assert rows[2]["delta"] == pytest.approx(0.01) and rows[3]["metric"] is None
    assert rows[1]["wall"] == 31.0 and rows[1]["by"] == "anthropic"
    assert data["noise"] == {"sd": 0.01, "runs": 3}
    assert data["confidence"] == 2.0                                            # gain 0.02 / sd 0.01
    assert data["margins"] == {1: pytest.approx(0.02)}                         # 2 x noise sd, hardware epoch 1
    assert data["spend"]["input_tokens"] == 4000 and data["spend"]["cost_usd"] == 0.04
    assert "+LR = 0.02" in data["diffs"][rows[1]["commit"]] and "-LR = 0.01" in data["diffs"][rows[1]["commit"]]
    band = data["curves"][data["baselines"][1]]["mean"]
    p = dict((q[0], q[1:]) for q in band)[0.5]                                 # progress 0.5 = point 5: 3.0 - 0.8
    assert p[0] == pytest.approx(2.2 - 0.01) and p[1] == pytest.approx(0.01)    # runs r=0,1,2: -0, -0.01, -0.02


def test_renders_what_it_has_without_events_with_torn_lines_and_other_tags(tmp_path):
    target = planted_run(tmp_path)
    (target / "events.jsonl").unlink()
    with open(target / "results.tsv", "a") as f:
        f.write("abc1234\t0.97")                                              # a torn last line
    assert report.main([str(target), "--html", str(tmp_path / "no-events.html")]) == 0
    data = page_data(tmp_path / "no-events.html")
    assert len(data["rows"]) == 4 and data["skipped"] == 1 and data["diffs"] == {} and data["curves"] == {}
    assert data["rows"][1]["delta"] is None and data["noise"] is None


def test_write_is_atomic_and_a_failure_keeps_the_old_page(tmp_path, monkeypatch):
    target = planted_run(tmp_path)
    page = target / dashboard.PAGE
    page.write_text("the old page")

    def broken(data, png=None):
        raise RuntimeError("render failed")
    monkeypatch.setattr(dashboard, "render", broken)
    with pytest.raises(RuntimeError):
        dashboard.write(report.load_run(target), page)
    assert page.read_text() == "the old page" and sorted(p.name for p in target.iterdir() if p.name.startswith("."))\
        == [".git"]
    monkeypatch.undo()
    dashboard.write_atomic(page, "new")
    assert page.read_text() == "new" and not list(target.glob(".dashboard.html.*"))


def test_the_plot_is_drawn_again_only_when_what_it_shows_changed(tmp_path, monkeypatch):
    """The page at the loop's stop shows the verdict's plot: one draw, the same bytes; a new row draws again."""
    from harness.record import plots
    target, drawn = planted_run(tmp_path), []
    draw = plots.plot_progress
    monkeypatch.setattr(plots, "plot_progress", lambda rows, *a, **k: drawn.append(len(rows)) or draw(rows, *a, **k))
    monkeypatch.setattr(dashboard, "_DRAWN", [None, None])
    page = target / dashboard.PAGE

    def image():
        return re.search(r'id="progress" alt="progress plot" src="data:image/png;base64,([^"]+)"', page.read_text()).group(1)
    dashboard.write(report.load_run(target), page, live=True)
    first = image()
    dashboard.write(report.load_run(target), page, live=False)
    assert drawn == [4] and image() == first
    with open(target / "results.tsv", "a") as f:
        f.write("abcdef1\t0.970000\t1.0\tkeep\ta fifth row\n")
    dashboard.write(report.load_run(target), page)
    assert drawn == [4, 5] and image() != first


def test_json_in_the_page_cannot_close_its_script_element():
    raw = dashboard.json_for_script({"x": "</script><script>alert(1)</script>\u2028&"})
    assert "<" not in raw and ">" not in raw and "&" not in raw and "\u2028" not in raw
    assert json.loads(raw) == {"x": "</script><script>alert(1)</script>\u2028&"}


def test_csp_allows_only_the_page_script(tmp_path):
    target = planted_run(tmp_path)
    source = dashboard.write(report.load_run(target), tmp_path / "p.html").read_text()
    policy = re.search(r'http-equiv="Content-Security-Policy" content="([^"]+)"', source).group(1)
    assert "default-src 'none'" in policy and "'unsafe-inline'" not in policy.split("script-src")[1].split(";")[0]
    scripts = re.findall(r"<script>(.*?)</script>", source, re.S)
    assert scripts == [dashboard.SCRIPT]


def test_the_loop_writes_a_live_page_that_stops_reloading_when_stale(tmp_path):
    target = planted_run(tmp_path)
    s = types.SimpleNamespace(tag=types.SimpleNamespace(target=target), settings=types.SimpleNamespace(tag=TAG),
                              dashboard_warned=False)
    dashboard.refresh(s, live=True, timeout_s=60.0)
    data = page_data(target / dashboard.PAGE)
    assert data["live"] and data["stale_s"] == 720.0 and data["reload_s"] == pagedata.RELOAD_S
    assert len(data["rows"]) == 4
    dom = browse(target / dashboard.PAGE, "", tmp_path)
    assert "live: written " in dom and "reloads every 30 s" in dom
    old = (target / dashboard.PAGE).read_text().replace(f'"written":{data["written"]}', '"written":1000')
    (target / dashboard.PAGE).write_text(old)
    assert "no update since " in browse(target / dashboard.PAGE, "", tmp_path)       # the loop was killed
    dashboard.refresh(s, live=False)
    assert not page_data(target / dashboard.PAGE)["live"]
    (target / "results.tsv").write_text("not a results file\n")                   # a failure is one warning
    dashboard.refresh(s, live=True)
    assert s.dashboard_warned and not page_data(target / dashboard.PAGE)["live"]     # the last good page stays


def test_what_a_hostile_review_broke_now_renders(tmp_path):
    """Each of these stopped report.py or froze the page once: a matplotlib math string in a kept description, a
    metric far beyond any axis, bidi controls in a diff, a commit named like a JS prototype property, labels only
    the harness may write, a symlink planted at the temporary file's old name."""
    target = planted_run(tmp_path)
    lines = (target / "results.tsv").read_text().splitlines()
    lines[2] = lines[2].replace("raise LR to 0.02", r"lr $\foo$ warmup")             # the keep's label
    lines.append("constructor\t-1.79e308\t1.0\tdiscard\tdiverged \u202eevil\u202c")
    (target / "results.tsv").write_text("\n".join(lines) + "\n")
    assert report.main([str(target), "--html"]) == 0
    data = page_data(target / dashboard.PAGE)
    assert "progress plot not drawn" not in " ".join(data["lines"]) and 'id="progress"' in (
        target / dashboard.PAGE).read_text()
    assert data["rows"][-1]["idea"] == "diverged <U+202E>evil<U+202C>" and data["rows"][-1]["metric"] == -1.79e308
    assert r"lr $\foo$ warmup" in data["rows"][1]["idea"]
    dom = browse(target / dashboard.PAGE, "#n=4", tmp_path)
    assert "#4 discard constructor" in dom and "no learning curve" in dom                  # not Object's constructor
    from harness.propose.edits import clean_description
    assert clean_description("[budget 1s] [hw9][budget 2s] idea") == "idea" and clean_description("a [hw2]") == "a [hw2]"
    victim = tmp_path / "victim"
    victim.write_text("precious")
    for pid in range(os.getpid() - 2, os.getpid() + 3):
        (target / f".{dashboard.PAGE}.{pid}.tmp").symlink_to(victim)
    dashboard.write_atomic(target / dashboard.PAGE, "page")
    assert victim.read_text() == "precious" and (target / dashboard.PAGE).read_text() == "page"
    assert report.main([str(target), "--html", str(tmp_path / "no" / "such" / "dir.html")]) == 2


def test_a_curve_of_too_few_points_is_said_not_drawn_and_the_paired_verdict_shows_its_numbers(tmp_path):
    """Every run printed one progress line: the detail says so instead of an empty box with a legend for lines that
    are not there; a paired verdict's row shows its gain and t in the table (not the margin rule's column)."""
    target = planted_run(tmp_path)
    for log in (tmp_path / "logs").glob("*.log"):
        if curves.load(log) is not None:
            curves.save(curve_of([3.0]), log)
    lines = (target / "events.jsonl").read_text().splitlines()
    for k, line in enumerate(lines):
        e = json.loads(line)
        if e.get("event") == "experiment" and e["n"] == 2:
            lines[k] = json.dumps({**e, "gain": -0.01, "t": -1.5, "best_runs": [0.98], "verdict": "paired"})
    (target / "events.jsonl").write_text("\n".join(lines) + "\n")
    assert report.main([str(target), "--html"]) == 0
    dom = browse(target / dashboard.PAGE, "#n=2", tmp_path)
    detail = re.search(r'<div id="detail">(.*?)</div>', dom, re.S).group(1)
    assert "too few progress points to draw a learning curve" in detail and "<svg" not in detail
    body = re.search(r'<tbody id="rows">(.*?)</tbody>', dom, re.S).group(1)
    assert re.search(r"<td[^>]*>-0\.010000, t -1\.5</td>", body)


def _until(condition, timeout=10.0):
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline
        time.sleep(0.01)


def test_the_live_page_is_rewritten_in_the_background_a_gap_after_a_verdict(monkeypatch):
    """A request is written a gap later, the requests in between as one (the latest's words); stop() cancels a
    rewrite not begun and waits for one under way."""
    calls, slow = [], [0.0]

    def refresh(s, **kw):
        calls.append((time.monotonic(), s, kw))
        time.sleep(slow[0])
        calls.append("done")
    monkeypatch.setattr(dashboard, "refresh", refresh)
    pacer, t0 = dashboard.Pacer("session", gap_s=0.5), time.monotonic()
    for timeout_s in range(1, 5):
        pacer.request(live=True, timeout_s=timeout_s)
    _until(lambda: len(calls) == 2)
    assert calls[0][0] - t0 >= 0.5 and calls[0][1:] == ("session", {"live": True, "timeout_s": 4})
    time.sleep(0.7)
    assert len(calls) == 2                                     # nothing asked, nothing written
    pacer.request(live=True, timeout_s=5)
    t1 = time.monotonic()
    _until(lambda: len(calls) == 4)
    assert calls[2][0] - t1 >= 0.45 and calls[2][2] == {"live": True, "timeout_s": 5}
    pacer.request(live=True, timeout_s=6)                      # pending, then cancelled
    pacer.stop()
    time.sleep(0.7)
    assert len(calls) == 4
    slow[0] = 0.5
    pacer.request(live=True, timeout_s=7)
    _until(lambda: len(calls) == 5)                            # under way
    pacer.stop()                                               # waits for it
    assert calls[-1] == "done" and len(calls) == 6
