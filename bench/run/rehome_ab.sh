#!/bin/sh
# A/B of the shim's virtual copy cost on the single-threaded path: builds the shim of
# git revision A (default: the parent of HEAD) and of the work tree, then runs
# bench/run/rehome_cost.c under each in turn, ROUNDS times (default 5), under the
# shared bench lock, alone and beside an idle thread ("+thread"). Prints one line per
# run: build, case, median microseconds.
#   bench/run/rehome_ab.sh [A [ROUNDS]]
set -eu
top=$(git rev-parse --show-toplevel)
a=${1:-HEAD~1}
rounds=${2:-5}
tmp=$(mktemp -d /tmp/rehome_ab.XXXXXX)
trap 'rm -rf "$tmp"' EXIT
mkdir "$tmp/a" "$tmp/b"
git -C "$top" archive "$a" crates/advm-preload/csrc | tar -x -C "$tmp/a" --strip-components=3
cp "$top"/crates/advm-preload/csrc/* "$tmp/b/"
for v in a b; do
    cc -shared -fPIC -O2 -g -std=gnu11 -Wall -Wextra -fno-tree-loop-distribute-patterns \
        -fvisibility=hidden "$tmp/$v"/*.c -o "$tmp/$v.so" -ldl -pthread
done
cc -std=gnu11 -O1 -fno-builtin -pthread "$top/bench/run/rehome_cost.c" -o "$tmp/rehome_cost"
uptime
flock -o /work/bench.lock sh -c "
    for r in \$(seq $rounds); do
        for v in a b; do
            LD_PRELOAD=$tmp/\$v.so ADVM_MODE=vcopy $tmp/rehome_cost | sed \"s/^/\$v /\"
            LD_PRELOAD=$tmp/\$v.so ADVM_MODE=vcopy $tmp/rehome_cost thread | sed \"s/^/\$v /; s/ \\([0-9.]*\\)\$/+thread \\1/\"
        done
    done"
uptime
