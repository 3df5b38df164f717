#!/usr/bin/env bash
# First device call: what the machine has, and real ncu reports / torch traces as test fixtures.
set -x
cd "$(dirname "$0")"
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv > $OUT/env.txt 2>&1
{ ncu --version; which ncu; nvcc --version | tail -1; python3 -c 'import torch;p=torch.cuda.get_device_properties(0);print(torch.__version__,p.name,p.multi_processor_count,p.shared_memory_per_block_optin,p.regs_per_multiprocessor,p.L2_cache_size)'; ls $(dirname $(readlink -f $(which ncu)))/extras/python; } >> $OUT/env.txt 2>&1
nvcc -O3 -arch=sm_90 -lineinfo -Xptxas -v -o /tmp/probe probe.cu >> $OUT/env.txt 2>&1
/usr/bin/time -f "bare %e s" /tmp/probe >> $OUT/env.txt 2>&1
T1="--section SpeedOfLight --section LaunchStats --section Occupancy --metrics sm__pipe_tensor_op_hmma_cycles_active.avg.pct_of_peak_sustained_active,l1tex__t_sector_hit_rate.pct,lts__t_sector_hit_rate.pct,l1tex__data_bank_conflicts_pipe_lsu_mem_shared_op_ld.sum,l1tex__data_bank_conflicts_pipe_lsu_mem_shared_op_st.sum,dram__throughput.avg.pct_of_peak_sustained_elapsed"
T2="$T1 --section ComputeWorkloadAnalysis --section MemoryWorkloadAnalysis --section SchedulerStats --section WarpStateStats"
/usr/bin/time -f "tier1 %e s" ncu --clock-control none -k regex:probe --launch-skip 2 --launch-count 2 $T1 -f -o $OUT/probe_tier1 /tmp/probe > $OUT/ncu_tier1.txt 2>&1
/usr/bin/time -f "tier2 %e s" ncu --clock-control none -k regex:probe --launch-skip 2 --launch-count 2 $T2 -f -o $OUT/probe_tier2 /tmp/probe > $OUT/ncu_tier2.txt 2>&1
ncu -i $OUT/probe_tier1.ncu-rep --page details >> $OUT/ncu_tier1.txt 2>&1
ncu -i $OUT/probe_tier2.ncu-rep --page details >> $OUT/ncu_tier2.txt 2>&1
ncu -i $OUT/probe_tier1.ncu-rep --page raw --csv > $OUT/probe_tier1_raw.csv 2>&1
ncu --clock-control none -k regex:nomatch_zzz /tmp/probe > $OUT/ncu_nomatch.txt 2>&1; echo "rc=$?" >> $OUT/ncu_nomatch.txt
python3 - <<'PY' >> $OUT/env.txt 2>&1
import torch, json, os
from torch.profiler import profile, ProfilerActivity
x = torch.randn(1 << 20, device="cuda"); torch.cuda.synchronize()
with profile(activities=[ProfilerActivity.CUDA]) as p:
    y = torch.softmax(x.view(1024, 1024), dim=-1); torch.cuda.synchronize()
p.export_chrome_trace(os.environ["OUT"] + "/torch_trace.json")
ev = [e for e in json.load(open(os.environ["OUT"] + "/torch_trace.json"))["traceEvents"] if e.get("cat") == "kernel"]
print("kernel events", len(ev), ev[0]["args"] if ev else None)
PY
ls -la $OUT; cat $OUT/env.txt; grep -iE "small|grid|wave|passes" $OUT/ncu_tier1.txt | head -20
