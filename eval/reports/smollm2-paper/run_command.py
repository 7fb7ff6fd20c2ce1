# Run with OMP_NUM_THREADS=1 nice -n 19 (one thread is ~10x faster than two on an oversubscribed machine).
# Equivalent to: rope-extend eval smollm2 --suite paper -o eval/reports/smollm2-paper --interleave
#   --spec method=linear,factor=2 --spec method=ntk,factor=2 --spec method=yarn,factor=2 --spec method=dynamic-yarn,factor=2
import time
from rope_extend.demo_model import smollm2_path
from rope_extend.eval.runner import run_eval

t0 = time.time()
specs = [{"method": m, "factor": 2} for m in ("linear", "ntk", "yarn", "dynamic-yarn")]
def log(r):
    print(f"{time.time() - t0:8.0f}s {r['variant']:16s} {r['case_id']:40s} {r['seconds']:7.1f}s", flush=True)
run_eval(smollm2_path(), specs, "paper", "/work/wt-evalstats/eval/reports/smollm2-paper", progress=False,
         interleave=True, on_record=log)
print("finished", time.time() - t0, flush=True)
