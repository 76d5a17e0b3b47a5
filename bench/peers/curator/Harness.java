// The ZooKeeper peer of distlock-bench: Apache Curator's InterProcessMutex, driven by the bench
// over stdin/stdout (the protocol is in bench/peers/README.md). It measures and prints raw
// numbers only; the bench computes every statistic itself.
//
// Built against Debian's jars (libcurator-recipes-java, whose manifest names the rest):
//
//   javac -d target/peers/curator -cp /usr/share/java/curator-recipes.jar Harness.java
//   java -cp target/peers/curator:/usr/share/java/curator-recipes.jar:/usr/share/java/slf4j-nop.jar \
//        Harness 127.0.0.1:2181
//
// Every contender is a thread with its own CuratorFramework client (its own ZooKeeper
// session), as separate processes would have. Times come from System.nanoTime(), one monotonic
// clock for every thread.

import java.io.BufferedReader;
import java.io.InputStream;
import java.io.InputStreamReader;
import java.io.PrintStream;
import java.nio.charset.StandardCharsets;
import java.util.ArrayList;
import java.util.List;
import java.util.Properties;
import java.util.concurrent.CountDownLatch;
import java.util.concurrent.ThreadLocalRandom;
import java.util.concurrent.TimeUnit;
import java.util.concurrent.atomic.AtomicBoolean;
import java.util.concurrent.atomic.AtomicInteger;
import java.util.concurrent.atomic.AtomicLong;
import java.util.concurrent.atomic.AtomicReference;

import org.apache.curator.framework.CuratorFramework;
import org.apache.curator.framework.CuratorFrameworkFactory;
import org.apache.curator.framework.recipes.leader.LeaderLatch;
import org.apache.curator.framework.recipes.leader.Participant;
import org.apache.curator.framework.recipes.locks.InterProcessMutex;
import org.apache.curator.framework.recipes.locks.InterProcessSemaphoreV2;
import org.apache.curator.framework.recipes.locks.Lease;
import org.apache.curator.retry.ExponentialBackoffRetry;

public final class Harness {
    private static String connect;
    private static final PrintStream OUT =
            new PrintStream(System.out, false, StandardCharsets.UTF_8);

    /** A client with Curator's usual settings: 60 s session, 15 s connection timeout. */
    private static CuratorFramework client() throws Exception {
        return client(60_000);
    }

    /** A client whose session times out after {@code sessionMs}. */
    private static CuratorFramework client(int sessionMs) throws Exception {
        CuratorFramework c = CuratorFrameworkFactory.newClient(
                connect, sessionMs, 15_000, new ExponentialBackoffRetry(100, 3));
        c.start();
        if (!c.blockUntilConnected(10, TimeUnit.SECONDS)) {
            c.close();
            throw new Exception("no ZooKeeper connection to " + connect + " within 10 s");
        }
        return c;
    }

    private static List<CuratorFramework> clients(int n) throws Exception {
        List<CuratorFramework> out = new ArrayList<>();
        try {
            for (int i = 0; i < n; i++) {
                out.add(client());
            }
        } catch (Exception e) {
            close(out);
            throw e;
        }
        return out;
    }

    private static void close(List<CuratorFramework> cs) {
        for (CuratorFramework c : cs) {
            c.close();
        }
    }

    private static String path(String name) {
        return "/" + name;
    }

    /** A growable array of longs, printed as a JSON array. */
    private static final class Longs {
        private long[] v = new long[1024];
        private int n;

        void add(long x) {
            if (n == v.length) {
                v = java.util.Arrays.copyOf(v, n * 2);
            }
            v[n++] = x;
        }

        void addAll(Longs o) {
            for (int i = 0; i < o.n; i++) {
                add(o.v[i]);
            }
        }

        String json() {
            StringBuilder b = new StringBuilder(n * 8 + 2).append('[');
            for (int i = 0; i < n; i++) {
                if (i > 0) {
                    b.append(',');
                }
                b.append(v[i]);
            }
            return b.append(']').toString();
        }
    }

