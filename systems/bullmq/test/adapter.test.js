'use strict';
// A BullMQ decision whose ledger entry a SIGKILL of the adapter lost is recorded when the
// adapter starts again: the adapter is killed (its Redis lives on, as after a crash of the
// adapter alone), BullMQ extends one attempt's lock and completes another job with the
// claims' tokens, as it would for reports whose answers never came back, and the restarted
// adapter's ledger holds an accepted heartbeat with BullMQ's lease and an accepted result
// with BullMQ's outcome, and nothing for an attempt BullMQ did nothing more with.
//
// And a report decided after another request changed its job is judged on the job as that
// request left it.
//
// Run: node --test systems/bullmq/test/ (harness/tests/it/bullmq.rs runs it).

const test = require('node:test');
const assert = require('node:assert');
const { spawn } = require('node:child_process');
const fs = require('node:fs');
const os = require('node:os');
const path = require('node:path');
const readline = require('node:readline');
const { Queue, Job } = require('bullmq');
const Redis = require('ioredis');

const ADAPTER = path.join(__dirname, '..', 'adapter.js');
const READY_MS_MAX = 30000;
const OPERATOR = 'operator-token';
const hex = (text) => Buffer.from(text, 'utf8').toString('hex');

/** Starts the adapter on a free port with `dir` as its data dir; resolves to the child and
 *  its base URL once it prints its address, rejects after `READY_MS_MAX`. */
function start(dir, leaseMs = 3000) {
  const child = spawn(process.execPath, [ADAPTER, '--listen=127.0.0.1:0', `--lease-ms=${leaseMs}`, `--operator-token=${OPERATOR}`,
    '--secret=test-secret', `--data-dir=${dir}`], { stdio: ['ignore', 'pipe', 'inherit'] });
  return new Promise((resolve, reject) => {
    const timer = setTimeout(() => reject(new Error('the adapter did not print its address in time')), READY_MS_MAX);
    child.on('exit', (code) => reject(new Error(`the adapter exited (${code}) before listening`)));
    readline.createInterface({ input: child.stdout }).on('line', (line) => {
      const { listening } = JSON.parse(line);
      clearTimeout(timer);
      resolve({ child, url: `http://${listening}` });
    });
  });
}

async function call(url, method, route, token, body, statusOk = (status) => status < 300) {
  const response = await fetch(`${url}${route}`, {
    method,
    headers: { authorization: `Bearer ${token}`, ...(body ? { 'content-type': 'application/json' } : {}) },
    body: body ? JSON.stringify(body) : undefined,
    signal: AbortSignal.timeout(10000),
  });
  const value = await response.json();
  assert.ok(statusOk(response.status), `${method} ${route}: ${response.status} ${JSON.stringify(value)}`);
  return value;
}

function killed(child) {
  return new Promise((resolve) => {
    child.on('exit', resolve);
    child.kill('SIGKILL');
  });
}

