#!/usr/bin/env bash
# GPU CHECK: run the CUDA paths once, end to end, on a machine with one or more NVIDIA GPUs and no internet, and
# print one table of what passed. Meant to take under 8 minutes. Nothing here changes your checkout: every file it
# writes goes to a scratch directory (the data cache included).
#
#     bash bench/gpu_check.sh                         # corpora from ../shared/data/corpora
#     bash bench/gpu_check.sh /path/to/corpora        # any folder of .txt/.jsonl/.parquet files
#
# Steps: the attention probe (Flash Attention 3 from the kernels hub, or why SDPA), a 60 s training with the
# summary (torch.compile, bf16, MFU from the datasheet peak) that saves the evaluation artifact (torch.export, with
# FA3 swapped for SDPA), the separate-process evaluation of that artifact and its gap to train.py's own number
# (against prepare.py's METRIC_TOLERANCE), the sandbox's confinement on the GPU (one device node, uid nobody, no
# capabilities), a 2-candidate agent.py run with the random proposer (hermetic runs, the
# sandbox when bubblewrap works, separate evaluation), Flash Attention 3 pinned at its start and loaded by its runs
# inside the sandbox (fa3-box: FAIL on a machine without network whose cache lacks it, with the agent's reason), and
# with 2+ GPUs `--devices 0,1` when agent.py has it.
#
# Profile: cpu. The shared corpora (~4 MB of text) hold ~120k validation tokens, fewer than the small (1M) or
# default (21M) profile scores; set PROFILE=small with a bigger corpus.
# Environment: PYTHON (default: `uv run python` where uv is on PATH, else python3), PROFILE (cpu),
# TRAIN_BUDGET (60), AGENT_BUDGET (10), GPU_CHECK_DIR (scratch dir, default a new temp dir), OUT (logs; default
# the scratch dir).
set -u
ROOT="$(cd "$(dirname "$0")/.." && pwd)"
CORPORA="$(cd "${1:-$ROOT/../shared/data/corpora}" && pwd)" || { echo "no corpora folder: pass one as the first argument"; exit 2; }
WORK="${GPU_CHECK_DIR:-$(mktemp -d /tmp/gpu_check.XXXXXX)}"
LOGS="${OUT:-$WORK}"
PROFILE="${PROFILE:-cpu}"
TRAIN_BUDGET="${TRAIN_BUDGET:-60}"
AGENT_BUDGET="${AGENT_BUDGET:-10}"
if [ -n "${PYTHON:-}" ]; then read -r -a PY <<<"$PYTHON"
elif command -v uv >/dev/null 2>&1; then PY=(uv run --quiet --project "$ROOT" python)
else PY=(python3); fi
export AUTORESEARCH_CACHE="$WORK/cache" PYTHONUNBUFFERED=1
unset AUTORESEARCH_TIME_BUDGET AUTORESEARCH_ARTIFACT
mkdir -p "$WORK" "$LOGS"
ROWS=()
row() { ROWS+=("$(printf '%-10s %-5s %s' "$1" "$2" "$3")"); echo "== $1: $2 $3"; }
summary() { sed -n "s/^$1:[[:space:]]*//p" "$2" | tail -1; }   # a key of train.py's summary block
t0=$(date +%s)

echo "== scratch: $WORK   logs: $LOGS   python: ${PY[*]}   corpora: $CORPORA"
if command -v nvidia-smi >/dev/null 2>&1; then nvidia-smi --query-gpu=index,name,memory.total,driver_version --format=csv,noheader; fi
NGPU=$("${PY[@]}" -c "import torch; print(torch.cuda.device_count())" 2>"$LOGS/torch.log")
if [ -z "$NGPU" ] || [ "$NGPU" = 0 ]; then
    row gpus FAIL "torch sees no CUDA device ($(tail -1 "$LOGS/torch.log"))"
else
    row gpus ok "$NGPU x $("${PY[@]}" -c "import torch; print(torch.cuda.get_device_name(0), 'torch', torch.__version__)")"
fi

# 1. data: the frozen prepare.py, offline, from local text
if timeout 150 "${PY[@]}" "$ROOT/prepare.py" --source "$CORPORA" --profile "$PROFILE" >"$LOGS/prepare.log" 2>&1; then
    row prepare ok "profile $PROFILE in $AUTORESEARCH_CACHE"
else
    row prepare FAIL "see $LOGS/prepare.log: $(tail -1 "$LOGS/prepare.log")"
fi

# 2-3. a plain training run in a copy of the target (as `uv run train.py` would), saving the artifact
PLAIN="$WORK/plain"; mkdir -p "$PLAIN"; cp "$ROOT/train.py" "$ROOT/prepare.py" "$PLAIN/"
( cd "$PLAIN" && AUTORESEARCH_TIME_BUDGET="$TRAIN_BUDGET" AUTORESEARCH_ARTIFACT="$PLAIN/model.pt2" \
    timeout 300 "${PY[@]}" train.py >"$LOGS/train.log" 2>&1 )
