"""
HARNESS: the dashboard: a tag as one self-contained HTML page (dashboard.html next to results.tsv), written by
`report.py --html` and rewritten by the loop PAGE_GAP_S after its verdicts (Pacer, in the background) and at its
stop. No server and nothing fetched: the data is a JSON block in the page, the progress plot a data: URI, the script
inline and the only one the page's Content-Security-Policy lets run (by its sha256), so a description, diff or log
line that holds `<script>` is shown as text and never runs. While the loop is alive the page reloads itself every
RELOAD_S seconds (keeping the page of the table and the experiment open in the address's #fragment), and stops
reloading once it is older than its `stale_s`.

The numbers come from harness.record.analysis and the plot from harness.record.plots (the same as report.py's text and
analysis.ipynb), the page's data from harness.record.pagedata (gather); this module renders it and writes the page.
"""

import base64
import hashlib
import html
import io
import json
import threading

from harness import console
from harness.record import analysis
from harness.record.pagedata import RELOAD_S, gather, text
from harness.files import write_atomic

PAGE = "dashboard.html"


# ---------------------------------------------------------------------------
# Rendering
# ---------------------------------------------------------------------------

STYLE = """
body{font:14px/1.4 system-ui,sans-serif;margin:1.2em;color:#222;background:#fafafa}
h1{font-size:1.3em;margin:0 0 .3em} h2{font-size:1.1em;margin:1.2em 0 .4em}
pre{white-space:pre-wrap;word-break:break-word;background:#fff;border:1px solid #ddd;padding:.6em;margin:.3em 0}
.state{color:#555} .live{color:#0a0} .stale{color:#b60}
table{border-collapse:collapse;width:100%;background:#fff} th,td{border-bottom:1px solid #e4e4e4;padding:3px 6px;
text-align:left;vertical-align:top} th{background:#f0f0f0;position:sticky;top:0} td.num{text-align:right;
font-variant-numeric:tabular-nums} tr.row{cursor:pointer} tr.row:hover{background:#eef5ff} tr.open{background:#dde9ff}
.keep{color:#080;font-weight:600} .discard{color:#666} .crash{color:#c00} .better{color:#080} .worse{color:#a40}
.idea{max-width:46em;overflow-wrap:anywhere} .controls{margin:.5em 0} .controls *{margin-right:.6em}
#detail{background:#fff;border:1px solid #bbb;padding:.6em;margin:.6em 0}
.add{color:#060;background:#efe} .del{color:#900;background:#fee} .hunk{color:#05a} .diff span{display:block}
img{max-width:100%;border:1px solid #ddd;background:#fff} .muted{color:#777}
"""

