#!/bin/bash
# bench/train_speed.py at the sizes, each case in its own child (address space capped at 20 GiB so an
# overrun fails this bench instead of the machine's OOM killer hitting someone else's process)
cd /work/wt-train
date -u +"start %F %T"
PYTHONPATH=$PWD prlimit --as=21474836480 nice -n 10 /work/main/.venv/bin/python bench/train_speed.py \
  --target 16384 --window 2048 --steps 1 --gradient-checkpointing --json out/bench/train_speed-16k.json
echo "rc $?"
date -u +"end %F %T"