    private static String quote(String s) {
        StringBuilder b = new StringBuilder("\"");
        for (char ch : s.toCharArray()) {
            switch (ch) {
                case '"' -> b.append("\\\"");
                case '\\' -> b.append("\\\\");
                default -> {
                    if (ch < 0x20) {
                        b.append(String.format("\\u%04x", (int) ch));
                    } else {
                        b.append(ch);
                    }
                }
            }
        }
        return b.append('"').toString();
    }

    private static void reply(String json) {
        OUT.println(json);
        OUT.flush();
    }

    /**
     * The cycle's client and mutexes, kept across cycle commands so that every slice runs
     * warm, as an application's long-lived client does.
     */
    private static CuratorFramework cycleClient;
    private static final java.util.Map<String, InterProcessMutex> CYCLE_MUTEXES =
            new java.util.HashMap<>();

    /** One client, acquire + release on one free name, for {@code millis}. */
    private static String cycle(String name, long millis) throws Exception {
        if (cycleClient == null) {
            cycleClient = client();
        }
        InterProcessMutex m = CYCLE_MUTEXES.get(name);
        if (m == null) {
            m = new InterProcessMutex(cycleClient, path(name));
            CYCLE_MUTEXES.put(name, m);
        }
        Longs ns = new Longs();
        long end = System.nanoTime() + TimeUnit.MILLISECONDS.toNanos(millis);
        while (true) {
            long t = System.nanoTime();
            m.acquire();
            m.release();
            long now = System.nanoTime();
            ns.add(now - t);
            if (now - end >= 0) {
                break;
            }
        }
        return "{\"cycle\":{\"ns\":" + ns.json() + "}}";
    }

    private static final java.util.Map<String, InterProcessSemaphoreV2> CYCLE_SEMAPHORES =
            new java.util.HashMap<>();

    /** One client, acquire + return one lease of a {@code max}-permit semaphore, for {@code millis}. */
    private static String permit(String name, int max, long millis) throws Exception {
        if (cycleClient == null) {
            cycleClient = client();
        }
        String key = name + "/" + max;
        InterProcessSemaphoreV2 s = CYCLE_SEMAPHORES.get(key);
        if (s == null) {
            s = new InterProcessSemaphoreV2(cycleClient, path(name), max);
            CYCLE_SEMAPHORES.put(key, s);
        }
        Longs ns = new Longs();
        long end = System.nanoTime() + TimeUnit.MILLISECONDS.toNanos(millis);
        while (true) {
            long t = System.nanoTime();
            Lease lease = s.acquire();
            s.returnLease(lease);
            long now = System.nanoTime();
            ns.add(now - t);
            if (now - end >= 0) {
                break;
            }
        }
        return "{\"cycle\":{\"ns\":" + ns.json() + "}}";
    }

    /** The latch this process campaigns with ({@code lead} or {@code follow}), and its client. */
    private static LeaderLatch latch;
    private static CuratorFramework latchClient;

    /** Campaigns for {@code name} as {@code value} on a session of {@code ttlMs}. */
    private static void campaign(String name, String value, int ttlMs) throws Exception {
        if (latch != null) {
            throw new Exception("this harness already campaigns");
        }
        latchClient = client(ttlMs);
        latch = new LeaderLatch(latchClient, path(name), value);
        latch.start();
    }

    /** Leads {@code name}, then holds leadership until this process is killed. */
    private static String lead(String name, String value, int ttlMs) throws Exception {
        campaign(name, value, ttlMs);
        if (!latch.await(30, TimeUnit.SECONDS)) {
            throw new Exception(name + ": not leading within 30 s");
        }
        return "{\"ok\":{}}";
    }