test('a BullMQ decision whose entry was lost with the adapter is recorded when it starts again', async () => {
  const dir = fs.mkdtempSync(path.join(os.tmpdir(), 'fencelab-bullmq-recover-'));
  let adapter = await start(dir);
  const redis = new Redis({ host: '127.0.0.1', port: Number(fs.readFileSync(path.join(dir, 'redis.port'), 'utf8')), maxRetriesPerRequest: 1 });
  redis.on('error', () => {});
  const queues = [];
  try {
    const { url } = adapter;
    await call(url, 'POST', '/v1/projects', OPERATOR, { id: 'p' });
    const { token } = await call(url, 'POST', '/v1/runners', OPERATOR, { id: 'r1', project: 'p' });
    for (const n of [1, 2, 3]) {
      await call(url, 'POST', '/v1/jobs', OPERATOR, { project: 'p', id: `j${n}`, deployment_key: `k${n}`, spec: { steps: 1, step_ms: 0 } });
    }
    const claims = {};
    for (let n = 0; n < 3; n += 1) {
      const { grant } = await call(url, 'POST', '/v1/claim', token, { runner: 'r1', observed_ms: Date.now() });
      assert.ok(grant, 'each job is granted');
      claims[grant.claim.job] = { ...grant.claim, lease: grant.lease_expires_ms };
    }
    await killed(adapter.child);

    // BullMQ decides for reports whose answers the kill lost: j1's lock is extended, j2 completed.
    const bull = async (job) => {
      const queue = new Queue(`deploy-${hex(`k${job.slice(1)}`)}`, { connection: { host: '127.0.0.1', port: redis.options.port } });
      queues.push(queue);
      return Job.fromId(queue, hex(job));
    };
    const tokenOf = (claim) => `${claim.runner}/${claim.attempt}/${claim.fence}`;
    const extendedFrom = Date.now();
    assert.strictEqual(await (await bull('j1')).extendLock(tokenOf(claims.j1), 20000), 1);
    await (await bull('j2')).moveToCompleted({ attempt: claims.j2.attempt }, tokenOf(claims.j2), false);

    adapter = await start(dir);
    const ledger = await call(adapter.url, 'GET', '/v1/ledger', OPERATOR);
    const after = ledger.filter((entry) => entry.kind === 'heartbeat' || entry.kind === 'result');
    assert.strictEqual(after.length, 2, `one entry for each of BullMQ's decisions: ${JSON.stringify(after)}`);
    const [heartbeat] = after.filter((entry) => entry.kind === 'heartbeat');
    assert.strictEqual(heartbeat.attempt, claims.j1.attempt);
    assert.strictEqual(heartbeat.decision, 'accepted');
    assert.ok(heartbeat.lease_expires_ms >= extendedFrom + 20000, `the lease BullMQ set: ${JSON.stringify(heartbeat)}`);
    assert.strictEqual(heartbeat.received_ms, heartbeat.lease_expires_ms - 3000);
    const [result] = after.filter((entry) => entry.kind === 'result');
    assert.strictEqual(result.attempt, claims.j2.attempt);
    assert.deepStrictEqual([result.decision, result.outcome], ['accepted', 'succeeded']);
    assert.ok(result.received_ms >= extendedFrom && result.received_ms <= Date.now(), JSON.stringify(result));

    // The runner's retry of j2's result is BullMQ's to refuse; j1's lease is the one BullMQ set.
    const job = await call(adapter.url, 'GET', '/v1/jobs/j1', OPERATOR);
    assert.strictEqual(job.attempts[0].lease_expires_ms, heartbeat.lease_expires_ms);
  } finally {
    await killed(adapter.child);
    for (const queue of queues) await queue.close();
    await redis.shutdown('NOSAVE').catch(() => {});
    redis.disconnect();
    fs.rmSync(dir, { recursive: true, force: true });
  }
});

test('a result queued behind the claim that superseded its attempt is refused as superseded', async () => {
  const dir = fs.mkdtempSync(path.join(os.tmpdir(), 'fencelab-bullmq-superseded-'));
  const adapter = await start(dir, 500);
  const port = Number(fs.readFileSync(path.join(dir, 'redis.port'), 'utf8'));
  try {
    const { url } = adapter;
    await call(url, 'POST', '/v1/projects', OPERATOR, { id: 'p' });
    const tokens = {};
    for (const runner of ['r1', 'r2']) tokens[runner] = (await call(url, 'POST', '/v1/runners', OPERATOR, { id: runner, project: 'p' })).token;
    await call(url, 'POST', '/v1/jobs', OPERATOR, { project: 'p', id: 'j1', deployment_key: 'k1', spec: { steps: 1, step_ms: 0 } });
    const first = (await call(url, 'POST', '/v1/claim', tokens.r1, { runner: 'r1', observed_ms: Date.now() })).grant.claim;
    // BullMQ's stalled-job check moves j1 back to its queue once its lock lapses.
    const until = Date.now() + 20000;
    for (;;) {
      const ledger = await call(url, 'GET', '/v1/ledger', OPERATOR);
      if (ledger.some((entry) => entry.kind === 'expire')) break;
      assert.ok(Date.now() < until, 'the stall was recorded within 20 s');
      await new Promise((resolve) => setTimeout(resolve, 100));
    }
    // r2's claim and r1's late result, sent together: the claim is decided first.
    const claim = call(url, 'POST', '/v1/claim', tokens.r2, { runner: 'r2', observed_ms: Date.now() });
    const late = call(url, 'POST', '/v1/result', tokens.r1, { ...first, outcome: 'succeeded', observed_ms: Date.now() }, (status) => status === 409);
    const [{ grant }, refused] = await Promise.all([claim, late]);
    assert.ok(grant, 'r2 is granted j1');
    const ledger = await call(url, 'GET', '/v1/ledger', OPERATOR);
    const order = ledger.filter((entry) => entry.kind === 'claim' || entry.kind === 'result').map((entry) => entry.kind);
    if (order.join() === 'claim,claim,result') {
      assert.strictEqual(refused.reason, 'superseded', `j1's attempt was superseded when the result was decided: ${JSON.stringify(ledger)}`);
    } else {
      assert.strictEqual(refused.reason, 'not_current', JSON.stringify(ledger));
    }
  } finally {
    await killed(adapter.child);
    const redis = new Redis({ host: '127.0.0.1', port, maxRetriesPerRequest: 1 });
    redis.on('error', () => {});
    await redis.shutdown('NOSAVE').catch(() => {});
    redis.disconnect();
    fs.rmSync(dir, { recursive: true, force: true });
  }
});
