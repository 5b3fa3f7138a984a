// Java workloads for `advm run` (crates/advm-cli/tests/java_run.rs, bench/run/java).
// Each prints one deterministic line per check, so a run under any mode must print
// exactly what the plain run prints; a wrong byte prints "BAD" and exits 3.
//
//   java AdvmJava copy MIB        System.arraycopy, Arrays.copyOf, clone of large arrays
//   java AdvmJava threads N MIB   N threads allocating, copying and checking arrays
//   java AdvmJava fork N          N child processes (ProcessBuilder) while threads allocate
//   java AdvmJava heap MIB        MIB of live arrays, GC churn, all checked
//   java AdvmJava direct MIB      direct ByteBuffers: fill, copy direct<->direct<->heap
//   java AdvmJava file PATH       read a file with readAllBytes, FileInputStream, a channel
//   java AdvmJava hold MIB SECS   MIB of duplicate content (same bytes twice), then SECS of
//                                 writes and GC churn checked against a shadow: the merge case
//                                 (SECS 0: until a line or the end of stdin)
//   java AdvmJava signals N       N stack overflows and N*1000 implicit null checks caught
//                                 (HotSpot's SIGSEGV handling), safepoints from 4 threads
//   java AdvmJava suite           copy 16, threads 4 4, fork 4, direct 16, heap 32,
//                                 signals 5 in one JVM (the test's quick run)
//   java AdvmJava serve MIB SECS  a service's state, the same in every JVM started alike:
//                                 MIB of float tables in 1 MiB arrays and a map of 200000
//                                 small objects; then SECS of light reads (4 JVMs: bench)
import java.io.*;
import java.nio.*;
import java.nio.channels.FileChannel;
import java.nio.file.*;
import java.util.*;
import java.util.concurrent.*;
import java.util.concurrent.atomic.*;

public class AdvmJava {
    static final int MIB = 1 << 20;

    static void fill(byte[] a, long seed) {
        long x = seed * 0x9E3779B97F4A7C15L + 1;
        for (int i = 0; i < a.length; i += 8) {
            x ^= x << 13; x ^= x >>> 7; x ^= x << 17;
            for (int j = 0; j < 8 && i + j < a.length; j++) a[i + j] = (byte) (x >>> (8 * j));
        }
    }

    static long sum(byte[] a) {
        long h = 1469598103934665603L;
        for (int i = 0; i < a.length; i += 4096) h = (h ^ (a[i] & 0xff)) * 1099511628211L;
        long s = 0;
        for (byte b : a) s += b;
        return h ^ s;
    }

    static void check(boolean ok, String what) {
        if (!ok) {
            System.out.println("BAD " + what);
            System.out.flush();
            System.exit(3);
        }
    }

    static void copy(int mib) {
        byte[] a = new byte[mib * MIB];
        fill(a, 1);
        long s = sum(a);
        for (int r = 0; r < 8; r++) {
            byte[] b = new byte[a.length];
            System.arraycopy(a, 0, b, 0, a.length);
            check(Arrays.equals(a, b), "arraycopy");
            byte[] c = Arrays.copyOf(a, a.length);
            byte[] d = a.clone();
            c[r * 4096] ^= 1;
            check(sum(a) == s && sum(d) == s && sum(c) != s, "copyOf/clone " + r);
            long[] l = new long[mib * MIB / 8];
            for (int i = 0; i < l.length; i++) l[i] = i * 31L + r;
            long[] m = l.clone();
            m[0] = -1;
            check(l[0] == r && m[l.length - 1] == l[l.length - 1], "long clone");
        }
        System.out.println("copy " + mib + " MiB sum " + s);
    }

    static void threads(int n, int mib) throws Exception {
        ExecutorService ex = Executors.newFixedThreadPool(n);
        List<Future<Long>> fs = new ArrayList<>();
        for (int t = 0; t < n; t++) {
            final int id = t;
            fs.add(ex.submit(() -> {
                long total = 0;
                for (int r = 0; r < 6; r++) {
                    byte[] a = new byte[mib * MIB];
                    fill(a, id * 100 + r);
                    byte[] b = Arrays.copyOf(a, a.length);
                    ByteBuffer d = ByteBuffer.allocateDirect(a.length);
                    d.put(b).flip();
                    byte[] c = new byte[a.length];
                    d.get(c);
                    check(Arrays.equals(a, c), "thread " + id);
                    total += sum(c);
                }
                return total;
            }));
        }
        long s = 0;
        for (Future<Long> f : fs) s += f.get();
        ex.shutdown();
        System.out.println("threads " + n + " sum " + s);
    }