    /** Waits, polling every 10 ms, until the latch's participants name {@code value} leader. */
    private static String observe(String value) throws Exception {
        if (latch == null) {
            throw new Exception("observe before follow");
        }
        long end = System.nanoTime() + TimeUnit.SECONDS.toNanos(60);
        while (System.nanoTime() - end < 0) {
            Participant p = latch.getLeader();
            if (p != null && p.isLeader() && p.getId().equals(value)) {
                return "{\"ok\":{}}";
            }
            Thread.sleep(10);
        }
        throw new Exception(value + " not seen leading within 60 s");
    }

    private static String resign() throws Exception {
        if (latch != null) {
            latch.close();
            latchClient.close();
            latch = null;
        }
        return "{\"ok\":{}}";
    }

    /** When the last holder called release, and which contender it was. */
    private static final class Handoff {
        long releasedAt;
        int releaser = -1;
        boolean pending;
        final Longs ns = new Longs();
        long self;
    }

    /** {@code n} contenders on one name, each releasing as soon as it holds it. */
    private static String hot(String name, int n, long millis) throws Exception {
        List<CuratorFramework> cs = clients(n);
        try {
            AtomicBoolean stop = new AtomicBoolean();
            AtomicInteger holders = new AtomicInteger();
            AtomicLong violations = new AtomicLong();
            AtomicReference<Exception> failure = new AtomicReference<>();
            Handoff h = new Handoff();
            long[] grants = new long[n];
            Longs[] waits = new Longs[n];
            CountDownLatch start = new CountDownLatch(1);
            List<Thread> threads = new ArrayList<>();
            for (int i = 0; i < n; i++) {
                final int me = i;
                final InterProcessMutex m = new InterProcessMutex(cs.get(i), path(name));
                waits[i] = new Longs();
                Thread t = new Thread(() -> {
                    try {
                        start.await();
                        while (!stop.get()) {
                            long asked = System.nanoTime();
                            m.acquire();
                            long granted = System.nanoTime();
                            if (holders.incrementAndGet() != 1) {
                                violations.incrementAndGet();
                            }
                            grants[me]++;
                            waits[me].add(granted - asked);
                            synchronized (h) {
                                if (h.pending) {
                                    h.ns.add(granted - h.releasedAt);
                                    if (h.releaser == me) {
                                        h.self++;
                                    }
                                    h.pending = false;
                                }
                            }
                            holders.decrementAndGet();
                            synchronized (h) {
                                h.releasedAt = System.nanoTime();
                                h.releaser = me;
                                h.pending = true;
                            }
                            m.release();
                        }
                    } catch (Exception e) {
                        failure.compareAndSet(null, e);
                    }
                });
                threads.add(t);
                t.start();
            }
            long began = System.nanoTime();
            start.countDown();
            Thread.sleep(millis);
            stop.set(true);
            for (Thread t : threads) {
                t.join();
            }
            long elapsed = System.nanoTime() - began;
            if (failure.get() != null) {
                throw failure.get();
            }
            Longs g = new Longs();
            Longs w = new Longs();
            for (int i = 0; i < n; i++) {
                g.add(grants[i]);
                w.addAll(waits[i]);
            }
            return "{\"hot\":{\"grants\":" + g.json() + ",\"handoff_ns\":" + h.ns.json()
                    + ",\"wait_ns\":" + w.json() + ",\"self_regrants\":" + h.self
                    + ",\"violations\":" + violations.get() + ",\"elapsed_ns\":" + elapsed
                    + "}}";
        } finally {
            close(cs);
        }
    }

