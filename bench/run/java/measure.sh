#!/bin/bash
# measure.sh: what `advm run` gives a JVM, side by side (run it under
# `flock -o /work/bench.lock`): two rounds of 4 JVMs (`serve`, G1) untouched against
# merge mode through a private advmd (four.sh), then three rounds of the array-copy
# program untouched against vcopy (copyrun.sh). ADVM: the advm binary (release build);
# CLS: the directory with AdvmJava.class.
set -euo pipefail
here=$(dirname "$0")
uptime
echo "# mode jvms distinct_mib cgroup_mib"
for r in 1 2; do
    for m in off merge; do "$here/four.sh" "$m" 4 12 -XX:+UseG1GC; done
done
echo "# mode wall_s cpu_s distinct_mean_mib cgroup_mean_mib cgroup_peak_mib"
for r in 1 2 3; do
    for m in off vcopy; do "$here/copyrun.sh" "$m" -XX:+UseG1GC -cp "$CLS" AdvmJava copy 64; done
done
uptime
