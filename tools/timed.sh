#!/usr/bin/env bash
# The wall time of a Makefile step, with the load average, for CI's log (.ci/run runs `make -j3 test`):
#   tools/timed.sh NAME COMMAND...     run COMMAND, then print "[time] NAME: N s wall ..." (its exit status is kept)
name=$1
shift
start=$(date +%s)
"$@"
rc=$?
echo "[time] $name: $(($(date +%s) - start)) s wall, exit $rc (load average $(cut -d' ' -f1-3 /proc/loadavg))"
exit $rc