    /** A holder and a waiter; the time from the holder's release call to the waiter's grant. */
    private static String wake(String prefix, int samples, long lo, long hi) throws Exception {
        List<CuratorFramework> cs = clients(2);
        try {
            Longs ns = new Longs();
            for (int s = 0; s < samples; s++) {
                String name = prefix + "-" + s;
                InterProcessMutex held = new InterProcessMutex(cs.get(0), path(name));
                InterProcessMutex waiting = new InterProcessMutex(cs.get(1), path(name));
                held.acquire();
                AtomicLong grantedAt = new AtomicLong();
                AtomicReference<Exception> failure = new AtomicReference<>();
                Thread waiter = new Thread(() -> {
                    try {
                        waiting.acquire();
                        grantedAt.set(System.nanoTime());
                        waiting.release();
                    } catch (Exception e) {
                        failure.set(e);
                    }
                });
                waiter.start();
                Thread.sleep(lo + ThreadLocalRandom.current().nextLong(hi - lo + 1));
                if (!waiter.isAlive()) {
                    if (failure.get() != null) {
                        throw failure.get();
                    }
                    throw new Exception(name + ": the waiter got the lock while it was held");
                }
                long released = System.nanoTime();
                held.release();
                waiter.join();
                if (failure.get() != null) {
                    throw failure.get();
                }
                ns.add(grantedAt.get() - released);
            }
            return "{\"wake\":{\"ns\":" + ns.json() + "}}";
        } finally {
            close(cs);
        }
    }

    private static String run(String[] w) throws Exception {
        if (w.length == 3 && w[0].equals("cycle")) {
            return cycle(w[1], Long.parseLong(w[2]));
        }
        if (w.length == 4 && w[0].equals("hot")) {
            return hot(w[1], Integer.parseInt(w[2]), Long.parseLong(w[3]));
        }
        if (w.length == 5 && w[0].equals("wake")) {
            return wake(w[1], Integer.parseInt(w[2]), Long.parseLong(w[3]),
                    Long.parseLong(w[4]));
        }
        if (w.length == 4 && w[0].equals("permit")) {
            return permit(w[1], Integer.parseInt(w[2]), Long.parseLong(w[3]));
        }
        if (w.length == 4 && w[0].equals("lead")) {
            return lead(w[1], w[2], Integer.parseInt(w[3]));
        }
        if (w.length == 4 && w[0].equals("follow")) {
            campaign(w[1], w[2], Integer.parseInt(w[3]));
            return "{\"ok\":{}}";
        }
        if (w.length == 2 && w[0].equals("observe")) {
            return observe(w[1]);
        }
        if (w.length == 1 && w[0].equals("resign")) {
            return resign();
        }
        throw new Exception("bad command " + quote(String.join(" ", w)));
    }

    /** Curator's version from the jar's Maven metadata. */
    private static String curatorVersion() {
        String res = "/META-INF/maven/org.apache.curator/curator-recipes/pom.properties";
        try (InputStream in = InterProcessMutex.class.getResourceAsStream(res)) {
            if (in != null) {
                Properties p = new Properties();
                p.load(in);
                return p.getProperty("version", "unknown");
            }
        } catch (Exception e) {
            // Fall through: the version is informative only.
        }
        String v = InterProcessMutex.class.getPackage().getImplementationVersion();
        return v == null ? "unknown" : v;
    }

    public static void main(String[] args) throws Exception {
        connect = args.length > 0 ? args[0] : "127.0.0.1:2181";
        try {
            client().close();
        } catch (Exception e) {
            reply("{\"error\":" + quote("cannot connect to ZooKeeper: " + e) + "}");
            System.exit(1);
        }
        String runtime = "Java " + System.getProperty("java.version") + " ("
                + System.getProperty("java.vm.name") + ")";
        reply("{\"hello\":{\"library\":\"Apache Curator InterProcessMutex\",\"version\":"
                + quote(curatorVersion()) + ",\"runtime\":" + quote(runtime)
                + ",\"contenders\":\"threads, one CuratorFramework client (ZooKeeper session)"
                + " each\"}}");
        BufferedReader in = new BufferedReader(
                new InputStreamReader(System.in, StandardCharsets.UTF_8));
        String line;
        while ((line = in.readLine()) != null) {
            String[] w = line.trim().split("\\s+");
            if (w.length == 0 || w[0].isEmpty()) {
                continue;
            }
            if (w[0].equals("quit")) {
                break;
            }
            try {
                reply(run(w));
            } catch (Exception e) {
                reply("{\"error\":" + quote(e.toString()) + "}");
            }
        }
        System.exit(0);
    }
}