rc=$?
probe=$(grep -m1 "Flash Attention 3 unavailable" "$LOGS/train.log" | sed 's/^WARNING: //')
header=$(grep -m1 "^profile: .*attention:" "$LOGS/train.log")
row attention "$( [ -n "$header" ] && echo ok || echo FAIL)" "${header##*attention: }${probe:+ -- $probe}"
OWN=$(summary val_bpb "$LOGS/train.log")
if [ $rc -eq 0 ] && [ -n "$OWN" ] && [ "$OWN" != nan ]; then
    row train ok "val_bpb $OWN, $(summary num_steps "$LOGS/train.log") steps in $(summary training_seconds "$LOGS/train.log") s, $(summary tokens_per_sec "$LOGS/train.log") tok/s, mfu $(summary mfu_percent "$LOGS/train.log") %, $(summary device "$LOGS/train.log") $(summary dtype "$LOGS/train.log"), total $(summary total_seconds "$LOGS/train.log") s, first step (compile) $(grep -m1 '^step 00000' "$LOGS/train.log" | grep -o 'dt: [0-9]*ms')"
    row peak ok "$(grep -m1 '^budget: ' "$LOGS/train.log" | sed 's/.*peak: //')"
else
    row train FAIL "exit $rc, see $LOGS/train.log: $(tail -1 "$LOGS/train.log")"
fi
grep -m1 "evaluate_bpb: model exported" "$LOGS/train.log" >/dev/null && row export ok "$(grep -m1 'evaluate_bpb: model exported' "$LOGS/train.log" | sed 's/.* in //'), $(du -h "$PLAIN/model.pt2" | cut -f1)" \
    || row export FAIL "no artifact written (see $LOGS/train.log)"

# 4. the separate evaluator, fresh process, pristine copy
mkdir -p "$WORK/pristine"; cp "$ROOT/prepare.py" "$WORK/pristine/"
s=$(date +%s)
( cd "$WORK/pristine" && timeout 300 "${PY[@]}" prepare.py --evaluate "$PLAIN/model.pt2" >"$LOGS/evaluate.log" 2>&1 )
rc=$?
EV=$(summary val_bpb "$LOGS/evaluate.log")
TOL=$(sed -n 's/^METRIC_TOLERANCE = \([0-9.e-]*\).*/\1/p' "$ROOT/prepare.py")
if [ $rc -eq 0 ] && [ -n "$EV" ] && [ -n "$OWN" ]; then
    verdict=$("${PY[@]}" -c "import sys; a, b, t = map(float, sys.argv[1:]); print(('ok' if abs(a - b) <= t else 'FAIL'), f'gap {abs(a - b):.2e} (tolerance {t:g})')" "$OWN" "$EV" "$TOL")
    row evaluate "${verdict%% *}" "val_bpb $EV vs train.py $OWN: ${verdict#* }; scoring $(summary eval_seconds "$LOGS/evaluate.log") s, whole process $(( $(date +%s) - s )) s"
else
    row evaluate FAIL "exit $rc, see $LOGS/evaluate.log: $(tail -1 "$LOGS/evaluate.log")"
fi

# 4b. the sandbox on a GPU as root (issue 18): capabilities dropped, uid nobody, one GPU's device node, CUDA works there
( cd "$ROOT" && timeout 120 "${PY[@]}" - >"$LOGS/confine.log" 2>&1 <<'EOF'
import json, os, subprocess, sys
sys.path.insert(0, ".")
from harness import sandbox
from harness.run.runner import interpreter
code = ("import glob, json, os, torch; s = open('/proc/self/status').read(); "
        "x = torch.randn(4096, 4096, device='cuda'); y = (x @ x).sum().item(); "
        "print(json.dumps({'nodes': sorted(glob.glob('/dev/nvidia[0-9]*')), 'gpus': torch.cuda.device_count(), "
        "'uid': os.getuid(), 'capeff': [l for l in s.splitlines() if l.startswith('CapEff')][0].split()[1]}))")
print("probe:", sandbox.probe(), "missing:", sandbox.missing())
out = subprocess.run(sandbox.wrap([interpreter(), "-c", code], run_dir=None, gpu="0"), capture_output=True, text=True,
                     env={**os.environ, **sandbox.scratch_env()})
print(out.stdout, out.stderr[-2000:])
found = json.loads(out.stdout.strip().splitlines()[-1])
ok = found["gpus"] == 1 and len(found["nodes"]) == 1 and found["uid"] == 65534 and int(found["capeff"], 16) == 0
print("RESULT", "ok" if ok else "FAIL", found)
EOF
)
if grep -q "^RESULT ok" "$LOGS/confine.log"; then row confine ok "$(grep '^RESULT' "$LOGS/confine.log" | cut -d' ' -f3-)"
else row confine FAIL "see $LOGS/confine.log: $(tail -1 "$LOGS/confine.log")"; fi

# 5. agent.py: baseline + 2 random candidates, everything the harness does, on a throwaway repository
REPO="$WORK/repo"; mkdir -p "$REPO"
cp "$ROOT/train.py" "$ROOT/prepare.py" "$ROOT/program.md" "$ROOT/.gitignore" "$REPO/"
git -C "$REPO" init -q -b main && git -C "$REPO" add -A \
    && git -C "$REPO" -c user.name=gpu-check -c user.email=gpu-check@localhost commit -qm "gpu check target"