SCRIPT = r"""
"use strict";
const D = JSON.parse(document.getElementById("data").textContent);
const PER_PAGE = 100;
const $ = (id) => document.getElementById(id);
function el(tag, text, cls) {
  const e = document.createElement(tag);
  if (text !== undefined && text !== null) e.textContent = String(text);
  if (cls) e.className = cls;
  return e;
}
function mine(table, key) { return Object.hasOwn(table, key) ? table[key] : undefined; }   // never a prototype's
function fmt(x, d) { return x === null || x === undefined ? "-" : Number(x).toFixed(d === undefined ? 6 : d); }
function signed(x) { return x === null || x === undefined ? "-" : (x > 0 ? "+" : "") + Number(x).toFixed(6); }
function state() {
  const h = new URLSearchParams(location.hash.slice(1));
  return {page: Number(h.get("page") || 1), n: h.has("n") ? Number(h.get("n")) : null,
          status: h.get("status") || "", q: h.get("q") || ""};
}
function setState(s) {
  const h = new URLSearchParams();
  if (s.page > 1) h.set("page", s.page);
  if (s.n !== null) h.set("n", s.n);
  if (s.status) h.set("status", s.status);
  if (s.q) h.set("q", s.q);
  history.replaceState(null, "", "#" + h.toString());
  render();
}
function header() {
  $("title").textContent = "autoresearch: " + D.title;
  const age = Date.now() / 1000 - D.written;
  const st = $("state");
  if (D.live && age < D.stale_s) {
    st.textContent = "live: written " + D.written_text + ", reloads every " + D.reload_s + " s";
    st.className = "state live";
    setTimeout(() => location.reload(), D.reload_s * 1000);
  } else if (D.live) {
    st.textContent = "no update since " + D.written_text + ": the loop may have stopped";
    st.className = "state stale";
  } else {
    st.textContent = "written " + D.written_text + " (not live)";
  }
  $("summary").textContent = D.summary;
  const facts = $("facts");
  const add = (k, v) => {
    if (v) { const li = el("li"); li.append(el("b", k + ": "), el("span", v)); facts.append(li); }
  };
  if (D.noise) add("noise floor", "sd " + fmt(D.noise.sd) + " over " + D.noise.runs + " baseline runs (seeds)"
      + (D.confidence !== null ? "; best gain = " + fmt(D.confidence, 1) + " noise sd" : ""));
  add("verdict", D.rule);
  for (const t of D.throughput) add("throughput", t);
  if (D.spend) add("LLM", D.spend.input_tokens.toLocaleString() + " tokens in, "
      + D.spend.output_tokens.toLocaleString() + " out, cost $" + fmt(D.spend.cost_usd, 2));
  if (D.spend) add("time", D.spend.time);
  add("holdout", D.holdout || "not measured yet (at the loop's stop, or `uv run report.py --holdout`)");
  for (const t of D.lines) add("note", t);
  for (const t of D.notes) add("note", t);
  if (D.skipped) add("note", D.skipped + " malformed line(s) of results.tsv left out");
  const kept = $("kept");
  for (const k of D.kept) {
    const li = el("li");
    const figures = " " + fmt(k.metric) + " " + (k.gain === null ? "" : signed(k.gain)) + " ";
    li.append(el("code", k.commit), el("span", figures), el("span", k.description));
    kept.append(li);
  }
  if (!D.kept.length) kept.append(el("li", "none yet"));
}
function matching(s) {
  const q = s.q.toLowerCase();
  return D.rows.filter(r => (!s.status || r.status === s.status) &&
                            (!q || r.idea.toLowerCase().includes(q) || r.commit.includes(q)));
}
function render() {
  const s = state();
  const rows = matching(s);
  const pages = Math.max(1, Math.ceil(rows.length / PER_PAGE));
  const page = Math.min(Math.max(1, s.page), pages);
  $("status").value = s.status;
  if (document.activeElement !== $("q")) $("q").value = s.q;
  $("pageinfo").textContent = "page " + page + " of " + pages + " (" + rows.length + " of " + D.rows.length
      + " experiments)";
  $("prev").disabled = page <= 1;
  $("next").disabled = page >= pages;
  const body = $("rows");
  body.replaceChildren();
  const shown = rows.slice().reverse().slice((page - 1) * PER_PAGE, page * PER_PAGE);   // newest first
  for (const r of shown) {
    const tr = el("tr", null, "row" + (s.n === r.i ? " open" : ""));
    tr.dataset.i = r.i;
    const better = r.delta === null ? "" : ((D.goal === "min") === (r.delta < 0) ? "better" : "worse");
    const shownStatus = r.status + (r.cancelled ? " (cancelled)" : "") + (r.smoke ? " smoke" : "")
                        + (D.epochs > 1 ? " hw" + r.epoch : "");
    const cells = [[r.n, "num"], [shownStatus, r.status],
                   [fmt(r.metric), "num"], [signed(r.delta), "num " + better],
                   [r.runs.length ? r.runs.length : "-", "num"], [judgedBy(r), "num"],
                   [r.wall === null ? "-" : fmt(r.wall, 0) + " s", "num"], [r.by || "-", ""], [r.idea, "idea"]];
    for (const [v, cls] of cells) tr.append(el("td", v, cls));
    tr.addEventListener("click", () => setState({...state(), n: state().n === r.i ? null : r.i}));
    body.append(tr);
  }
  detail(s.n === null ? null : D.rows[s.n]);
}
function judgedBy(r) {        // the verdict's own numbers: the paired gain and t, else the margin of its epoch
  if (r.gain !== null && r.gain !== undefined) return signed(r.gain) + (r.t === null ? "" : ", t " + fmt(r.t, 1));
  const m = mine(D.margins, r.epoch);
  return m === null || m === undefined ? "-" : "margin " + fmt(m);
}
function diffView(textValue) {
  const pre = el("pre", null, "diff");
  for (const line of textValue.split("\n")) {
    const cls = line.startsWith("@@") ? "hunk" : line.startsWith("+") && !line.startsWith("+++") ? "add"
              : line.startsWith("-") && !line.startsWith("---") ? "del" : "";
    pre.append(el("span", line === "" ? "\u00a0" : line, cls));
  }
  return pre;
}
const SVG = "http://www.w3.org/2000/svg";
function svg(tag, attrs) {
  const e = document.createElementNS(SVG, tag);
  for (const k in attrs) e.setAttribute(k, String(attrs[k]));
  return e;
}
function curveView(r) {
  const own = mine(D.curves, r.commit), best = mine(D.curves, r.base);
  const base = mine(D.curves, mine(D.baselines, r.epoch));          // the baseline of the row's hardware epoch
  if (!own && !best && !base) return el("p", "no learning curve: train.py printed no progress lines, or the run is "
                                        + "not among those whose curves the page carries", "muted");
  const most = Math.max(...[own, best, base].filter(c => c).flatMap(c => c.runs.map(run => run.length)));
  if (most < 2) return el("p", "too few progress points to draw a learning curve: each run printed at most one "
                          + "progress line", "muted");
  const W = 680, H = 280, L = 56, R = 12, T = 12, B = 34;
  const ys = [];
  for (const c of [own, best]) if (c) for (const run of c.runs) for (const p of run) if (p[0] >= 0.1) ys.push(p[1]);
  if (base) for (const p of base.mean) if (p[0] >= 0.1) ys.push(p[1] - p[2], p[1] + p[2]);
  ys.sort((a, b) => a - b);
  const lo = ys.length ? ys[Math.floor(ys.length * 0.02)] : 0, hi = ys.length ? ys[Math.ceil(ys.length * 0.98) - 1] : 1;
  const pad = (hi - lo) * 0.08 || 0.01;
  const y0 = lo - pad, y1 = hi + pad;
  const X = p => L + p * (W - L - R), Y = v => T + (1 - (v - y0) / (y1 - y0)) * (H - T - B);
  const g = svg("svg", {width: W, height: H, viewBox: "0 0 " + W + " " + H, id: "curve"});
  g.append(svg("rect", {x: L, y: T, width: W - L - R, height: H - T - B, fill: "#fff", stroke: "#ccc"}));
  const clip = svg("clipPath", {id: "plotarea"});                   // a line leaving the axes is cut, not flattened
  clip.append(svg("rect", {x: L, y: T, width: W - L - R, height: H - T - B}));
  g.append(clip);
  for (let k = 0; k <= 4; k++) {
    const v = y0 + (y1 - y0) * k / 4;
    const t = svg("text", {x: L - 4, y: Y(v) + 4, "text-anchor": "end", "font-size": 10});
    t.textContent = v.toFixed(3);
    g.append(t);
    const x = svg("text", {x: X(k / 4), y: H - B + 14, "text-anchor": "middle", "font-size": 10});
    x.textContent = (25 * k) + "%";
    g.append(x);
  }
  const xl = svg("text", {x: L + (W - L - R) / 2, y: H - 4, "text-anchor": "middle", "font-size": 11});
  xl.textContent = "progress of the time budget; y: train loss (smoothed, as train.py prints it)";
  g.append(xl);
  const line = (pts, attrs) => {
    if (!pts.length) return;
    if (pts.length === 1) {                                         // a run that printed one progress line
      g.append(svg("circle", {cx: X(pts[0][0]), cy: Y(pts[0][1]), r: 3, fill: attrs.stroke, class: attrs.class || "",
                              "clip-path": "url(#plotarea)"}));
      return;
    }
    g.append(svg("polyline", {points: pts.map(p => X(p[0]).toFixed(1) + "," + Y(p[1]).toFixed(1)).join(" "),
                              fill: "none", "clip-path": "url(#plotarea)", ...attrs}));
  };
  if (base && base.mean.length) {
    const upper = base.mean.map(p => [p[0], p[1] + p[2]]), lower = base.mean.map(p => [p[0], p[1] - p[2]]).reverse();
    const outline = upper.concat(lower).map(p => X(p[0]).toFixed(1) + "," + Y(p[1]).toFixed(1)).join(" ");
    g.append(svg("polygon", {points: outline, fill: "#999", "fill-opacity": 0.25, stroke: "none", class: "band",
                             "clip-path": "url(#plotarea)"}));
    line(base.mean, {stroke: "#777", "stroke-dasharray": "4 3", "stroke-width": 1});
  }
  if (best && r.base !== r.commit) line(best.mean, {stroke: "#2a2", "stroke-width": 2, class: "best"});
  if (own) for (const run of own.runs) line(run, {stroke: "#15c", "stroke-width": 1.5, class: "own"});
  const legend = [[own, "#15c", "this experiment's runs"], [best && r.base !== r.commit, "#2a2", "its base's runs (mean)"],
                  [base && base.mean.length, "#999", "baseline runs: mean +- 1 sd"]].filter(l => l[0]).map(l => l.slice(1));
  legend.forEach(([color, words], k) => {
    g.append(svg("rect", {x: W - R - 190, y: T + 6 + 14 * k, width: 10, height: 3, fill: color}));
    const t = svg("text", {x: W - R - 176, y: T + 11 + 14 * k, "font-size": 10});
    t.textContent = words;
    g.append(t);
  });
  return g;
}
function detail(r) {
  const box = $("detail");
  box.replaceChildren();
  box.hidden = r === null || r === undefined;
  if (box.hidden) return;
  box.append(el("h2", "#" + r.n + " " + r.status + " " + r.commit));
  box.append(el("p", r.idea, "idea"));
  const facts = [["metric", fmt(r.metric)], ["delta vs its base " + (r.base || "-"), signed(r.delta)],
                 ["runs", r.runs.length ? r.runs.map(m => fmt(m)).join(", ") : "-"],
                 ["the best's runs it was judged against (same seeds)",
                  r.best_runs.length ? r.best_runs.map(m => fmt(m)).join(", ") : null],
                 ["gain over them", r.gain === null ? null : signed(r.gain)], ["paired t", r.t],
                 ["the best re-run", r.remeasured ? r.remeasured + "x first: the machine's speed changed" : null],
                 ["reason", r.reason], ["wall", r.wall === null ? null : fmt(r.wall, 0) + " s"],
                 ["memory", r.memory_gb === null ? null : r.memory_gb + " GB"], ["tokens/s", r.tokens_per_sec],
                 ["LLM cost", r.cost === null ? null : "$" + fmt(r.cost, 4)], ["proposed by", r.by]];
  const ul = el("ul");
  for (const [k, v] of facts) if (v !== null && v !== undefined && v !== "" && v !== "-") {
    const li = el("li"); li.append(el("b", k + ": "), el("span", v)); ul.append(li);
  }
  box.append(ul);
  if (!r.detail) {
    box.append(el("p", "an older experiment: the page carries the diffs and curves of the latest ones and every keep; "
                  + "see `git show " + r.commit + "`", "muted"));
    return;
  }
  box.append(el("h2", "learning curve"));
  box.append(curveView(r));
  box.append(el("h2", "diff against its base"));
  const d = mine(D.diffs, r.commit);
  box.append(d === undefined ? el("p", "no diff: no event names its base", "muted")
             : d === "" ? el("p", "train.py unchanged from its base", "muted") : diffView(d));
  if (r.tail) { box.append(el("h2", "log tail")); box.append(el("pre", r.tail)); }
}
header();
$("status").addEventListener("change", e => setState({...state(), status: e.target.value, page: 1}));
$("q").addEventListener("input", e => setState({...state(), q: e.target.value, page: 1}));
$("prev").addEventListener("click", () => setState({...state(), page: state().page - 1}));
$("next").addEventListener("click", () => setState({...state(), page: state().page + 1}));
render();
"""

