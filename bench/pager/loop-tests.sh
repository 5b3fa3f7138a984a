#!/bin/bash
# Runs a test binary N times, each run bounded, and counts hangs and failures: how the
# pager's test-binary hang was hunted (docs/pager.md, "The hang of 2026-11-24, found").
#
#   bench/pager/loop-tests.sh BIN N TIMEOUT_S [test args...]
#   e.g. bench/pager/loop-tests.sh target/debug/deps/pager-<hash> 200 240 --test-threads=16
#        bench/pager/loop-tests.sh target/debug/deps/advm-<hash> 200 240 pager --test-threads=16
#
# Runs with --nocapture, so a panic in a pager thread shows even when its test hangs
# (the harness prints a test's captured output only when the test ends). A run still
# going after TIMEOUT_S is a hang: its threads' stacks are dumped with gdb (when
# installed), then it is killed. Logs of hangs, failures and panics are kept in
# $OUT (default /tmp/advm-loop-tests); a summary line per event and a last line with
# the counts and `uptime` go to stdout.
bin=$1; n=$2; to=$3; shift 3
out=${OUT:-/tmp/advm-loop-tests}; mkdir -p "$out"
hangs=0; fails=0
for i in $(seq 1 "$n"); do
  log=$out/run-$$-$i.log
  "$bin" "$@" --nocapture > "$log" 2>&1 &
  pid=$!
  t=0
  while kill -0 $pid 2>/dev/null && [ $t -lt "$to" ]; do sleep 1; t=$((t+1)); done
  if kill -0 $pid 2>/dev/null; then
    hangs=$((hangs+1))
    echo "HANG run $i pid $pid ($(uptime))"
    command -v gdb > /dev/null && gdb -p $pid -batch -ex "thread apply all bt" > "$out/hang-$$-$i.gdb" 2>&1
    kill -9 $pid; wait $pid 2>/dev/null
    cp "$log" "$out/hang-$$-$i.log"
  else
    wait $pid; rc=$?
    if [ $rc -ne 0 ]; then fails=$((fails+1)); echo "FAIL run $i rc $rc"; cp "$log" "$out/fail-$$-$i.log"; fi
  fi
  grep -q "panicked" "$log" && cp "$log" "$out/panic-$$-$i.log"
  rm -f "$log"
done
echo "DONE $n runs: $hangs hangs, $fails failures ($(uptime))"
