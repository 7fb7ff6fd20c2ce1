"""The verification step alone (`rope_extend.verify.verify_plan` on the config-only path), side by side: the
SmolLM2-135M demo config against real large configs, each in a fresh child process (time, CPU, peak RSS).

    python bench/verify_step.py

The child imports the config's modeling code before timing (a one-time import, the same for every size), then
plans `yarn x4` (replace_existing: Llama 3.1 ships llama3) and verifies. Goal (issue 18 §2): the verification of a
70B-shaped config costs what the 135M one does: ratio ~1, and its own memory (peak minus after-imports) tens of MB.
"""

from __future__ import annotations

import json

from common import ROOT, demo_model, run_child

CHILD = """
import json, resource, sys, time, warnings
warnings.simplefilter("ignore")
from transformers import AutoConfig, AutoModel
from rope_extend.plan import plan_patch
from rope_extend.verify import verify_plan
config = AutoConfig.for_model(**json.load(open(sys.argv[1])))
AutoModel._model_mapping[type(config)]  # import the modeling code: not verification's cost
before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
plan = plan_patch(config, method="yarn", factor=4, replace_existing=True)
t, c = time.perf_counter(), time.process_time()
verify_plan(plan, source_config=config)
print(json.dumps({"seconds": time.perf_counter() - t, "cpu_s": time.process_time() - c, "imports_rss_mib": before}))
"""


def main() -> None:
    configs = {"SmolLM2-135M (demo)": demo_model() / "config.json"}
    configs.update({p.parent.name: p for p in sorted((ROOT / "tests" / "data" / "hub").glob("*/config.json"))})
    configs.update({p.stem: p for p in sorted((ROOT / "tests" / "real_configs").glob("*.json"))})
    rows = {name: run_child(CHILD, str(path)) for name, path in configs.items()}
    base = rows["SmolLM2-135M (demo)"]
    print(f"{'config':24} {'verify s':>9} {'cpu s':>7} {'x demo':>7} {'peak MiB':>9} {'own MiB':>8}")
    for name, row in rows.items():
        own = row["peak_rss_mib"] - row["imports_rss_mib"]
        print(f"{name:24} {row['seconds']:9.2f} {row['cpu_s']:7.2f} {row['seconds'] / base['seconds']:7.2f} "
              f"{row['peak_rss_mib']:9.0f} {own:8.0f}")
    print(json.dumps({name: {k: round(v, 3) for k, v in row.items()} for name, row in rows.items()}))


if __name__ == "__main__":
    main()