    static void fork(int n) throws Exception {
        AtomicBoolean stop = new AtomicBoolean();
        Thread churn = new Thread(() -> {
            while (!stop.get()) {
                byte[] a = new byte[8 * MIB];
                fill(a, 5);
                check(sum(Arrays.copyOf(a, a.length)) == sum(a), "churn");
            }
        });
        churn.start();
        int ok = 0;
        for (int i = 0; i < n; i++) {
            Process p = new ProcessBuilder("sh", "-c", "echo child " + i).redirectErrorStream(true).start();
            String line = new BufferedReader(new InputStreamReader(p.getInputStream())).readLine();
            if (p.waitFor() == 0 && ("child " + i).equals(line)) ok++;
        }
        stop.set(true);
        churn.join();
        System.out.println("fork " + ok + "/" + n);
    }

    static void heap(int mib) {
        byte[][] live = new byte[mib][];
        for (int i = 0; i < mib; i++) {
            live[i] = new byte[MIB];
            fill(live[i], i);
        }
        long s = 0;
        for (int r = 0; r < 3; r++) {
            for (int i = r; i < mib; i += 3) {
                byte[] g = new byte[MIB];  // garbage, so the collector runs and moves
                fill(g, i);
                live[i] = g;
            }
            System.gc();
        }
        for (int i = 0; i < mib; i++) {
            byte[] e = new byte[MIB];
            fill(e, i);
            check(Arrays.equals(e, live[i]), "heap " + i);
            s += sum(live[i]);
        }
        System.out.println("heap " + mib + " MiB sum " + s);
    }

    static void direct(int mib) {
        byte[] a = new byte[mib * MIB];
        fill(a, 7);
        ByteBuffer d1 = ByteBuffer.allocateDirect(a.length);
        d1.put(a).flip();
        ByteBuffer d2 = ByteBuffer.allocateDirect(a.length);
        for (int r = 0; r < 8; r++) {
            d2.clear();
            d1.rewind();
            d2.put(d1).flip();
            d2.put(r * 4096, (byte) (d2.get(r * 4096) ^ 1));
            d2.put(r * 4096, (byte) (d2.get(r * 4096) ^ 1));
        }
        byte[] b = new byte[a.length];
        d2.get(b);
        check(Arrays.equals(a, b), "direct");
        System.out.println("direct " + mib + " MiB sum " + sum(b));
    }

    static void file(String path) throws Exception {
        byte[] a = Files.readAllBytes(Paths.get(path));
        byte[] b = new byte[a.length];
        try (FileInputStream in = new FileInputStream(path)) {
            int off = 0;
            while (off < b.length) off += in.read(b, off, b.length - off);
        }
        ByteBuffer d = ByteBuffer.allocateDirect(a.length);
        try (FileChannel ch = FileChannel.open(Paths.get(path))) {
            while (d.hasRemaining() && ch.read(d) > 0) { }
        }
        d.flip();
        byte[] c = new byte[a.length];
        d.get(c);
        check(Arrays.equals(a, b) && Arrays.equals(a, c), "file");
        System.out.println("file " + a.length + " bytes sum " + sum(a));
    }