BODY = """<h1 id="title">autoresearch</h1>
<div id="state" class="state"></div>
<noscript><p>This page draws its table with its own inline script: allow JavaScript for this file.</p></noscript>
<pre id="summary"></pre>
<ul id="facts"></ul>
{img}
<h2>Experiments</h2>
<div class="controls"><select id="status"><option value="">all</option><option>keep</option><option>discard</option>
<option>crash</option></select><input id="q" placeholder="search ideas or commits" size="30">
<button id="prev">&larr; newer</button><button id="next">older &rarr;</button><span id="pageinfo"></span></div>
<div id="detail" hidden></div>
<table><thead><tr><th>n</th><th>status</th><th>{metric}</th><th>delta</th><th>runs</th><th>judged by</th><th>wall</th>
<th>proposed by</th><th>idea</th></tr></thead><tbody id="rows"></tbody></table>
<h2>Kept commits, in order</h2>
<ol id="kept"></ol>
"""


def json_for_script(data):
    """data as JSON that cannot end the <script> element holding it: <, >, & and the line separators escaped."""
    raw = json.dumps(data, ensure_ascii=False, allow_nan=False, separators=(",", ":"))
    for c, esc in (("<", "\\u003c"), (">", "\\u003e"), ("&", "\\u0026"), ("\u2028", "\\u2028"), ("\u2029", "\\u2029")):
        raw = raw.replace(c, esc)
    return raw


