#!/bin/bash
# One method of `advm bench vm-fill` in the 1024 MiB budget (one hold of the bench lock
# each), with the load every 30 s beside it:
#   flock -o /work/bench.lock bench/vm/fill-method.sh METHOD OUT-PREFIX
# writes OUT-PREFIX.json (the report), .err (its progress), .load (uptime lines).
# Other ADVM_VM_* settings pass through (e.g. ADVM_VM_BOOT_LOOKUP=2).
set -u
M=$1 OUT=$2
ADVM=${ADVM:-target/release/advm}
( while :; do uptime >> "$OUT.load"; sleep 30; done ) &
LOADER=$!
trap 'kill $LOADER 2>/dev/null' EXIT
uptime > "$OUT.load"
ADVM_VM_METHODS=$M ADVM_VM_BUDGET_MIB=${ADVM_VM_BUDGET_MIB:-1024} ADVM_VM_TIMEOUT_S=${ADVM_VM_TIMEOUT_S:-150} \
  ADVM_VM_PARTIAL=$OUT.partial.json "$ADVM" bench vm-fill --json > "$OUT.json" 2> "$OUT.err"
rc=$?
uptime >> "$OUT.load"
exit $rc
