#!/bin/sh
# The run recorded in eval/reports/bench-train-sequence-parallel/ (2-core CPU machine shared with other work).
cd "$(dirname "$0")/../../.."  # the repository root
PYTHONPATH=$PWD nice -n 10 .venv/bin/python bench/train_sequence_parallel.py --windows 512 1024 1536 2048 3072 \
    --max-window-one-process 2048 --budget-gib 4 --json eval/reports/bench-train-sequence-parallel/results.json
