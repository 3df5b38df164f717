#!/usr/bin/env bash
# One turn of a real model on the device (issue 63), where the model is not: the device has no network, so each call
# replays the answers written so far and stops at the next question.
#   bash scripts/device/llm_turn.sh TASK BRIDGE ANSWERS ITERS
# TASK: a shipped task (kernels/TASK); BRIDGE: bridge_openai.py (../shared/tools, carried); ANSWERS: a folder of
# resp-N.txt, the model's answers to requests 1..N (a recorded conversation: the bridge serves them at once). A user
# repository is made from the task, `agent optimize --proposer llm --iters ITERS` runs against the bridge, and the
# request it has no answer for gets a 503 after 2 s, which ends the run (max_attempts 1, endpoint_outages 1). Under
# $OUT: every request (req-N.json: the model's next question is the last), the run's records and prompts, the log.
set -u
task=$1; bridge=$2; answers=$3; iters=$4
here=$(pwd)
work=$(mktemp -d /tmp/llm_turn.XXXX)
mkdir -p "$work/bridge" "$work/user/kernels"
cp "$answers"/resp-*.txt "$work/bridge/" 2>/dev/null
python3 "$bridge" 8765 "$work/bridge" 2 & bpid=$!
cp -r "kernels/$task" "$work/user/kernels/$task"
cat > "$work/user/pyproject.toml" <<EOF
[tool.agent]
base_url = "http://127.0.0.1:8765/v1"
model = "bridge"
timeout_s = 60
deadline_s = 120
max_attempts = 1
endpoint_outages = 1
backoff_max_s = 0
EOF
(cd "$work/user" && git init -q -b main && git add -A && git -c user.name=u -c user.email=u@x commit -qm "user: $task")
(cd "$work/user" && timeout 560 python3 -m agent optimize "kernels/$task" --proposer llm --iters "$iters" \
   --target 100x > "$work/optimize.log" 2>&1; echo "rc=$?" >> "$work/optimize.log")
kill $bpid 2>/dev/null
mkdir -p "$OUT/turn"
cp "$work"/bridge/req-*.json "$work/optimize.log" "$OUT/turn/"
run=$(ls -d "$work"/user/runs/*/ 2>/dev/null | head -1)
if [ -n "$run" ]; then
  (cd "$work/user" && python3 -m agent show "$(basename "$run")" > "$OUT/turn/show.txt" 2>&1)
  tar -C "$run" -czf "$OUT/turn/run.tgz" --exclude='*.so' --exclude='build' --exclude='*.ncu-rep' .
fi
tail -5 "$work/optimize.log"
ls "$OUT/turn"
cd "$here"
