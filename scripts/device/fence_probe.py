"""Does CUDA work in a process fenced by tools/isolation/confine.py? (run on the GPU machine, from the repository root)

Each case starts a fresh Python with a scratch directory, applies a Landlock ruleset (None: no fence;
"product": tools.isolation.confine.fence_scratch() as the candidate children do; a list: the scratch directory,
the device files and these paths writable) and reports whether torch sees the GPU and can allocate.
The H200 host needed writes beneath /proc/PID (cudaGetDeviceCount failed with error 304 without).
"""
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent.parent
sys.path.insert(0, str(ROOT))
CASES = {"none": None, "product": "product", "scratch+devices only": [], "+/proc/PID": ["PROC"]}
CODE = r'''
import json, os, sys
extra = json.loads(sys.argv[1])
from tools.isolation import confine
if extra == "product":
    assert confine.fence_scratch()
elif extra is not None:
    extra = [f"/proc/{os.getpid()}" if e == "PROC" else e for e in extra]
    confine._landlock([os.environ["AGENT_SCRATCH"]] + extra, confine.device_files(), confine.landlock_abi())
import torch
ok, err = torch.cuda.is_available(), ""
try:
    torch.zeros(1, device="cuda").add_(1).item()
except Exception as e:
    err = " ".join(str(e).split())[:160]
print(json.dumps({"cuda": ok, "alloc_error": err}))
'''
print("fence:", __import__("tools.isolation.confine", fromlist=["describe"]).describe())
for name, extra in CASES.items():
    d = tempfile.mkdtemp()
    env = {**os.environ, "AGENT_SCRATCH": d, "HOME": d, "TMPDIR": d,
           "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))}
    p = subprocess.run([sys.executable, "-c", CODE, json.dumps(extra)], capture_output=True, text=True, env=env,
                       timeout=120)
    print(f"{name:22s} {p.stdout.strip().splitlines()[-1] if p.stdout.strip() else p.stderr.strip()[-200:]}")
