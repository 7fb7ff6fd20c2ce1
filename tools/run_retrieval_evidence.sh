#!/bin/sh
# Evidence for docs/results-retrieval.md; each step is resumable: rerun the same command and finished cases are
# skipped (a case is written when its job, one KV-prefix group of prompts, finishes).
#   tools/run_retrieval_evidence.sh ceiling   # unpatched passkey at 2k/4k/6k/8k, 5 depths x 2 keys, both haystacks
#   tools/run_retrieval_evidence.sh ceiling-prose  # ... its prose haystack alone, in its own folder (side by side)
#   tools/run_retrieval_evidence.sh 2x        # passkey at 16k: unpatched, yarn x2, self-extend x2, dual-chunk x2,
#                                             # dynamic NTK x2, llama3 x2 (defaults)
#   tools/run_retrieval_evidence.sh 2x-attn   # the same prompts, split in two folders that can run side by side
#   tools/run_retrieval_evidence.sh 2x-freq   # (one process per core; tools/retrieval_tables.py pools the folders):
#                                             # attn = yarn, self-extend, dual-chunk; freq = unpatched, dynamic, llama3
#   tools/run_retrieval_evidence.sh ppl-attn  # perplexity of self-extend x2 and dual-chunk x2 on the paper suite's
#                                             # cases (pooled with eval/reports/smollm2-paper's unpatched and yarn-x2)
#   tools/run_retrieval_evidence.sh ppl-2x-freq  # ... and of dynamic NTK x2 and llama3 x2 (the 2L frequency methods
#                                             # the paper suite did not run)
#   tools/run_retrieval_evidence.sh 2x-20-attn  # 2L filler grown to 20 prompts: self-extend x2, dual-chunk x2
#   tools/run_retrieval_evidence.sh 2x-20-dyn   # ... and dynamic NTK x2 (side by side with 2x-20-attn)
#   tools/run_retrieval_evidence.sh 4x-attn     # passkey at 4L (32k), classic filler: self-extend x4
#   tools/run_retrieval_evidence.sh 4x-freq     # ... dynamic NTK x4 (side by side with 4x-attn)
#   tools/run_retrieval_evidence.sh 4x-dc       # ... dual-chunk x4 (own folder: one process per folder)
#   tools/run_retrieval_evidence.sh 4x-yarn     # ... YaRN x4
#   tools/run_retrieval_evidence.sh 4x-calib    # self-extend x4 G/W candidates on seed-1 calibration prompts
#   tools/run_retrieval_evidence.sh 4x-logn     # the calibration's winner, self-extend x4 + log_n, on the reported prompts
#   tools/run_retrieval_evidence.sh 4x-dc-logn  # ... and dual-chunk x4 + log_n (side by side)
#   tools/run_retrieval_evidence.sh ppl-4x      # perplexity at 2k/8k/16k/32k on both texts: unpatched, yarn x4,
#                                               # dynamic NTK x4, self-extend x4 and dual-chunk x4 + log_n
#   tools/run_retrieval_evidence.sh ppl-4x-attn # ... self-extend x4, dual-chunk x4 (defaults), side by side
#   tools/run_retrieval_evidence.sh needles-2x  # RULER-style niah_single and niah_multikey at 16k: self-extend x2,
#                                               # dynamic NTK x2
#   tools/run_retrieval_evidence.sh needles-ceiling  # ... their ceiling: the unpatched model at 8k
#   tools/run_retrieval_evidence.sh 2x-tune     # the tune comparison at 16k with the fixed probe (the 2L filler
#                                               # prompts): the tuned spec (configs/smollm2-tuned-16k.yaml), NTK-by-parts x2
#   tools/run_retrieval_evidence.sh 2x-paper    # ... the paper suite's other passkey variants: NTK x2, linear x2
#                                               # (side by side with 2x-tune)
#   tools/run_retrieval_evidence.sh 2x-dynyarn  # ... and dynamic-yarn x2, the README results table's last row
#   tools/run_retrieval_evidence.sh 8x-freq     # passkey at 8L (64k), n = 20: YaRN x8, dynamic NTK x8
#   tools/run_retrieval_evidence.sh 8x-se       # ... self-extend x8, defaults and + log_n
#   tools/run_retrieval_evidence.sh 8x-dc       # ... dual-chunk x8, defaults and + log_n
#   tools/run_retrieval_evidence.sh 16x-freq    # passkey at 16L (128k), n = 20: the same variants at x16
#   tools/run_retrieval_evidence.sh 16x-se      # ...
#   tools/run_retrieval_evidence.sh 16x-dc      # ...
#   tools/run_retrieval_evidence.sh ppl-8x      # perplexity at 2k-64k (the docs text only: the licences are 42k
#                                               # tokens): unpatched and every 8L variant
#   tools/run_retrieval_evidence.sh string-filler  # STRING inside the window: passkey at 4k/6k/8k, 20 prompts per length,
#                                               # classic filler: unpatched, STRING defaults, STRING W = 512
#   tools/run_retrieval_evidence.sh string-prose   # ... the prose haystack (side by side with string-filler)
#   tools/run_retrieval_evidence.sh string-ppl     # ... perplexity at 2k/4k/8k on both texts, + the authors' factor
#   tools/run_retrieval_evidence.sh string-ruler    # ... lm-eval's own RULER niah_single_1 and niah_multikey_2 at 8k,
#                                               # 20 prompts each (tools/run_ruler_lm_eval.py; RULER_TASKS=one task:
#                                               # one process per task, side by side)
#   tools/run_retrieval_evidence.sh string-authors # ... the authors' recipe (S = int(0.33 N) per test length N, their
#                                               # factor 0.1 ln 2 + 1), both haystacks, one length per process run
#   tools/run_retrieval_evidence.sh dc-ppl      # dual-chunk's defaults (issue 51 §1): perplexity at 2k/8k/16k/32k on
#                                               # both texts: the defaults before issue 51 (L/16, no scale) and the
#                                               # authors' 847ae71 (L/8 and 0.05 ln(n/L) + 1); each change alone with
#                                               # VARIANTS (dc-w1024.yaml, dc-scale.yaml: not run for time)
#   tools/run_retrieval_evidence.sh dc-passkey  # ... passkey at 16k, 5 depths x 2 keys per haystack, filler and prose
#   tools/run_retrieval_evidence.sh dc-passkey-today  # ... the earlier defaults alone, in their own folder, side by side
#                                               # with VARIANTS='--spec eval/reports/smollm2-dc/dc-847ae71.yaml' dc-passkey
#   tools/run_retrieval_evidence.sh dc-ppl-2k   # ... dc-ppl's 2k cells from 2k forwards, beside the unpatched model
#   tools/run_retrieval_evidence.sh dc-ppl-8k   # ... its 8k cells from 8k forwards (DTYPE=float32: without bf16 rounding)
#   tools/run_retrieval_evidence.sh dc-ppl-16k  # ... and its 16k cells from 16k forwards
#   The string and dc steps run in bfloat16 unless DTYPE is set (on this project's CPUs, with AMX, 3x faster than float32).
#   Every step appends its command, start, wall time, exit status, commit and machine to OUT/steps.log.
#   The 8L/16L steps run on DEVICE (cpu unless set, e.g. DEVICE=cuda) in DTYPE (float32 unless set, e.g.
#   DTYPE=bfloat16), into eval/reports/<folder>-DEVICE-DTYPE unless cpu/float32 (resume does not check the dtype,
#   so records of two devices never share a folder); on one CPU core a 32k job took 48-98 min, 64k is longer (not
#   measured). DRY_RUN=1 prints a step's command instead of running it.
#   (VARIANTS='--spec ...' replaces the default variants of 2x-20-attn, 4x-attn, 4x-freq and 2x-tune)
set -e
cd "$(dirname "$0")/.."
PY=${PY:-.venv/bin/python}  # the Makefile's virtualenv (make install), relative to the repository root
export PYTHONPATH=$PWD OMP_NUM_THREADS=${OMP_NUM_THREADS:-1}  # one thread: on a shared, oversubscribed CPU two threads wait for each other (README)
S4=eval/reports/smollm2-passkey-4x/suite.yaml  # every reported 4L step reads this one suite: the same prompts for all
S8=eval/reports/smollm2-passkey-8x/suite.yaml    # every 8L step reads it: the prompts of the GPU 8L records
S16=eval/reports/smollm2-passkey-16x/suite.yaml  # ... and every 16L step this one
case "$1" in string*|dc-*) DTYPE=${DTYPE:-bfloat16} ;; esac  # STRING's and dual-chunk's steps: bf16 unless set (3x float32 on this CPU)
DEVICE=${DEVICE:-cpu} DTYPE=${DTYPE:-float32}
TAG=$([ "$DEVICE/$DTYPE" = cpu/float32 ] || echo "-$DEVICE-$DTYPE" | tr : -)  # e.g. -cuda-bfloat16
recorded() {  # recorded OUT COMMAND...: run COMMAND, then append to OUT/steps.log its command, start, wall time,
  # exit status and machine (every run of a step, resumed ones too: a folder's lines add up to its compute)
  out=$1; shift
  if [ -n "$DRY_RUN" ]; then echo "$@"; exit 0; fi
  # nice alone yields only inside this session where the kernel groups processes by session (autogroup): the
  # group gets nice 10 too, so a step run with setsid does not take its share from the other sessions' jobs
  [ -w /proc/self/autogroup ] && echo 10 2>/dev/null > /proc/self/autogroup
  start=$(date -u +%Y-%m-%dT%H:%M:%SZ) t0=$(date +%s) rc=0
  commit=$(git rev-parse --short HEAD 2>/dev/null)$(git diff --quiet HEAD -- rope_extend tools 2>/dev/null || echo "+uncommitted")
  nice -n 10 "$@" || rc=$?
  mkdir -p "$out"
  versions=$($PY -c 'import torch, transformers; print(f"torch {torch.__version__}, transformers {transformers.__version__}")')
  cpu=$(sed -n 's/^model name[[:space:]]*: //p' /proc/cpuinfo | head -n 1)
  printf '%s  %s s  exit %s  commit %s  %s cores (%s), OMP_NUM_THREADS=%s, %s\n  %s\n' "$start" "$(( $(date +%s) - t0 ))" \
    "$rc" "$commit" "$(nproc --all)" "$cpu" "$OMP_NUM_THREADS" "$versions" "$*" >> "$out/steps.log"
  exit $rc
}
ev() {  # ev SUITE OUT [eval options...]: one resumable eval run, single-threaded and niced, recorded in OUT/steps.log
  suite=$1 out=$2; shift 2
  recorded "$out" $PY -m rope_extend eval smollm2 --suite "$suite" --interleave -o "$out" "$@"
}
evd() {  # evd SUITE OUT [eval options...]: ev on DEVICE in DTYPE, into OUT plus the device tag
  suite=$1 out=$2; shift 2
  ev "$suite" "$out$TAG" --device "$DEVICE" --dtype "$DTYPE" "$@"
}
# STRING inside the window (issue 44): the unpatched model, STRING's defaults (S = 0.33 L, W = 128) and W = 512 on the
# same prompts (VARIANTS replaces the two STRING specs); perplexity also runs the authors' code's attention factor
# 0.1 ln 2 + 1 (a passkey prompt costs about 40 one-core seconds here, a perplexity variant a few minutes)
STRING_VARIANTS=${VARIANTS:---spec method=string --spec method=string,local_value=512}
STRING_FACTOR="--spec method=string,attention_factor=1.0693147180559945"
DC=eval/reports/smollm2-dc  # dual-chunk's variants (today's defaults, the authors' 847ae71, each change alone)
DC_VARIANTS=${VARIANTS:---spec $DC/dc-today.yaml --spec $DC/dc-847ae71.yaml}
attn() {  # attn METHOD FACTOR: the defaults and + log_n (the spec file next to the suite)
  echo "--spec method=$1,factor=$2 --spec eval/reports/smollm2-passkey-$2x/$1-x$2-logn.yaml"
}
case "$1" in
  ceiling)    ev ceiling eval/reports/smollm2-ceiling ;;
  ceiling-prose) ev eval/reports/smollm2-ceiling-prose/suite.yaml eval/reports/smollm2-ceiling-prose ;;
  2x)         ev ${SUITE:-passkey-2x} eval/reports/smollm2-passkey-2x --spec method=yarn,factor=2 --spec method=self-extend,factor=2 \
                --spec method=dual-chunk,factor=2 --spec method=dynamic,factor=2 --spec method=llama3,factor=2 ;;
  2x-attn)    ev ${SUITE:-passkey-2x} eval/reports/smollm2-passkey-2x-attn --no-baseline --spec method=yarn,factor=2 \
                --spec method=self-extend,factor=2 --spec method=dual-chunk,factor=2 ;;
  2x-freq)    ev ${SUITE:-passkey-2x} eval/reports/smollm2-passkey-2x --spec method=dynamic,factor=2 --spec method=llama3,factor=2 ;;
  ppl-attn)   ev eval/reports/smollm2-ppl-attn/suite.yaml eval/reports/smollm2-ppl-attn --no-baseline --spec method=self-extend,factor=2 \
                --spec method=dual-chunk,factor=2 ;;
  ppl-2x-freq) ev eval/reports/smollm2-ppl-attn/suite.yaml eval/reports/smollm2-ppl-2x-freq --no-baseline \
                --spec method=dynamic,factor=2 --spec method=llama3,factor=2 ;;
  2x-20-attn) ev eval/reports/smollm2-passkey-2x-20/suite-filler.yaml eval/reports/smollm2-passkey-2x-20 --no-baseline \
                ${VARIANTS:---spec method=self-extend,factor=2 --spec method=dual-chunk,factor=2} ;;
  2x-20-dyn)  ev eval/reports/smollm2-passkey-2x-20-dyn/suite-filler.yaml eval/reports/smollm2-passkey-2x-20-dyn --no-baseline --spec method=dynamic,factor=2 ;;
  4x-attn)    ev $S4 eval/reports/smollm2-passkey-4x --no-baseline ${VARIANTS:---spec method=self-extend,factor=4} ;;
  4x-freq)    ev $S4 eval/reports/smollm2-passkey-4x-dyn --no-baseline ${VARIANTS:---spec method=dynamic,factor=4} ;;
  4x-dc)      ev $S4 eval/reports/smollm2-passkey-4x-dc --no-baseline --spec method=dual-chunk,factor=4 ;;
  4x-yarn)    ev $S4 eval/reports/smollm2-passkey-4x-yarn --no-baseline --spec method=yarn,factor=4 ;;
  4x-calib)   ev eval/reports/smollm2-passkey-4x-calib/suite.yaml eval/reports/smollm2-passkey-4x-calib --no-baseline ${VARIANTS:---spec \
                method=self-extend,factor=4 --spec eval/reports/smollm2-passkey-4x-calib/self-extend-x4-g6-w2048.yaml \
                --spec eval/reports/smollm2-passkey-4x-calib/self-extend-x4-logn.yaml} ;;
  4x-logn)    ev $S4 eval/reports/smollm2-passkey-4x-logn --no-baseline \
                --spec eval/reports/smollm2-passkey-4x-calib/self-extend-x4-logn.yaml ;;
  4x-dc-logn) ev $S4 eval/reports/smollm2-passkey-4x-dc-logn --no-baseline \
                --spec eval/reports/smollm2-passkey-4x-calib/dual-chunk-x4-logn.yaml ;;
  ppl-4x)     ev eval/reports/smollm2-ppl-4x/suite.yaml eval/reports/smollm2-ppl-4x --spec method=yarn,factor=4 \
                --spec method=dynamic,factor=4 --spec eval/reports/smollm2-passkey-4x-calib/self-extend-x4-logn.yaml \
                --spec eval/reports/smollm2-passkey-4x-calib/dual-chunk-x4-logn.yaml ;;
  ppl-4x-attn) ev eval/reports/smollm2-ppl-4x/suite.yaml eval/reports/smollm2-ppl-4x-attn --no-baseline \
                --spec method=self-extend,factor=4 --spec method=dual-chunk,factor=4 ;;
  needles-2x) ev eval/reports/smollm2-needles-2x/suite.yaml eval/reports/smollm2-needles-2x --no-baseline \
                --spec method=self-extend,factor=2 --spec method=dynamic,factor=2 ;;
  2x-tune)    ev eval/reports/smollm2-passkey-2x/suite-filler.yaml eval/reports/smollm2-passkey-2x-tune --no-baseline \
                ${VARIANTS:---spec configs/smollm2-tuned-16k.yaml --spec method=ntk-by-parts,factor=2} ;;
  2x-paper)   ev eval/reports/smollm2-passkey-2x/suite-filler.yaml eval/reports/smollm2-passkey-2x-paper --no-baseline \
                --spec method=ntk,factor=2 --spec method=linear,factor=2 ;;
  2x-dynyarn) ev eval/reports/smollm2-passkey-2x/suite-filler.yaml eval/reports/smollm2-passkey-2x-dynyarn --no-baseline \
                --spec method=dynamic-yarn,factor=2 ;;
  needles-ceiling) ev eval/reports/smollm2-needles-ceiling/suite.yaml eval/reports/smollm2-needles-ceiling ;;
  8x-freq)    evd $S8 eval/reports/smollm2-passkey-8x-freq --no-baseline --spec method=yarn,factor=8 --spec method=dynamic,factor=8 ;;
  8x-se)      evd $S8 eval/reports/smollm2-passkey-8x-se --no-baseline $(attn self-extend 8) ;;
  8x-dc)      evd $S8 eval/reports/smollm2-passkey-8x-dc --no-baseline $(attn dual-chunk 8) ;;
  16x-freq)   evd $S16 eval/reports/smollm2-passkey-16x-freq --no-baseline --spec method=yarn,factor=16 --spec method=dynamic,factor=16 ;;
  16x-se)     evd $S16 eval/reports/smollm2-passkey-16x-se --no-baseline $(attn self-extend 16) ;;
  16x-dc)     evd $S16 eval/reports/smollm2-passkey-16x-dc --no-baseline $(attn dual-chunk 16) ;;
  ppl-8x)     evd eval/reports/smollm2-ppl-8x/suite.yaml eval/reports/smollm2-ppl-8x --spec method=yarn,factor=8 \
                --spec method=dynamic,factor=8 $(attn self-extend 8) $(attn dual-chunk 8) ;;
  string-filler) evd eval/reports/smollm2-string/suite-filler.yaml eval/reports/smollm2-string-filler $STRING_VARIANTS ;;
  string-prose) evd eval/reports/smollm2-string/suite-prose.yaml eval/reports/smollm2-string-prose $STRING_VARIANTS ;;
  string-ppl) evd eval/reports/smollm2-string/suite-ppl.yaml eval/reports/smollm2-string-ppl $STRING_VARIANTS $STRING_FACTOR ;;
  string-ruler) recorded eval/reports/smollm2-string-ruler$TAG $PY tools/run_ruler_lm_eval.py \
                -o eval/reports/smollm2-string-ruler$TAG --dtype "$DTYPE" --device "$DEVICE" --length 8192 --limit 20 \
                --tasks ${RULER_TASKS:-niah_single_1 niah_multikey_2} $STRING_VARIANTS ;;
  string-authors) for n in 4k 6k 8k; do  # one spec per test length: one run per length, into one folder
                  (evd eval/reports/smollm2-string-authors/suite-$n.yaml eval/reports/smollm2-string-authors --no-baseline \
                   --spec eval/reports/smollm2-string-authors/$n/string-authors.yaml) || exit $?
                done ;;
  dc-ppl)     evd eval/reports/smollm2-ppl-4x/suite.yaml eval/reports/smollm2-dc-ppl --no-baseline $DC_VARIANTS ;;
  dc-passkey) evd $DC/suite-passkey.yaml eval/reports/smollm2-dc-passkey --no-baseline \
                ${VARIANTS:---spec $DC/dc-847ae71.yaml --spec $DC/dc-today.yaml} ;;  # 847ae71 first: its 16k jobs pair with
                                                                                 # today's, whose 2k twins come free
  dc-ppl-2k|dc-ppl-8k|dc-ppl-16k) evd $DC/suite-${1#dc-}.yaml eval/reports/smollm2-$1 $DC_VARIANTS ;;
  dc-passkey-today) evd $DC/suite-passkey.yaml eval/reports/smollm2-dc-passkey-today --no-baseline --spec $DC/dc-today.yaml ;;
  *) echo "usage: $0 ceiling|ceiling-prose|2x|2x-attn|2x-freq|ppl-attn|ppl-2x-freq|2x-20-attn|2x-20-dyn|4x-attn|4x-freq|4x-dc|4x-yarn|4x-calib|4x-logn|4x-dc-logn|ppl-4x|ppl-4x-attn|needles-2x|needles-ceiling|2x-tune|2x-paper|2x-dynyarn|8x-freq|8x-se|8x-dc|16x-freq|16x-se|16x-dc|ppl-8x|string-filler|string-prose|string-ppl|string-ruler|string-authors|dc-ppl|dc-passkey|dc-passkey-today|dc-ppl-2k|dc-ppl-8k|dc-ppl-16k" >&2; exit 2 ;;
esac
