#!/usr/bin/env bash
# Issue 66: what a kept and a rejected iteration cost, stage by stage, on the lent GPU machine, before and after on one
# card. From the repository root there, with the project's wheels in .whl/ (carry [".whl"]) and $OUT an empty folder:
#
#   bash scripts/device/kept_walls.sh PART [BEFORE.tar]     # PART: attn | one | sm; one call a part (a row)
#
# attn: kernels/attention_fwd; one: attention_ext in the seeds' form (kernel and binding in one .cu, the file the agent
# edits); sm: kernels/softmax. Each: `agent optimize TASK --iters 3 --target 100x` with the heuristic (its third attention
# move is kept; softmax's first VEC move), in a fresh user repository, with the code of BEFORE.tar (an earlier commit:
# `git archive -o BEFORE.tar COMMIT`, carried) where given, then with this checkout's. $OUT/summary.txt: per iteration
# its decision, wall, stage seconds, and for a kept one what its parity's sanitizers took and where its launch
# geometry came from (the Nsight Compute pass that is also the profile, or the torch trace), its parity checks'
# seconds (how many, in all, the five slowest, and by kind: listed, hidden, range, values, views, wide).
set -u
[ $# -ge 1 ] || { echo "usage: bash scripts/device/kept_walls.sh attn|one|sm [BEFORE.tar]" >&2; exit 2; }
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site .whl/*.whl >/dev/null 2>&1
R=$PWD; S=$OUT/summary.txt
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader >> "$S"
case $1 in
  attn) TASK=kernels/attention_fwd ;;
  sm) TASK=kernels/softmax ;;
  one) TASK=kernels/attention_one ;;
  *) echo "unknown part: $1" >&2; exit 2 ;;
esac
run() {   # NAME CODE_DIR
  local U=/tmp/user_$1
  rm -rf "$U"; mkdir -p "$U"; cp -r "$R/kernels" "$R/pyproject.toml" "$U"/
  if [ "$TASK" = kernels/attention_one ]; then   # the seeds' form: kernel and binding in one .cu
    local one=$U/kernels/attention_one
    cp -r "$R/kernels/attention_ext" "$one"; rm -rf "$one/__pycache__"
    cat "$one/attention.cu" "$one/binding.cpp" > "$one/one.cu"; rm "$one/attention.cu" "$one/binding.cpp"
    sed -i 's/^name = "attention_ext"/name = "attention_one"/; s/^sources = .*/sources = ["one.cu"]/; s/^editable = .*/editable = ["one.cu"]/; s/"attention.cu"/"one.cu"/' "$one/task.toml"
  fi
  (cd "$U" && git init -q -b main && git add -A && git -c user.name=u -c user.email=u@x commit -qm init)
  (cd "$U" && PYTHONPATH=/tmp/site:$2 PYTHONUNBUFFERED=1 timeout 280 python3 -m agent optimize "$TASK" --iters 3 \
      --target 100x --run-id "$1" --quiet > "$OUT/$1.log" 2>&1; echo "rc=$?" >> "$OUT/$1.log")
  echo "== $1: agent optimize $TASK --iters 3 ($(tail -1 "$OUT/$1.log"))" >> "$S"
  tar -czf "$OUT/$1.runs.tgz" -C "$U/runs" --exclude='*.ncu-rep' --exclude='*.so' "$1" 2>/dev/null   # the records
  python3 - "$U/runs/$1" >> "$S" 2>&1 <<'PY'
import json, sys
from pathlib import Path
run = Path(sys.argv[1])
for line in (run / "iterations.jsonl").read_text().splitlines():
    r = json.loads(line)
    t = {k: round(v, 2) for k, v in (r.get("times") or {}).items() if isinstance(v, (int, float)) and v >= 0.005}
    print(f"  iter {r['iteration']}: {r['decision']} {r['outcome']}: wall {r.get('wall_s') or 0:.2f} s; {t}")
    if r["decision"] == "kept":
        p = r.get("parity") or {}
        print("    sanitizers:", {k: ((p.get(k) or {}).get("seconds"), (p.get(k) or {}).get("steps"),
                                       (p.get(k) or {}).get("slowest_shape")) for k in ("memcheck", "racecheck")},
              "parity", round(p.get("seconds") or 0, 2), "s;", "launch:", ((r.get("launch") or {}).get("message") or "")[-90:])
        print("    profile.json:", (run / f"iter-{r['iteration']}" / "profile.json").exists())
        for k in ("bench", "confirm"):
            b = r.get(k) or {}
            ci = b.get("speedup_vs_baseline") or {}
            print(f"    {k}: {b.get('seconds') or 0:.2f} s, {ci.get('rounds')} rounds, probes",
                  {n: round(v, 2) for n, v in (b.get("probe_seconds") or {}).items()},
                  "phases", b.get("phase_seconds"),
                  f"undecided {len(r.get(k + '_undecided') or [])}:", (b.get("message") or "")[-150:])
        checks = sorted(p.get("checks") or [], key=lambda c: -(c.get("seconds") or 0))
        every = sum(c.get("seconds") or 0 for c in checks)
        print(f"    parity checks: {len(checks)} in {every:.2f} s; the slowest:",
              ", ".join(f"{c.get('label')} {c.get('dist')} {c.get('seconds') or 0:.2f}" for c in checks[:5]))
        kinds = {}      # by kind (the label's first word where it names one: range, values, wide, ...; else listed)
        for c in checks:
            word = (c.get("label") or "").split(" ")[0]
            kind = word if word and "=" not in word else "listed"
            n, sec, dr, ca = kinds.get(kind, (0, 0.0, 0.0, 0.0))
            parts = c.get("parts") or {}    # where a check's seconds went, where the code records it (issue 66)
            kinds[kind] = (n + 1, sec + (c.get("seconds") or 0), dr + parts.get("draw", 0), ca + parts.get("calls", 0))
        print(f"    parity: its checks {every:.2f} s, the sanitizers after them {(p.get('seconds') or 0) - every:.2f} s "
              "(parity's seconds less its checks')")
        print("    parity by kind (checks, s; of them the draws', the candidate's calls'):",
              {k: (n, round(sec, 2), round(dr, 2), round(ca, 2)) for k, (n, sec, dr, ca) in
               sorted(kinds.items(), key=lambda kv: -kv[1][1])})
        # each values check (slice 17: a draw the held child searched ahead takes about 1 ms; one searched in the
        # job pays the user's call's first kernels, 0.5-0.8 s a shape on an H200)
        print("    values checks:", [(c.get("label"), c.get("dist"), c.get("seconds"), (c.get("parts") or {}).get("draw"))
                                      for c in p.get("checks") or [] if (c.get("label") or "").startswith("values ")])
PY
}
if [ $# -ge 2 ]; then
  B=/tmp/before; rm -rf $B; mkdir -p $B; tar -xf "$2" -C $B
  run "before_$1" $B
fi
run "after_$1" "$R"
cat "$S"
