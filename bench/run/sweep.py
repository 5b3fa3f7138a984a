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
import os, sys, time, math, json
A = os.environ.get('ADVM', 'advm')
B = os.path.dirname(os.path.abspath(__file__))
passes = int(sys.argv[1])
allw = ['b25_matrix', 'b25_sort', 'b25_vector', 'ml_randomforest', 'ml_lssvm', 'ml_svm', 'ml_rpart', 'ml_nnet', 'ml_gbm', 'ml_knn', 'ml_glmnet']
ws = allw if sys.argv[2] == 'all' else sys.argv[2].split(',')
vs = []
for v in sys.argv[3:]:
    p = v.split(':', 2)
    env = dict(kv.split('=', 1) for kv in p[2].split(',')) if len(p) > 2 and p[2] else {}
    vs.append((p[0], p[1], env))
root = '/sys/fs/cgroup/memory'
def run(w, mode, env):
    g = '%s/advm-sweep-%d' % (root, os.getpid())
    os.mkdir(g)
    e = dict(os.environ, ADVM_BENCH_DIR=B, ADVM_BENCH_SCALE='1', **env)
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
res = {}
for p in range(passes):
    for w in ws:
        for name, mode, env in vs:
            res.setdefault(w, {}).setdefault(name, []).append(run(w, mode, env))
            if os.environ.get('SWEEP_JSON'): json.dump(res, open(os.environ['SWEEP_JSON'], 'w'))
med = lambda x: sorted(x)[len(x) // 2] if len(x) % 2 else (sorted(x)[len(x)//2-1] + sorted(x)[len(x)//2]) / 2
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
