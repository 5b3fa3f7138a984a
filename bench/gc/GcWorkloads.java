// The GC benchmark's workloads in Java, the same shapes as bench/gc/workloads.rs, for
// OpenJDK's collectors. Usage: java GcWorkloads NAME quick|full. Prints the checksum
// and "elapsed_s SECONDS".
import java.util.Arrays;

public class GcWorkloads {
    static final class Node {
        Node left, right;
        long i, j;
    }

    static long rng = 1;

    static long next() {
        rng ^= rng >>> 12;
        rng ^= rng << 25;
        rng ^= rng >>> 27;
        return rng * 0x2545F4914F6CDD1DL;
    }

    static int below(int n) {
        return (int) Long.remainderUnsigned(next(), n);
    }

    static long mix(long h, long v) {
        return Long.rotateLeft((h ^ v) * 0x100000001b3L, 5);
    }

    static Node makeTree(int d) {
        Node n = new Node();
        if (d > 0) {
            n.left = makeTree(d - 1);
            n.right = makeTree(d - 1);
        }
        return n;
    }

    static void populate(int d, Node n) {
        if (d <= 0) return;
        n.left = new Node();
        n.right = new Node();
        populate(d - 1, n.left);
        populate(d - 1, n.right);
    }

    static long count(Node n) {
        return n == null ? 0 : 1 + count(n.left) + count(n.right);
    }

    static long gcbench(boolean q) {
        int stretch = q ? 12 : 16, lng = q ? 10 : 14, array = q ? 50_000 : 500_000, maxd = q ? 10 : 14;
        makeTree(stretch);
        Node lt = new Node();
        populate(lng, lt);
        double[] arr = new double[array];
        for (int i = 0; i < array / 2; i++) arr[i] = 1.0 / Math.max(i, 1);
        long sum = 0;
        for (int d = 4; d <= maxd; d += 2) {
            long iters = 2 * ((1L << (stretch + 1)) - 1) / ((1L << (d + 1)) - 1);
            for (long k = 0; k < iters; k++) {
                Node t = new Node();
                populate(d, t);
                sum += makeTree(d) != null ? 1 : 0;
            }
        }
        return mix(mix(sum, count(lt)), arr[1000] == 1.0 / 1000 ? 1 : 0);
    }

    static long binaryTrees(boolean q) {
        int n = q ? 10 : 15;
        long h = count(makeTree(n + 1));
        Node lng = makeTree(n);
        for (int d = 4; d <= n; d += 2) {
            long iters = 1L << (n - d + 4), c = 0;
            for (long k = 0; k < iters; k++) c += count(makeTree(d));
            h = mix(h, c);
        }
        return mix(h, count(lng));
    }

    static long sparseLarge(boolean q) {
        final int chunk = 6400;
        int chunks = q ? 24 : 160, iters = q ? 8 : 24, n = chunks * chunk / 8;
        double[] x = new double[n];
        for (int i = 0; i < n; i++) x[i] = (i % 7) + 0.5;
        long h = 0;
        Object[] keep = new Object[8];
        for (int it = 0; it < iters; it++) {
            double[][] mat = new double[chunks][];
            for (int c = 0; c < chunks; c++) {
                long seed = next();
                double[] v = new double[chunk];
                for (int i = 0; i < chunk; i++)
                    v[i] = i % 2 == 0 ? ((seed >>> (i % 32)) & 0xff) / 16.0
                                      : (double) Long.remainderUnsigned(seed + (long) i * 2654435761L, n);
                mat[c] = v;
                for (int t = 0; t < 8; t++) keep[t] = new long[3];
            }
            double y = 0;
            for (int r = 0; r < 4; r++)
                for (double[] v : mat)
                    for (int i = 0; i < chunk; i += 2) y += v[i] * x[(int) v[i + 1]];
            h = mix(h, (long) y + it);
        }
        return h;
    }

