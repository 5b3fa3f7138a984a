#!/bin/bash
# four.sh MODE N SETTLE [JAVA OPTS...]: N JVMs running `AdvmJava serve 128 SECS` under
# `advm run --mode MODE`, all in one cgroup-v1 memory group; once every one is ready and
# SETTLE seconds have passed (merge mode: the agents' quiet period and merges), both
# meters, three samples 1 s apart: `advm stat` of the N JVMs together (distinct
# anon+shmem, held shmem included) and the group's anon+shmem (total_rss+total_shmem).
# Prints: mode n distinct_mib cgroup_mib (each the mean of the samples). ADVM: the advm
# binary; CLS: the directory with AdvmJava.class.
set -euo pipefail
mode=$1; n=$2; settle=$3; shift 3
advm=${ADVM:-advm}; cls=${CLS:?CLS: directory of AdvmJava.class}
grp=/sys/fs/cgroup/memory/jvm-four-$$
mkdir "$grp"
tmp=$(mktemp -d /tmp/jvmrun-four.XXXXXX)
cleanup() { kill $(cat "$tmp"/pids 2>/dev/null) 2>/dev/null || true; wait; rmdir "$grp" 2>/dev/null || true; rm -rf "$tmp"; }
trap cleanup EXIT
# merge mode shares pages among the JVMs through a private advmd in the same group
# (counted by both meters); without one each JVM merges into its own store only
export ADVM_SOCKET=$tmp/advmd.sock
dpid=
if [ "$mode" = merge ] && [ "${DAEMON:-1}" = 1 ]; then
    bash -c 'echo $$ > "$1/cgroup.procs"; shift; exec "$@"' _ "$grp" "$advm" daemon --socket "$ADVM_SOCKET" 2>"$tmp/daemon.err" &
    dpid=$!
    echo $dpid >>"$tmp/pids"
    until [ -S "$ADVM_SOCKET" ]; do sleep 0.1; done
fi
for i in $(seq "$n"); do
    bash -c 'echo $$ > "$1/cgroup.procs"; shift; exec "$@"' _ "$grp" \
        "$advm" run --mode "$mode" --stats -- java "$@" -cp "$cls" AdvmJava serve 128 $((settle + 30)) \
        >"$tmp/out.$i" 2>"$tmp/err.$i" &
    echo $! >>"$tmp/pids"
done
k=0
for p in $(grep -vx "${dpid:-none}" "$tmp/pids"); do
    k=$((k + 1))
    until grep -q ready "$tmp/out.$k"; do
        kill -0 "$p" 2>/dev/null || { echo "four.sh: JVM $k ended before it was ready:" >&2; cat "$tmp/err.$k" >&2; exit 1; }
        sleep 0.1
    done
done
sleep "$settle"
jpids=$(for p in $(grep -vx "${dpid:-none}" "$tmp/pids"); do cat /proc/$p/task/$p/children; done)
d=0 c=0
for s in 1 2 3; do
    a=$("$advm" stat --json $jpids $dpid | python3 -c 'import json,sys; print(json.load(sys.stdin)["anon_shmem_bytes"])')
    b=$(awk '$1=="total_rss"{r=$2} $1=="total_shmem"{m=$2} END{print r+m}' "$grp/memory.stat")
    d=$((d + a)); c=$((c + b)); sleep 1
done
echo "$mode $n $((d / 3 / 1048576)) $((c / 3 / 1048576))"
kill -TERM $jpids
while kill -0 $jpids 2>/dev/null; do sleep 0.1; done
grep -h "agent merges\|pages " "$tmp"/err.* 2>/dev/null | sed 's/^/  /' || true