def render(data, png=None):
    """The page as a string: data (gather's) and the progress plot's PNG bytes (None: no plot)."""
    digest = base64.b64encode(hashlib.sha256(SCRIPT.encode()).digest()).decode()
    policy = f"default-src 'none'; script-src 'sha256-{digest}'; style-src 'unsafe-inline'; img-src data:"
    img = (f'<img id="progress" alt="progress plot" src="data:image/png;base64,{base64.b64encode(png).decode()}">'
           if png else "")
    return ("<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">\n"
            f'<meta http-equiv="Content-Security-Policy" content="{policy}">\n'
            f"<title>autoresearch: {html.escape(data['title'])}</title>\n<style>{STYLE}</style></head><body>\n"
            + BODY.format(img=img, metric=html.escape(data["metric"]))
            + f'<script type="application/json" id="data">{json_for_script(data)}</script>\n'
            + f"<script>{SCRIPT}</script>\n</body></html>\n")


def write(run, path, live=False, stale_s=3600.0):
    """Gather run's data, draw its progress plot and write the page at path atomically. Returns the Path."""
    data = gather(run, live=live, stale_s=stale_s)
    rows = [r for r in run.rows if not analysis.is_smoke(r)] or run.rows
    epochs = analysis.epochs_of(run, rows)                # the plot, as the summary: the latest hardware's rows
    try:
        png = progress_png(epochs[-1].rows, run.metric_name, run.goal, analysis.rule_of(run) if run.events else None,
                           run.title + (f" (hardware {epochs[-1].number})" if len(epochs) > 1 else ""))
    except Exception as e:  # noqa: BLE001  (numbers matplotlib cannot draw: the page without its plot)
        data["lines"].append(text(f"progress plot not drawn ({type(e).__name__}: {str(e)[:200]})"))
        png = None
    return write_atomic(path, render(data, png))