s=$(date +%s)
( cd "$REPO" && AUTORESEARCH_TIME_BUDGET="$AGENT_BUDGET" timeout 360 "${PY[@]}" "$ROOT/agent.py" --tag gpucheck \
    --target "$REPO" --proposer random --max-experiments 2 --baseline-runs 1 --confirm 0 >"$LOGS/agent.log" 2>&1 )
rc=$?
cp "$REPO/results.tsv" "$LOGS/results.tsv" 2>/dev/null; cp "$REPO/events.jsonl" "$LOGS/events.jsonl" 2>/dev/null
nrows=$(( $(wc -l <"$REPO/results.tsv" 2>/dev/null || echo 1) - 1 ))
sandbox=$(grep -m1 -io "sandbox[^|]*" "$LOGS/agent.log" | head -c 120)
if [ $rc -eq 0 ] && [ "$nrows" = 3 ]; then
    row agent ok "3 rows ($(cut -f4 "$REPO/results.tsv" | tail -n +2 | sort | uniq -c | xargs)), $(( $(date +%s) - s )) s; $sandbox"
else
    row agent FAIL "exit $rc, $nrows rows, see $LOGS/agent.log: $(tail -2 "$LOGS/agent.log" | tr '\n' ' ')"
fi
# 5b. Flash Attention 3 in the sandbox (issue 40): pinned and fetched at the agent's start, loaded by its runs offline
kernel=$(grep -m1 "^attention: " "$LOGS/agent.log")
used=$(grep -h "^attention:" "$REPO"/.git/autoresearch/gpucheck/logs/*.log 2>/dev/null | awk '{print $2}' | sort | uniq -c | xargs)
if echo "$kernel" | grep -q "Flash Attention 3" && [ -n "$used" ] && ! echo "$used" | grep -q sdpa; then
    row fa3-box ok "${kernel#attention: } | runs: $used"
else
    row fa3-box FAIL "${kernel:-no attention line in $LOGS/agent.log} | runs: ${used:-none}"
fi
[ -f "$REPO/events.jsonl" ] && "${PY[@]}" - "$REPO/events.jsonl" "$ROOT" <<'EOF' | while IFS= read -r line; do row "${line%% *}" "$(echo "$line" | cut -d' ' -f2)" "${line#* * }"; done
import json, sys
for e in map(json.loads, open(sys.argv[1])):
    if e.get("event") == "experiment":
        ok = "ok" if e.get("status") in ("keep", "discard") else "FAIL"
        print(f"exp{e.get('n')} {ok} {e.get('status')} {e.get('metric')} wall {e.get('wall_seconds', 0):.0f} s, memory {e.get('memory_gb')} GB ({e.get('memory_source')}; train.py said {e.get('reported_memory_gb')}): {str(e.get('description'))[:60]} {e.get('reason') or ''}")
        budget = e.get("budget_s")
    if e.get("event") == "stop" and isinstance(e.get("phases"), dict):   # where the GPU's wall time went (issue 40)
        sys.path.insert(0, sys.argv[2])
        from harness.run import phases
        print(f"share {'ok' if e['phases'].get('training') else 'FAIL'} at a {budget}s budget: {phases.words(e['phases'])}")
EOF

# 5c. the compute-matched budget (issue 40): an H100's 300 s in this GPU's seconds, from its fingerprint
like=$(cd "$ROOT" && "${PY[@]}" -c "from harness.run import hardware, matched; print(matched.scaled(300, 'h100', hardware.measure(), lambda: matched.measure('cuda', __import__('sys').executable, dict(__import__('os').environ)))[1])" 2>&1 | tail -1)
case "$like" in "300 s on an H100 = "*) row matched ok "$like" ;; *) row matched FAIL "$like" ;; esac

# 6. several devices (issue 11): only with 2+ GPUs and an agent.py that has --devices
if [ "${NGPU:-0}" -ge 2 ] 2>/dev/null && "${PY[@]}" "$ROOT/agent.py" --help 2>/dev/null | grep -q -- "--devices"; then
    ( cd "$REPO" && AUTORESEARCH_TIME_BUDGET="$AGENT_BUDGET" timeout 300 "${PY[@]}" "$ROOT/agent.py" --tag gpucheck2 \
        --target "$REPO" --proposer random --max-experiments 2 --baseline-runs 1 --confirm 0 --devices 0,1 >"$LOGS/devices.log" 2>&1 ) \
        && row devices ok "--devices 0,1: $(tail -1 "$LOGS/devices.log")" || row devices FAIL "see $LOGS/devices.log"
else
    row devices skip "needs 2+ GPUs and agent.py --devices ($NGPU GPU here)"
fi

echo
echo "GPU check: $(( $(date +%s) - t0 )) s, logs in $LOGS"
printf '%s\n' "${ROWS[@]}"
! printf '%s\n' "${ROWS[@]}" | grep -q " FAIL "
