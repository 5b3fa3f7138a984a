#!/usr/bin/env python3
# sweep.py: compares shim settings on the R workloads with the cgroup meter (docs/run.md,
# "Smaller free cache").
#
#   bench/run/sweep.py PASSES WORKLOADS VARIANT...
#     WORKLOADS: all, or a comma list (b25_matrix,ml_svm)
#     VARIANT:   name:mode[:ENV=V,ENV=V], e.g. off:off vcopy:vcopy d250:vcopy:ADVM_DIRTY_DECAY_MS=250
#
# Each run of `advm run --mode MODE` (ADVM names the binary; default advm on PATH) gets its
# own cgroup-v1 memory group, sampled every 100 ms (total_rss + total_shmem: mean and
# peak); CPU time is the run's user + system (wait4), system time also alone. Passes
# interleave every variant per workload; figures are medians relative to the first
# variant, then geometric means. SWEEP_JSON=FILE keeps every run, rewritten after each.
import os, time, math, json
from variants import A, B, env, interleave, med, parse
passes, ws, vs = parse()
root = '/sys/fs/cgroup/memory'
def run(w, mode, extra):
    g = '%s/advm-sweep-%d' % (root, os.getpid())
    os.mkdir(g)
    e = env(extra)
    pid = os.fork()
    if pid == 0:
        open(g + '/cgroup.procs', 'w').write(str(os.getpid()))
        fd = os.open('/dev/null', os.O_WRONLY); os.dup2(fd, 1); os.dup2(fd, 2)
        os.execvpe(A, [A, 'run', '--mode', mode, '--', 'Rscript', '--vanilla', '%s/%s.R' % (B, w)], e)
    s = []
    while True:
        r = os.wait4(pid, os.WNOHANG)
        if r[0] == pid: break
        d = {}
        for line in open(g + '/memory.stat'):
            k, v = line.split(); d[k] = int(v)
        b = d['total_rss'] + d['total_shmem']
        if b > 0: s.append(b)
        time.sleep(0.1)
    ru = r[2]
    for _ in range(50):
        try: os.rmdir(g); break
        except OSError: time.sleep(0.05)
    return sum(s) / len(s) / 2**20 if s else float('nan'), max(s) / 2**20 if s else float('nan'), ru.ru_utime + ru.ru_stime, ru.ru_stime
keep = lambda res: json.dump(res, open(os.environ['SWEEP_JSON'], 'w'))
res = interleave(passes, ws, vs, run, keep if os.environ.get('SWEEP_JSON') else None)
base = vs[0][0]
geo = {n: [[], [], [], []] for n, _, _ in vs}
for w in ws:
    line = '%-16s' % w
    b = [med([r[i] for r in res[w][base]]) for i in range(4)]
    for n, _, _ in vs:
        m = [med([r[i] for r in res[w][n]]) for i in range(4)]
        for i in range(4): geo[n][i].append(m[i] / b[i])
        line += ' | %s %5.1f%% pk %5.1f%% cpu %5.1f%% sys %5.1f%%' % (n, 100 * m[0] / b[0], 100 * m[1] / b[1], 100 * m[2] / b[2], 100 * m[3] / b[3]) if n != base else ' | %s %.0f MiB %.2fs sys %.2fs' % (n, m[0], m[2], m[3])
    print(line)
gm = lambda x: 100 * math.exp(sum(map(math.log, x)) / len(x))
print('geomean: ' + ' | '.join('%s mean %.1f%% peak %.1f%% cpu %.1f%% sys %.1f%%' % (n, gm(g[0]), gm(g[1]), gm(g[2]), gm(g[3])) for n, g in geo.items()))
