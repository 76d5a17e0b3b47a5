"""The Python Redis peers of distlock-bench: redis-py's Lock and python-redis-lock's Lock,
driven by the bench over stdin/stdout (the protocol is in bench/peers/README.md). It measures
and prints raw numbers only; the bench computes every statistic itself.

    target/peers/python/venv/bin/python harness.py redis-py redis://127.0.0.1:6379
    target/peers/python/venv/bin/python harness.py python-redis-lock redis://127.0.0.1:6379

Every contender is a thread with its own redis.Redis client (its own connection pool), as
separate processes would have; the threads share time.monotonic_ns(), one monotonic clock.
Each library is used the way its documentation shows, with its defaults: redis-py's
`with client.lock(name, timeout=30)` (a waiter retries SET NX every 0.1 s, its default
`sleep`), python-redis-lock's `with redis_lock.Lock(client, name, expire=30)` (a waiter blocks
in BLPOP on a signal list that the release pushes to).
"""

import json
import random
import sys
import threading
import time
from importlib.metadata import version

import redis

LEASE_S = 30
NS_PER_MS = 1_000_000


class RedisPy:
    label = "redis-py Lock"
    package = "redis"

    def __init__(self, client):
        self.client = client

    def lock(self, name):
        return self.client.lock(name, timeout=LEASE_S)


class PythonRedisLock:
    label = "python-redis-lock"
    package = "python-redis-lock"

    def __init__(self, client):
        import redis_lock

        self.client = client
        self.module = redis_lock

    def lock(self, name):
        return self.module.Lock(self.client, name, expire=LEASE_S)


LIBRARIES = {"redis-py": RedisPy, "python-redis-lock": PythonRedisLock}


def reply(obj):
    sys.stdout.write(json.dumps(obj, separators=(",", ":")) + "\n")
    sys.stdout.flush()


class Harness:
    def __init__(self, library, url):
        self.library = LIBRARIES[library]
        self.url = url
        self.cycle_peer = None

    def connect(self):
        client = redis.Redis.from_url(self.url)
        client.ping()
        return self.library(client)

    def cycle(self, name, millis):
        # One client kept across cycle commands, so that every slice runs warm, as an
        # application's long-lived client does.
        if self.cycle_peer is None:
            self.cycle_peer = self.connect()
        ns = []
        end = time.monotonic_ns() + millis * NS_PER_MS
        while True:
            t = time.monotonic_ns()
            with self.cycle_peer.lock(name):
                pass
            now = time.monotonic_ns()
            ns.append(now - t)
            if now >= end:
                break
        return {"cycle": {"ns": ns}}

    def hot(self, name, n, millis):
        peers = [self.connect() for _ in range(n)]
        try:
            stop = threading.Event()
            start = threading.Barrier(n + 1)
            guard = threading.Lock()
            # When the last holder called release, and which contender it was.
            shared = {"released": None, "releaser": -1, "self": 0, "holders": 0, "violations": 0}
            handoff = []
            grants = [0] * n
            waits = [[] for _ in range(n)]
            errors = []

            def contend(me):
                try:
                    start.wait()
                    peer = peers[me]
                    while not stop.is_set():
                        lock = peer.lock(name)
                        asked = time.monotonic_ns()
                        lock.acquire()
                        granted = time.monotonic_ns()
                        with guard:
                            shared["holders"] += 1
                            if shared["holders"] != 1:
                                shared["violations"] += 1
                            grants[me] += 1
                            waits[me].append(granted - asked)
                            if shared["released"] is not None:
                                handoff.append(granted - shared["released"])
                                if shared["releaser"] == me:
                                    shared["self"] += 1
                                shared["released"] = None
                        with guard:
                            shared["holders"] -= 1
                            shared["released"] = time.monotonic_ns()
                            shared["releaser"] = me
                        lock.release()
                except Exception as e:  # reported to the bench, which fails the row
                    errors.append(repr(e))
                    stop.set()

            threads = [threading.Thread(target=contend, args=(i,)) for i in range(n)]
            for t in threads:
                t.start()
            start.wait()
            began = time.monotonic_ns()
            time.sleep(millis / 1000)
            stop.set()
            for t in threads:
                t.join()
            elapsed = time.monotonic_ns() - began
            if errors:
                raise RuntimeError(errors[0])
            return {
                "hot": {
                    "grants": grants,
                    "handoff_ns": handoff,
                    "wait_ns": [w for ws in waits for w in ws],
                    "self_regrants": shared["self"],
                    "violations": shared["violations"],
                    "elapsed_ns": elapsed,
                }
            }
        finally:
            for p in peers:
                p.client.close()

    def wake(self, prefix, samples, lo, hi):
        holder, waiter = self.connect(), self.connect()
        try:
            ns = []
            for s in range(samples):
                name = f"{prefix}-{s}"
                held = holder.lock(name)
                held.acquire()
                result = {}

                def wait():
                    try:
                        lock = waiter.lock(name)
                        lock.acquire()
                        result["granted"] = time.monotonic_ns()
                        lock.release()
                    except Exception as e:
                        result["error"] = repr(e)

                t = threading.Thread(target=wait)
                t.start()
                time.sleep(random.uniform(lo, hi) / 1000)
                if not t.is_alive():
                    raise RuntimeError(
                        result.get("error", f"{name}: the waiter got the lock while it was held")
                    )
                released = time.monotonic_ns()
                held.release()
                t.join()
                if "error" in result:
                    raise RuntimeError(result["error"])
                ns.append(result["granted"] - released)
            return {"wake": {"ns": ns}}
        finally:
            holder.client.close()
            waiter.client.close()

    def run(self, words):
        if len(words) == 3 and words[0] == "cycle":
            return self.cycle(words[1], int(words[2]))
        if len(words) == 4 and words[0] == "hot":
            return self.hot(words[1], int(words[2]), int(words[3]))
        if len(words) == 5 and words[0] == "wake":
            return self.wake(words[1], int(words[2]), int(words[3]), int(words[4]))
        raise ValueError(f"bad command {' '.join(words)!r}")


def main():
    library = sys.argv[1] if len(sys.argv) > 1 else "redis-py"
    url = sys.argv[2] if len(sys.argv) > 2 else "redis://127.0.0.1:6379"
    if library not in LIBRARIES:
        reply({"error": f"unknown library {library!r}: one of {', '.join(LIBRARIES)}"})
        sys.exit(2)
    harness = Harness(library, url)
    try:
        harness.connect().client.close()
    except Exception as e:
        reply({"error": f"cannot connect to Redis at {url}: {e!r}"})
        sys.exit(1)
    impl = sys.implementation
    runtime = f"{impl.name.replace('cpython', 'CPython')} {sys.version.split()[0]}"
    reply(
        {
            "hello": {
                "library": harness.library.label,
                "version": version(harness.library.package),
                "runtime": runtime,
                "contenders": "threads, one redis.Redis client (connection pool) each",
            }
        }
    )
    for line in sys.stdin:
        words = line.split()
        if not words:
            continue
        if words[0] == "quit":
            break
        try:
            reply(harness.run(words))
        except Exception as e:
            reply({"error": repr(e)})


if __name__ == "__main__":
    main()
