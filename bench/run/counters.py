#!/usr/bin/env python3
# counters.py: where a shim setting spends its time on the R workloads, with counts that
# the load of a shared machine disturbs less than elapsed or CPU time (docs/run.md,
# "Where vcopy's time goes").
#
#   bench/run/counters.py PASSES WORKLOADS VARIANT...
#     WORKLOADS: all, or a comma list (b25_matrix,ml_svm)
#     VARIANT:   name:mode[:ENV=V,ENV=V], as in sweep.py; mode off runs R without the shim
#
# Each run is `perf stat` over `advm run --mode MODE -- Rscript --vanilla W.R` (ADVM names
# the binary; default advm on PATH): user and system time, page faults and the count of
# each memory system call the shim makes. Passes interleave the variants per workload;
# the table gives medians per workload, then the sum over the workloads of each median.
import os, subprocess, json
from variants import A, B, env, interleave, med, parse
passes, ws, vs = parse()
calls = ['mmap', 'mremap', 'madvise', 'fallocate', 'pwrite64', 'pread64']
events = ['user_time', 'system_time', 'page-faults'] + ['syscalls:sys_enter_' + c for c in calls]
short = ['user', 'sys', 'faults'] + calls
def run(w, mode, extra):
    e = env(extra)
    cmd = ['perf', 'stat', '-x', ',', '-e', ','.join(events), A, 'run', '--mode', mode, '--',
           'Rscript', '--vanilla', '%s/%s.R' % (B, w)]
    r = subprocess.run(cmd, env=e, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    out = {}
    for line in r.stderr.splitlines():
        f = line.split(',')
        if len(f) > 2 and f[2] in events:
            out[short[events.index(f[2])]] = float(f[0]) if f[0][0].isdigit() else float('nan')
    out['user'] /= 1e9
    out['sys'] /= 1e9
    return out
res = interleave(passes, ws, vs, run)
tot = {n: {k: 0.0 for k in short} for n, _, _ in vs}
for w in ws:
    for n, _, _ in vs:
        m = {k: med([r[k] for r in res[w][n]]) for k in short}
        for k in short: tot[n][k] += m[k]
        print('%-16s %-10s ' % (w, n) + ' '.join('%s %.2f' % (k, m[k]) if k in ('user', 'sys') else '%s %d' % (k, m[k]) for k in short))
for n, _, _ in vs:
    print('%-16s %-10s ' % ('SUM', n) + ' '.join('%s %.2f' % (k, tot[n][k]) if k in ('user', 'sys') else '%s %d' % (k, tot[n][k]) for k in short))
if os.environ.get('COUNTERS_JSON'): json.dump(res, open(os.environ['COUNTERS_JSON'], 'w'))
