#!/bin/bash
# Issue 20 evidence: SmolLM2 8k -> 16k, YaRN x2 + PoSE (command from docs/train.md). Rerun resumes.
cd /work/main
PYTHONPATH=$PWD OMP_NUM_THREADS=2 exec nice -n 5 .venv/bin/python -m rope_extend train smollm2 --method yarn --factor 2 \
    $(cat out/evidence/text-args.txt) --window 1024 --batch-tokens 4096 --steps 50 --save-steps 5 \
    --eval-text /usr/share/common-licenses/GPL-3 -o out/evidence/smollm2-16k-pose >> out/evidence/train.log 2>&1
