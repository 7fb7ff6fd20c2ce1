#!/usr/bin/env bash
# The wall time of a Makefile step, with the load average, for CI's log (.ci/run runs `make -j2 test`):
#   tools/timed.sh NAME COMMAND...     run COMMAND, then print "[time] NAME: N s wall ..." (its exit status is kept)
#   tools/timed.sh NAME --since FILE   print the time since FILE was written (a step of several recipe lines)
name=$1
shift
if [ "$1" = "--since" ]; then
  start=$(stat -c %Y "$2")
  rc=0
else
  start=$(date +%s)
  "$@"
  rc=$?
fi
echo "[time] $name: $(($(date +%s) - start)) s wall, exit $rc (load average $(cut -d' ' -f1-3 /proc/loadavg))"
exit $rc