_DRAWN = [None, None]   # the last plot this process drew: [what it shows, its PNG bytes], replaced in one step


def progress_png(rows, metric_name, goal, rule, title):
    """The progress plot's PNG bytes (plots.plot_progress of these arguments), drawn again only when what it shows
    changed: the page written at the loop's stop shows the same plot as the last verdict's, and a draw is about 0.15 s
    of matplotlib on one core, which a test suite of short loops paid about a thousand times."""
    key = repr((rows, metric_name, goal, rule, title))      # dataclasses: their repr holds every field
    drawn_key, png = _DRAWN
    if drawn_key != key:
        from harness.record import plots  # matplotlib, loaded when a page is drawn
        buf = io.BytesIO()
        plots.plot_progress(rows, metric_name, goal, buf, rule=rule, title=title)
        png = buf.getvalue()
        _DRAWN[:] = [key, png]
    return png


def refresh(s, live=True, timeout_s=1800.0):
    """The loop's rewrite of <target>/dashboard.html after a verdict (live: the page reloads itself until it is
    older than twice timeout_s, a run's hard limit, plus ten minutes) and at its stop (live=False). A failure is one
    warning: the page is a view, never a reason to lose an experiment."""
    try:
        run = analysis.load_run(s.tag.target / "results.tsv", tag=s.settings.tag)
        write(run, s.tag.target / PAGE, live=live, stale_s=2 * timeout_s + 600)
    except Exception as e:  # noqa: BLE001  (a view: any failure is a warning)
        if not s.dashboard_warned:
            s.dashboard_warned = True
            console.say(f"warning: {PAGE} not written ({type(e).__name__}: {str(e)[:200]}); the loop goes on; "
                        "`uv run report.py --html` writes it by hand")


# A live page is rewritten this long after a verdict, the verdicts in between as one: it reloads itself only every
# RELOAD_S, and each rewrite reads the whole tag and draws its plot (0.1-0.2 s of one core, which a loop of quick
# experiments, or a test suite of short loops, paid at every verdict and again at the stop).
PAGE_GAP_S = RELOAD_S / 3


class Pacer:
    """The loop's live rewrites of one session's page, off its path: request() has refresh(s, live=True, ...) run in
    a background thread gap_s seconds later, unless one is pending already (it then writes the latest request's
    words, and reads the records as they are when it runs). stop() cancels a rewrite not begun and waits for one
    under way: the stop's own page comes after it, never before."""

    def __init__(self, s, gap_s=PAGE_GAP_S):
        self.s, self.gap_s = s, gap_s
        self.lock, self.writing = threading.Lock(), threading.Lock()
        self.timer, self.args = None, {}

    def request(self, **kw):
        """Ask for a rewrite with refresh's keywords kw (live, timeout_s)."""
        with self.lock:
            self.args = kw
            if self.timer is None:
                self.timer = threading.Timer(self.gap_s, self._write)
                self.timer.daemon = True
                self.timer.start()

    def _write(self):
        with self.writing:
            with self.lock:
                if self.timer is None:          # stopped meanwhile
                    return
                self.timer, kw = None, self.args
            refresh(self.s, **kw)

    def stop(self):
        """Cancel a pending rewrite and wait for one under way to finish."""
        with self.lock:
            if self.timer is not None:
                self.timer.cancel()
                self.timer = None
        with self.writing:
            pass
