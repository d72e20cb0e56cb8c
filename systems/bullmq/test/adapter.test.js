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
  if (child.exitCode !== null || child.signalCode !== null) return Promise.resolve();
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

/** Resolves once `check` (async) is true; fails saying `what` after `ms`. */
async function until(what, check, ms = 20000) {
  const end = Date.now() + ms;
  while (!(await check())) {
    assert.ok(Date.now() < end, `${what} within ${ms} ms`);
    await new Promise((resolve) => setTimeout(resolve, 20));
  }
}

test('a completion BullMQ made while the adapter was down is recorded before a stall its check finds after the restart', async () => {
  const dir = fs.mkdtempSync(path.join(os.tmpdir(), 'fencelab-bullmq-order-'));
  const leaseMs = 5000;
  let adapter = await start(dir, leaseMs);
  const port = Number(fs.readFileSync(path.join(dir, 'redis.port'), 'utf8'));
  const redis = new Redis({ host: '127.0.0.1', port, maxRetriesPerRequest: 1 });
  redis.on('error', () => {});
  const connection = { host: '127.0.0.1', port };
  const names = { j1: `deploy-${hex('k1')}`, j2: `deploy-${hex('k2')}` };
  const closing = [];
  try {
    const { url } = adapter;
    await call(url, 'POST', '/v1/projects', OPERATOR, { id: 'p' });
    const { token } = await call(url, 'POST', '/v1/runners', OPERATOR, { id: 'r1', project: 'p' });
    for (const n of [1, 2]) {
      await call(url, 'POST', '/v1/jobs', OPERATOR, { project: 'p', id: `j${n}`, deployment_key: `k${n}`, spec: { steps: 1, step_ms: 0 } });
    }
    // j1 is claimed and the adapter's stalled-job check marks it (a marked job whose lock has
    // lapsed is moved at the next check, a lease later); j2 is claimed after the mark, and the
    // adapter is killed before that next check.
    const claim = async (job) => {
      const { grant } = await call(url, 'POST', '/v1/claim', token, { runner: 'r1', observed_ms: Date.now() });
      assert.strictEqual(grant && grant.claim.job, job, `${job} is granted`);
      return grant.claim;
    };
    await claim('j1');
    await until('the check marked j1', async () => (await redis.sismember(`bull:${names.j1}:stalled`, hex('j1'))) === 1);
    const j2 = await claim('j2');
    await killed(adapter.child);

    // While the adapter is down: BullMQ completes j2 for a result whose answer the kill lost,
    // and j1's lock lapses.
    const queue = new Queue(names.j2, { connection });
    closing.push(queue);
    await (await Job.fromId(queue, hex('j2'))).moveToCompleted({ attempt: j2.attempt }, `${j2.runner}/${j2.attempt}/${j2.fence}`, false);
    assert.strictEqual(await redis.lpos(`bull:${names.j1}:active`, hex('j1')), 0, 'j1 is still active: the adapter was killed before its check moved it');
    await until("j1's lock and the last check's mark lapsed",
      async () => (await redis.exists(`bull:${names.j1}:${hex('j1')}:lock`, `bull:${names.j1}:stalled-check`)) === 0);

    adapter = await start(dir, leaseMs);
    let ledger = [];
    await until('the restarted adapter recorded j1\'s stall', async () => {
      ledger = await call(adapter.url, 'GET', '/v1/ledger', OPERATOR);
      return ledger.some((entry) => entry.kind === 'expire' && entry.job === 'j1');
    });
    assert.ok(ledger.some((entry) => entry.kind === 'result' && entry.job === 'j2' && entry.decision === 'accepted'), JSON.stringify(ledger));
    for (let n = 1; n < ledger.length; n += 1) {
      assert.ok(ledger[n].received_ms >= ledger[n - 1].received_ms,
        `entry ${ledger[n].seq} (${ledger[n].kind}) is decided before entry ${ledger[n - 1].seq} (${ledger[n - 1].kind}), which precedes it: ${JSON.stringify(ledger)}`);
    }
  } finally {
    await killed(adapter.child);
    for (const each of closing) await each.close();
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