    static void fft(double[] re, double[] im) {
        int n = re.length;
        for (int i = 1, j = 0; i < n; i++) {
            int bit = n >> 1;
            for (; (j & bit) != 0; bit >>= 1) j ^= bit;
            j |= bit;
            if (i < j) {
                double t = re[i]; re[i] = re[j]; re[j] = t;
                t = im[i]; im[i] = im[j]; im[j] = t;
            }
        }
        for (int len = 2; len <= n; len <<= 1) {
            double ang = -2 * Math.PI / len;
            for (int s = 0; s < n; s += len)
                for (int k = 0; k < len / 2; k++) {
                    double wr = Math.cos(ang * k), wi = Math.sin(ang * k);
                    int a = s + k, b = s + k + len / 2;
                    double tr = re[b] * wr - im[b] * wi, ti = re[b] * wi + im[b] * wr;
                    re[b] = re[a] - tr; im[b] = im[a] - ti;
                    re[a] += tr; im[a] += ti;
                }
        }
    }

    static long fftLarge(boolean q) {
        final int points = 4096;
        int window = q ? 16 : 64, iters = q ? 120 : 1200;
        double[][] win = new double[window][];
        long h = 0;
        Object tmp = null;
        for (int it = 0; it < iters; it++) {
            double[] a = new double[2 * points];
            for (int i = 0; i < 2 * points; i++) a[i] = (i * 31 + it) % 17;
            double[] re = new double[points], im = new double[points];
            for (int i = 0; i < points; i++) { re[i] = a[2 * i]; im[i] = a[2 * i + 1]; }
            fft(re, im);
            for (int i = 0; i < points; i++) { a[2 * i] = re[i]; a[2 * i + 1] = im[i]; }
            h = mix(h, Double.doubleToLongBits(re[1]) >>> 20);
            win[it % window] = a;
            tmp = new byte[200];
        }
        return h + (tmp == null ? 1 : 0);
    }

    static long sigverify(boolean q, int size) {
        if (q) size /= 4;
        int rounds = q ? 6 : 10;
        byte[][] win = new byte[2][];
        byte[] block = new byte[65536];
        for (int i = 0; i < 65536; i++) block[i] = (byte) ((i * 2654435761L) >>> 24);
        long h = 0;
        Object keep = null;
        for (int r = 0; r < rounds; r++) {
            byte[] msg = new byte[size];
            for (int off = 0; off < size; off += 65536) System.arraycopy(block, 0, msg, off, Math.min(65536, size - off));
            msg[0] = (byte) r;
            long d = 0;
            for (int i = 0; i < size; i += 8) d = mix(d, msg[i] & 0xff);
            h = mix(h, d);
            for (int k = 0; k < 16; k++) keep = new long[9];
            win[r % 2] = msg;
        }
        return h + (keep == null ? 1 : 0);
    }

    static final class Entry {
        Entry prev, next;
        byte[] value;
        int key;
    }

    static long lruCache(boolean q) {
        int keys = q ? 512 : 4096, ops = q ? 3000 : 30000;
        long cap = q ? 6 << 20 : 48 << 20, bytes = 0, hits = 0, h = 0;
        rng = 7;
        Entry[] table = new Entry[keys];
        Entry head = null, tail = null;
        for (int o = 0; o < ops; o++) {
            int k = (int) ((long) below(keys) * below(keys) / keys);
            Entry e = table[k];
            if (e != null) {
                hits++;
                if (e.prev != null) e.prev.next = e.next; else head = e.next;
                if (e.next != null) e.next.prev = e.prev; else tail = e.prev;
                e.prev = null; e.next = head;
                if (head != null) head.prev = e; else tail = e;
                head = e;
                h = mix(h, e.value[0]);
                continue;
            }
            int size = (int) Math.exp(Long.remainderUnsigned(next(), 1_000_000) / 1e6 * 21 * Math.log(2));
            size = Math.max(1, Math.min(size, 2 << 20));
            e = new Entry();
            e.value = new byte[size];
            e.value[0] = (byte) (k ^ size);
            e.key = k;
            e.next = head;
            if (head != null) head.prev = e; else tail = e;
            head = e;
            table[k] = e;
            bytes += size;
            while (bytes > cap) {
                Entry last = tail;
                tail = last.prev;
                if (tail != null) tail.next = null; else head = null;
                table[last.key] = null;
                bytes -= last.value.length;
            }
        }
        return mix(h, hits);
    }