    // The same MIB twice (so a merge has pages to share), then writers change a few
    // bytes here and there while garbage makes the collector copy objects; every array
    // is checked against a shadow of what was written.
    static void hold(int mib, double secs) throws Exception {
        int n = mib / 2;
        byte[][] data = new byte[2 * n][];
        for (int i = 0; i < 2 * n; i++) {
            data[i] = new byte[MIB];
            fill(data[i], i % n);
        }
        int[][] shadow = new int[2 * n][64]; // bytes written at 64 places per array
        Object[] locks = new Object[2 * n];
        for (int i = 0; i < 2 * n; i++) locks[i] = new Object();
        System.out.println("ready");
        System.out.flush();
        long end = System.nanoTime() + (long) (secs * 1e9);
        AtomicBoolean stop = new AtomicBoolean();
        int writers = 4;
        Thread[] ts = new Thread[writers];
        AtomicLong writes = new AtomicLong();
        for (int t = 0; t < writers; t++) {
            final int id = t;
            ts[t] = new Thread(() -> {
                Random rnd = new Random(id);
                List<byte[]> junk = new ArrayList<>();
                while (secs > 0 ? System.nanoTime() < end : !stop.get()) {
                    int i = rnd.nextInt(2 * n);
                    int k = rnd.nextInt(64);
                    synchronized (locks[i]) {
                        int v = shadow[i][k] + 1;
                        data[i][k * (MIB / 64) + (k & 4095)] = (byte) v;
                        shadow[i][k] = v;
                    }
                    writes.incrementAndGet();
                    junk.add(new byte[64 * 1024]);
                    if (junk.size() > 64) junk.clear();
                    if (rnd.nextInt(2000) == 0) {
                        // replace an array by a moved copy: the collector and the program
                        // both move content while the agent may be merging it
                        synchronized (locks[i]) { data[i] = data[i].clone(); }
                    }
                }
            });
            ts[t].start();
        }
        if (secs <= 0) {
            new BufferedReader(new InputStreamReader(System.in)).readLine();
            stop.set(true);
        }
        for (Thread t : ts) t.join();
        long s = 0;
        for (int i = 0; i < 2 * n; i++) {
            byte[] e = new byte[MIB];
            fill(e, i % n);
            for (int k = 0; k < 64; k++) {
                if (shadow[i][k] != 0) e[k * (MIB / 64) + (k & 4095)] = (byte) shadow[i][k];
            }
            check(Arrays.equals(e, data[i]), "hold " + i);
            s += sum(e);
        }
        System.out.println("hold " + mib + " MiB ok");
        System.err.println("hold: " + writes.get() + " writes, sum " + s);
    }

    static void serve(int mib, double secs) throws Exception {
        float[][] tables = new float[mib][];
        for (int i = 0; i < mib; i++) {
            tables[i] = new float[MIB / 4];
            for (int j = 0; j < tables[i].length; j++) tables[i][j] = (float) Math.sin(i * 7919 + j);
        }
        Map<String, int[]> index = new HashMap<>();
        for (int i = 0; i < 200000; i++) index.put("key-" + i, new int[] {i, i * 3, i * 7});
        System.out.println("ready");
        System.out.flush();
        long end = System.nanoTime() + (long) (secs * 1e9);
        Random rnd = new Random(1);
        double acc = 0;
        while (System.nanoTime() < end) {
            for (int k = 0; k < 1000; k++) {
                int[] v = index.get("key-" + rnd.nextInt(200000));
                acc += tables[v[0] % mib][v[1] % (MIB / 4)];
            }
            Thread.sleep(10);
        }
        double sum = 0;
        for (float[] t : tables) for (float f : t) sum += f;
        System.out.println("serve " + mib + " MiB sum " + sum + " entries " + index.size());
        System.err.println("serve: acc " + acc);
    }

    static int depth(int n) { return n == Integer.MIN_VALUE ? 0 : depth(n + 1) + 1; }

    static int len(int[] a) { return a.length; }

    static void signals(int n) throws Exception {
        int overflows = 0, npes = 0;
        AtomicBoolean stop = new AtomicBoolean();
        Thread[] ts = new Thread[4];
        for (int t = 0; t < ts.length; t++) {
            ts[t] = new Thread(() -> { while (!stop.get()) { byte[] g = new byte[1 << 16]; g[1] = 1; } });
            ts[t].start();
        }
        for (int i = 0; i < n; i++) {
            try { depth(0); } catch (StackOverflowError e) { overflows++; }
            int[][] arrays = { new int[3], null };
            for (int k = 0; k < 1000; k++) {
                try { len(arrays[k & 1]); } catch (NullPointerException e) { npes++; }
            }
            System.gc(); // a safepoint: the VM thread polls every Java thread
        }
        stop.set(true);
        for (Thread t : ts) t.join();
        System.out.println("signals " + overflows + " overflows " + npes + " null checks");
    }

    public static void main(String[] args) throws Exception {
        switch (args[0]) {
            case "copy": copy(Integer.parseInt(args[1])); break;
            case "threads": threads(Integer.parseInt(args[1]), Integer.parseInt(args[2])); break;
            case "fork": fork(Integer.parseInt(args[1])); break;
            case "heap": heap(Integer.parseInt(args[1])); break;
            case "direct": direct(Integer.parseInt(args[1])); break;
            case "file": file(args[1]); break;
            case "suite":
                copy(16); threads(4, 4); fork(4); direct(16); heap(32); signals(5);
                break;
            case "signals": signals(Integer.parseInt(args[1])); break;
            case "serve": serve(Integer.parseInt(args[1]), Double.parseDouble(args[2])); break;
            case "hold": hold(Integer.parseInt(args[1]), Double.parseDouble(args[2])); break;
            default: throw new IllegalArgumentException(args[0]);
        }
    }
}
