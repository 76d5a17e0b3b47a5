// The Node.js peer of distlock-bench: redis-semaphore's Semaphore on Redis, driven by the bench
// over stdin/stdout (the protocol is in bench/peers/README.md). It measures and prints raw
// numbers only; the bench computes every statistic itself. Only the `permit` command: the
// library's mutexes are not in the report.
//
// Installed by bench/peers/install from npm into target/peers/node (redis-semaphore, ioredis):
//
//   NODE_PATH=target/peers/node/node_modules node harness.js redis://127.0.0.1:6379
'use strict';

const readline = require('readline');
const Redis = require('ioredis');
const { Semaphore } = require('redis-semaphore');

const url = process.argv[2] || 'redis://127.0.0.1:6379';

function reply(v) {
  process.stdout.write(JSON.stringify(v) + '\n');
}

function version(pkg) {
  try {
    return require(pkg + '/package.json').version;
  } catch (e) {
    return 'unknown';
  }
}

// The cycle's client and semaphores, kept across commands as an application keeps its client.
let client = null;
const semaphores = new Map();

// One client, acquire + release one permit of a `max`-permit semaphore on `name`, for `millis`.
async function permit(name, max, millis) {
  if (client === null) {
    client = new Redis(url, { lazyConnect: true });
    await client.connect();
  }
  const key = name + '/' + max;
  let s = semaphores.get(key);
  if (s === undefined) {
    // Its defaults: a 10 s lease refreshed every 8 s, a waiter retrying every 10 ms.
    s = new Semaphore(client, name, max);
    semaphores.set(key, s);
  }
  const ns = [];
  const end = process.hrtime.bigint() + BigInt(millis) * 1000000n;
  for (;;) {
    const t = process.hrtime.bigint();
    await s.acquire();
    await s.release();
    const now = process.hrtime.bigint();
    ns.push(Number(now - t));
    if (now >= end) {
      break;
    }
  }
  return { cycle: { ns } };
}

async function run(words) {
  if (words.length === 4 && words[0] === 'permit') {
    const max = parseInt(words[2], 10);
    const millis = parseInt(words[3], 10);
    if (max >= 1 && millis >= 0) {
      return permit(words[1], max, millis);
    }
  }
  throw new Error('bad command ' + JSON.stringify(words.join(' ')));
}

async function main() {
  // Connecting once proves the server answers before the bench sends any work.
  try {
    const probe = new Redis(url, { lazyConnect: true, maxRetriesPerRequest: 1 });
    await probe.connect();
    await probe.ping();
    probe.disconnect();
  } catch (e) {
    reply({ error: 'cannot connect to Redis at ' + url + ': ' + e.message });
    process.exit(1);
  }
  reply({
    hello: {
      library: 'redis-semaphore Semaphore',
      version: version('redis-semaphore') + ' (ioredis ' + version('ioredis') + ')',
      runtime: 'Node.js ' + process.versions.node,
      contenders: 'async functions, one ioredis client each',
    },
  });
  const lines = readline.createInterface({ input: process.stdin });
  // One command at a time, in order.
  let queue = Promise.resolve();
  lines.on('line', (line) => {
    const words = line.trim().split(/\s+/).filter((w) => w !== '');
    if (words.length === 0) {
      return;
    }
    if (words[0] === 'quit') {
      queue.then(() => process.exit(0));
      return;
    }
    queue = queue.then(() => run(words).then(reply, (e) => reply({ error: String(e && e.message || e) })));
  });
  lines.on('close', () => queue.then(() => process.exit(0)));
}

main();