    static final class Box {
        long v;
    }

    static long growingSort(boolean q) {
        int rounds = q ? 8 : 24, step = q ? 3000 : 12000, n = 0;
        rng = 99;
        Box[] a = new Box[0];
        for (int r = 0; r < rounds; r++) {
            a = Arrays.copyOf(a, n + step);
            for (int i = n; i < n + step; i++) { a[i] = new Box(); a[i].v = next() >>> 16; }
            n += step;
            Arrays.sort(a, (x, y) -> Long.compare(x.v, y.v));
        }
        long h = 0;
        for (Box b : a) h = mix(h, b.v);
        return h;
    }

    static final class Ast {
        Ast child, sibling;
        long id, a, b;
    }

    static final class Result {
        Result next;
        long v, w;
    }

    static long compilerSawtooth(boolean q) {
        int units = q ? 12 : 60, nodes = q ? 12_000 : 60_000;
        rng = 5;
        Result results = null;
        for (int u = 0; u < units; u++) {
            Ast ast = null;
            Ast[] syms = new Ast[64];
            int nsyms = 0, n = nodes / 2 + below(nodes);
            for (int i = 0; i < n; i++) {
                Ast nd = new Ast();
                nd.id = i;
                nd.child = ast;
                if (below(4) == 0 && ast != null) nd.sibling = ast.child;
                ast = nd;
                if (i % 16 == 0) {
                    if (nsyms == syms.length) syms = Arrays.copyOf(syms, 2 * syms.length);
                    syms[nsyms++] = ast;
                }
            }
            Result r = new Result();
            r.v = u * 1000L + nsyms;
            r.next = results;
            results = r;
        }
        long h = 0;
        for (Result r = results; r != null; r = r.next) h = mix(h, r.v);
        return h;
    }

    static long primes(boolean q) {
        long limit = q ? 60_000 : 400_000, h = 0;
        long[] found = new long[1 << 16];
        int nf = 0;
        Result list = null;
        for (long c = 2; c < limit; c++) {
            boolean prime = true;
            for (int i = 0; i < nf && found[i] * found[i] <= c; i++)
                if (c % found[i] == 0) { prime = false; break; }
            if (prime) {
                if (nf == found.length) found = Arrays.copyOf(found, 2 * nf);
                found[nf++] = c;
                Result b = new Result();
                b.v = c;
                b.next = list;
                list = b;
                h = mix(h, c);
            }
        }
        return mix(h, nf);
    }

    public static void main(String[] args) {
        boolean q = args.length > 1 && args[1].equals("quick");
        long t = System.nanoTime();
        long sum;
        switch (args[0]) {
            case "gcbench": sum = gcbench(q); break;
            case "binary-trees": sum = binaryTrees(q); break;
            case "sparse-large": sum = sparseLarge(q); break;
            case "fft-large": sum = fftLarge(q); break;
            case "sigverify-1m": sum = sigverify(q, 1 << 20); break;
            case "sigverify-10m": sum = sigverify(q, 10 << 20); break;
            case "sigverify-100m": sum = sigverify(q, 100 << 20); break;
            case "lru-cache": sum = lruCache(q); break;
            case "growing-sort": sum = growingSort(q); break;
            case "compiler-sawtooth": sum = compilerSawtooth(q); break;
            case "primes": sum = primes(q); break;
            default: throw new IllegalArgumentException("no workload " + args[0]);
        }
        System.out.println("checksum " + sum);
        System.out.println("elapsed_s " + (System.nanoTime() - t) / 1e9);
    }
}
