#!/bin/bash
# honest.sh: runs one program under `advm run --mode MODE` inside its own cgroup-v1 memory
# group and prints what the group was charged: anon + shmem (memory.stat total_rss +
# total_shmem) sampled every 50 ms, mean and peak, and the program's CPU time (user +
# system of the run and its reaped children). A meter that does not depend on which pages
# are mapped (issue 13): memfd pages nobody maps are still charged here.
#
#   bench/run/honest.sh MODE PROGRAM [ARGS...]     e.g. honest.sh cow Rscript --vanilla bench/run/b25_sort.R
#
# Prints one line: mode mean_mib peak_mib cpu_s samples. ADVM (default: advm on PATH)
# names the advm binary; ADVM_RUN_FLAGS adds flags to `advm run` (e.g. --stats).
set -euo pipefail
mode=$1; shift
advm=${ADVM:-advm}
root=/sys/fs/cgroup/memory
[ -w "$root" ] || { echo "honest.sh: $root is not a writable cgroup-v1 memory hierarchy" >&2; exit 2; }
grp=$root/advm-honest-$$
mkdir "$grp"
trap 'rmdir "$grp" 2>/dev/null || true' EXIT
out=$(mktemp)
# the shell joins the group first, so the program and everything it starts are charged there
bash -c 'echo $$ > "$1/cgroup.procs"; shift; "$@" >/dev/null; times' _ "$grp" \
    "$advm" run --mode "$mode" ${ADVM_RUN_FLAGS:-} -- "$@" >"$out" &
pid=$!
exec {tick}<> <(:)
n=0 sum=0 peak=0
while kill -0 "$pid" 2>/dev/null; do
    rss=0 shm=0
    while read -r k v; do
        case $k in total_rss) rss=$v ;; total_shmem) shm=$v ;; esac
    done <"$grp/memory.stat"
    b=$((rss + shm))
    if [ "$b" -gt 0 ]; then
        n=$((n + 1)) sum=$((sum + b))
        [ "$b" -gt "$peak" ] && peak=$b
    fi
    read -r -t 0.05 -u "$tick" || true
done
wait "$pid"
# `times` prints the shell's own line, then its children's: "0m1.234s 0m0.567s"
cpu=$(sed -n 2p "$out" | sed 's/m/ /g; s/s//g' | awk '{print $1*60+$2+$3*60+$4}')
rm -f "$out"
awk -v m="$mode" -v n="$n" -v s="$sum" -v p="$peak" -v c="$cpu" \
    'BEGIN { printf "%s %.1f %.1f %.2f %d\n", m, n ? s / n / 1048576 : 0, p / 1048576, c, n }'
