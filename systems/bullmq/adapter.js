'use strict';
// fencelab's control-plane contract (docs/protocol.md) served by BullMQ on Redis. Every
// decision about a job is BullMQ's:
//
//   claim      Worker.getNextJob(token)          a queue per deployment key, global concurrency 1
//   heartbeat  job.extendLock(token, lease_ms)   1 accepted, 0 refused
//   result     job.moveToCompleted / moveToFailed(…, token)   BullMQ's lock check decides
//   expiry     Worker.startStalledCheckTimer()   BullMQ's stalled-job check; a stalled job is
//                                               moved back to wait (recorded as `requeued`)
//   submit     Queue.add(…, {jobId})
//
// The adapter keeps the bookkeeping BullMQ has no place for (projects, runners and their
// tokens, attempt ids, the ledger) in the same Redis under `fl:` and adds no protection
// BullMQ lacks: a capability is granted to whoever asks (BullMQ has no capability), a
// refusal's reason only explains BullMQ's refusal from the attempts recorded, and nothing is
// ever reconciled (BullMQ has no such step). See systems/bullmq/system.toml and
// docs/analyses/bullmq.md for every mapping and why.

const { Queue, Worker } = require('bullmq');
const Redis = require('ioredis');
const wire = require('../node-common/wire');
const contract = require('../node-common/contract');
const redisServer = require('./redis');

const { ApiError } = wire;
const { hex, stringify, RawJson, exists } = contract;

/** Longest a BullMQ or Redis call may take before the request is answered 503. */
const CALL_MS_MAX = 5000;
/** Stalls BullMQ may count before it fails a job instead of requeueing it (see system.toml). */
const MAX_STALLED_COUNT = 1000000;
/** Looks at the queues a claim makes before it answers that nothing is claimable. */
const LOOKS_MAX = 3;
const RETRY = Symbol('look again');
/** BullMQ's job states in the contract's words. */
const WORDS = { completed: 'succeeded', failed: 'failed', active: 'running' };

const parseArgs = (argv) => contract.options(argv, {
  names: { '--data-dir': 'dataDir', '--redis-server': 'redisServer', '--capability': 'capability', '--appendfsync': 'appendfsync' },
  defaults: { redisServer: 'redis-server' },
  required: ['dataDir'],
  choices: { capability: ['grant', 'lock'], appendfsync: ['always', 'everysec'] },
});

/** `promise`, or a 503 after `CALL_MS_MAX` (a mutating call may have taken effect). */
const bounded = (promise, mutates) => contract.bounded(promise, mutates, CALL_MS_MAX, 'Redis');

class Adapter {
  constructor(options, redis, port) {
    this.options = options;
    this.redis = redis;
    this.connection = { host: '127.0.0.1', port, maxRetriesPerRequest: null };
    this.queues = new Map();
    this.serial = contract.serial();
    this.resumed = false;
  }

  // ---------------------------------------------------------------- BullMQ, one queue per key

  /** The queue and the manual worker of a deployment key, made once per process. */
  async lane(key) {
    if (this.queues.has(key)) return this.queues.get(key);
    const name = `deploy-${hex(key)}`;
    const queue = new Queue(name, { connection: this.connection });
    const worker = new Worker(name, null, {
      connection: this.connection, autorun: false, lockDuration: this.options.leaseMs,
      stalledInterval: this.options.leaseMs, maxStalledCount: MAX_STALLED_COUNT,
    });
    queue.on('error', (error) => process.stderr.write(`queue ${key}: ${error.message}\n`));
    worker.on('error', (error) => process.stderr.write(`worker ${key}: ${error.message}\n`));
    worker.on('stalled', (jobId) => this.serial(() => this.stalled(jobId)).catch((error) => {
      process.stderr.write(`recording the stall of ${jobId}: ${error.message}\n`);
    }));
    const lane = { name, queue, worker };
    this.queues.set(key, lane);
    await queue.setGlobalConcurrency(1);
    if (this.resumed) this.checkStalls(key, worker);
    return lane;
  }

  /** Starts BullMQ's stalled-job check of `key`'s queue. Not before `resume` has recorded what
   *  BullMQ decided while the adapter was down: a stall the check finds after a restart is
   *  decided later than those, and is recorded after them. */
  checkStalls(key, worker) {
    worker.startStalledCheckTimer().catch((error) => process.stderr.write(`stalled check ${key}: ${error.message}\n`));
  }

  // ---------------------------------------------------------------- bookkeeping

  async record(kind, id) {
    const text = await this.redis.get(`fl:${kind}:${id}`);
    return text === null ? null : JSON.parse(text);
  }

  /**
   * Appends a ledger entry (its `seq` is its place in the list: 1, 2, …) and writes the
   * records it changes, `{key: value}`, in one MULTI: a restart of the adapter and its Redis
   * never leaves a record changed without its entry, or the reverse. Every caller runs in
   * `serial`, so the length read first is still the ledger's when the MULTI runs.
   */
  async append(entry, records = {}, more = () => {}) {
    const seq = (await this.redis.llen('fl:ledger')) + 1;
    const multi = this.redis.multi();
    more(multi);
    for (const [key, value] of Object.entries(records)) multi.set(key, typeof value === 'string' ? value : stringify(value));
    multi.rpush('fl:ledger', stringify(entry));
    multi.rpush(`fl:jobledger:${entry.job}`, seq);
    await multi.exec();
    return seq;
  }

  /** The adapter's records as the contract's decisions read and write them (see contract.js):
   *  an attempt's record, and the ledger entry written with the attempt record it changed. */
  book() {
    return {
      attempt: (id) => this.record('attempt', id),
      append: (entry, attempt) => this.append(entry, attempt ? { [`fl:attempt:${attempt.id}`]: attempt } : {}),
    };
  }

  who(request) {
    return contract.who(request, this.options.operatorToken, (token) => this.redis.hget('fl:tokens', token));
  }

  // ---------------------------------------------------------------- operator

  async createProject(who, body) {
    const req = contract.readProject(who, body);
    const token = contract.newToken();
    if (!(await this.redis.hsetnx('fl:projects', req.id, token))) throw exists(`project ${req.id}`);
    await this.redis.hset('fl:tokens', token, JSON.stringify({ kind: 'registration', project: req.id }));
    return [201, { id: req.id, registration_token: token }];
  }

  async registerRunner(who, body) {
    const { id, project } = contract.readRunner(who, body);
    if (!(await this.redis.hexists('fl:projects', project))) throw contract.unknownProject(project);
    if (!(await this.redis.hsetnx('fl:runners', id, project))) throw exists(`runner ${id}`);
    const token = contract.newToken();
    await this.redis.hset('fl:tokens', token, JSON.stringify({ kind: 'runner', project, runner: id }));
    return [201, { id, project, token }];
  }

  async submit(who, body) {
    const req = contract.readSubmit(who, body);
    if (!(await this.redis.hexists('fl:projects', req.project))) throw contract.unknownProject(req.project);
    return this.serial(() => this.add(req));
  }

  async add(req) {
    let id = req.id;
    if (id === undefined) {
      for (let tries = 0; tries < 1000 && id === undefined; tries += 1) {
        const next = `j${await this.redis.incr('fl:jobseq')}`;
        if (!(await this.redis.exists(`fl:job:${next}`))) id = next;
      }
      if (id === undefined) throw new ApiError(500, 'internal', 'no free generated job id');
    }
    if (await this.redis.exists(`fl:job:${id}`)) throw exists(`job ${id}`);
    const newKey = !(await this.redis.sismember(`fl:keyset:${req.project}`, req.deployment_key));
    const { spec, entry } = contract.submitted(req, id, Date.now());
    const job = { id, project: req.project, deployment_key: req.deployment_key, spec, attempts: 0 };
    await this.append(entry, { [`fl:job:${id}`]: job }, (multi) => {
      multi.rpush('fl:jobs', id);
      multi.sadd(`fl:keyset:${req.project}`, req.deployment_key);
      if (newKey) multi.rpush(`fl:keys:${req.project}`, req.deployment_key);
      multi.sadd('fl:allkeys', req.deployment_key);
    });
    await this.enqueue(job);
    return [201, { id }];
  }

  // ---------------------------------------------------------------- runners

  async claim(who, body) {
    const req = contract.readClaim(who, body);
    return this.serial(() => this.grant(who, req));
  }

  /** The project's jobs BullMQ would serve next on each key, oldest submission first. */
  async candidates(project) {
    const keys = await this.redis.lrange(`fl:keys:${project}`, 0, -1);
    const found = [];
    for (const key of keys) {
      const { name } = await this.lane(key);
      const next = await this.redis.lindex(`bull:${name}:wait`, -1);
      if (next === null) continue;
      const id = Buffer.from(next, 'hex').toString('utf8');
      const job = await this.record('job', id);
      if (job && job.project === project) found.push({ key, job, order: await this.order(id) });
    }
    return found.sort((a, b) => a.order - b.order);
  }

  async order(id) {
    const at = await this.redis.lpos('fl:jobs', id);
    return at === null ? Number.MAX_SAFE_INTEGER : at;
  }

  /**
   * Asks BullMQ for the job the candidates say comes next on each key in turn. The stalled-job
   * check may move a job back to a queue between the look and the ask; BullMQ then serves
   * that one, under a token made for another: it is given back (`moveToWait`, to the head of
   * its queue) and the look is made again, at most `LOOKS_MAX` times.
   */
  async grant(who, req) {
    for (let look = 0; look < LOOKS_MAX; look += 1) {
      const served = await this.serveNext(who, req);
      if (served !== RETRY) return served;
    }
    return contract.NO_GRANT;
  }

  async serveNext(who, req) {
    for (const { key, job } of await this.candidates(who.project)) {
      await this.catchUp(job);
      const attempt = contract.nextAttempt(job);
      const fence = Number(await this.redis.get('fl:fence')) + 1;
      const token = tokenOf(who.runner, attempt, fence);
      const now = Date.now();
      const { worker } = await this.lane(key);
      const got = await bounded(worker.getNextJob(token, { block: false }), true);
      if (!got) continue;
      if (got.id !== hex(job.id)) {
        await bounded(got.moveToWait(token), true);
        return RETRY;
      }
      const lease = await this.leaseEnd(key, job.id, now);
      return this.granted(who, req, job, { attempt, fence, lease });
    }
    return contract.NO_GRANT;
  }

  /**
   * When the lock BullMQ just set or extended for `id` ends, on the host's clock: read back
   * from Redis (PTTL, rounded up), so that the lease the ledger shows is the one BullMQ
   * keeps, not the adapter's guess from before the call. `sent` (the instant the call was
   * made) plus the lease when the lock is already gone.
   */
  async leaseEnd(key, id, sent) {
    const { name } = await this.lane(key);
    const left = await bounded(this.redis.pttl(`bull:${name}:${hex(id)}:lock`), false);
    return left > 0 ? Date.now() + left + 1 : sent + this.options.leaseMs;
  }

  async granted(who, req, job, { attempt, fence, lease }) {
    // The grant's receipt time is the instant BullMQ's lock began: its end less the lease.
    const now = lease - this.options.leaseMs;
    const { record, entry, answer } = contract.grant(who, req, job, { attempt, fence, now, lease }, this.options.leaseMs);
    job.attempts += 1;
    job.current_attempt = attempt;
    await this.append(entry, { 'fl:fence': String(fence), [`fl:attempt:${attempt}`]: record, [`fl:job:${job.id}`]: job });
    return answer;
  }

  /** BullMQ served a job whose current attempt is still running in the records: its stall
   *  was decided by BullMQ before the `stalled` event reached us. Record it first. */
  async catchUp(job) {
    if (job.current_attempt === undefined) return;
    const attempt = await this.record('attempt', job.current_attempt);
    if (attempt && attempt.state === 'running') await this.requeued(job, attempt);
  }

  /** BullMQ's stalled-job check moved `bullId` back to wait. A claim may have served it
   *  again (and recorded the stall) before this event came: then it is active, and its
   *  current attempt is the new one. */
  async stalled(bullId) {
    const job = await this.record('job', Buffer.from(bullId, 'hex').toString('utf8'));
    if (!job) return;
    const { queue } = await this.lane(job.deployment_key);
    if ((await bounded(queue.getJobState(bullId), false)) === 'active') return;
    await this.catchUp(job);
  }

  async requeued(job, attempt) {
    await this.book().append(contract.expired(job, attempt, 'requeued', Date.now()), attempt);
  }

  /** The checks before a report's verdict: token kind, runner, fence bound, the job's project.
   *  Called in `serial`, so the job is read as the requests decided before left it (one read
   *  outside would judge a report on a job a claim queued ahead of it has since changed). */
  async report(who, body, extra = {}) {
    const req = contract.readReport(who, body, extra);
    return { req, job: contract.ownJob(await this.record('job', req.job), req, who) };
  }

  async heartbeat(who, body) {
    return this.serial(async () => {
      const { req, job } = await this.report(who, body);
      let now = Date.now();
      const { queue } = await this.lane(job.deployment_key);
      const bull = await bounded(queue.getJob(hex(job.id)), false);
      const token = tokenOf(req.runner, req.attempt, req.fence);
      const extended = bull ? await bounded(bull.extendLock(token, this.options.leaseMs), true) : 0;
      if (extended === 1) {
        const lease = await this.leaseEnd(job.deployment_key, job.id, now);
        now = lease - this.options.leaseMs;
        return contract.heartbeatAccepted(this.book(), who, job, req, now, lease, true);
      }
      return contract.refused(this.book(), 'heartbeat', who, job, req, now);
    });
  }

  /**
   * BullMQ has no capability. `--capability=grant` (what a plain BullMQ worker has): whoever
   * asks is granted one, signed for the target, for the claim as presented, living
   * `CAPABILITY_TTL_MS` whatever the lock does. `--capability=lock` (the user-side pattern
   * "check the lock before each side effect"): granted only while the job's lock holds the
   * claim's token, and living no longer than the lock; BullMQ's lock is read, not renewed.
   */
  async capability(who, body) {
    return this.serial(async () => {
      const { req, job } = await this.report(who, body);
      const now = Date.now();
      const hold = this.options.capability === 'lock' ? await this.lockEnd(job, tokenOf(req.runner, req.attempt, req.fence)) : undefined;
      return contract.capability(this.book(), this.options.secret, who, job, req, now, hold);
    });
  }

  /** When `job`'s lock ends if it holds `token` (read in one MULTI), else null. */
  async lockEnd(job, token) {
    const { name } = await this.lane(job.deployment_key);
    const key = `bull:${name}:${hex(job.id)}:lock`;
    const [[, held], [, left]] = await bounded(this.redis.multi().get(key).pttl(key).exec(), false);
    const read = Date.now();
    return held === token && left > 0 ? read + left : null;
  }

  async result(who, body) {
    return this.serial(async () => {
      const { req, job } = await this.report(who, body, contract.RESULT);
      const now = Date.now();
      const { queue } = await this.lane(job.deployment_key);
      const bull = await bounded(queue.getJob(hex(job.id)), false);
      const token = tokenOf(req.runner, req.attempt, req.fence);
      if (bull && (await this.finish(bull, req, token))) return contract.resultAccepted(this.book(), who, job, req, now);
      return contract.lateResult(this.book(), who, job, req, now);
    });
  }

  /** BullMQ's answer to a result: true when it moved the job, false when its lock check
   *  refused (a lock missing, held by another token, or the job no longer active). */
  async finish(bull, req, token) {
    try {
      if (req.outcome === 'succeeded') await bounded(bull.moveToCompleted({ attempt: req.attempt }, token, false), true);
      else await bounded(bull.moveToFailed(new Error(req.detail || 'the runner reported failure'), token, false), true);
      return true;
    } catch (error) {
      if (typeof error.code === 'number' && error.code < 0) return false;
      throw error;
    }
  }

  // ---------------------------------------------------------------- reads

  async jobs() {
    const views = [];
    for (const id of await this.redis.lrange('fl:jobs', 0, -1)) views.push(await this.view(await this.record('job', id), false));
    return views;
  }

  async job(id) {
    const job = await this.record('job', id);
    return job && this.view(job, true);
  }

  /** A job's view; its state is BullMQ's (a job in none of these states reads `queued`). */
  async view(job, full) {
    const { queue } = await this.lane(job.deployment_key);
    const state = await bounded(queue.getJobState(hex(job.id)), false);
    const view = contract.jobView(job, WORDS[state] || 'queued');
    if (!full) return view;
    for (let n = 1; n <= job.attempts; n += 1) {
      const attempt = await this.record('attempt', `${job.id}-a${n}`);
      if (attempt) view.attempts.push({ ...attempt, current: attempt.id === job.current_attempt });
    }
    for (const seq of await this.redis.lrange(`fl:jobledger:${job.id}`, 0, -1)) {
      view.ledger.push(JSON.parse(contract.withSeq(Number(seq), await this.redis.lindex('fl:ledger', Number(seq) - 1))));
    }
    return view;
  }

  async ledger(who, params) {
    const { after, limit } = contract.ledgerWindow(who, params);
    const length = BigInt(await this.redis.llen('fl:ledger'));
    if (after >= length) return [200, []];
    const texts = await this.redis.lrange('fl:ledger', Number(after), Number(after + limit) - 1);
    return [200, new RawJson(`[${texts.map((text, i) => contract.withSeq(Number(after) + i + 1, text)).join(',')}]`)];
  }

  /** Every key's queue and worker again after a restart, and a submit recorded before a crash
   *  that came before its `Queue.add` is added (BullMQ ignores an add whose job id it holds).
   *  The decisions BullMQ made while the adapter was down are recorded before the stalled-job
   *  checks resume: a stall recorded first would put a later instant ahead of them in the
   *  ledger's order. */
  async resume() {
    for (const key of await this.redis.smembers('fl:allkeys')) await this.lane(key);
    for (const id of await this.redis.lrange('fl:jobs', 0, -1)) {
      const job = await this.record('job', id);
      if (job && job.attempts === 0) await this.enqueue(job);
    }
    await this.serial(() => this.recover());
    this.resumed = true;
    for (const [key, { worker }] of this.queues) this.checkStalls(key, worker);
  }

  /**
   * Records what BullMQ decided and the ledger lacks, before the adapter answers anything.
   * A BullMQ call and its ledger entry are two Redis calls, so a SIGKILL between them (a
   * `restart-control-plane` in the middle of a report) leaves BullMQ's decision without its
   * entry. For each attempt the records hold as running: a lock BullMQ extended past the
   * recorded lease is a heartbeat BullMQ accepted, recorded with the lease it set; a job
   * BullMQ finished is a result it accepted, recorded with its outcome at BullMQ's
   * `finishedOn`. Nothing else is inferred: a stall is recorded when BullMQ serves the job
   * again (`catchUp`).
   */
  async recover() {
    for (const id of await this.redis.lrange('fl:jobs', 0, -1)) {
      const job = await this.record('job', id);
      if (!job || job.current_attempt === undefined) continue;
      const attempt = await this.record('attempt', job.current_attempt);
      if (!attempt || attempt.state !== 'running') continue;
      const { queue } = await this.lane(job.deployment_key);
      const state = await bounded(queue.getJobState(hex(job.id)), false);
      const who = { project: job.project };
      const req = { attempt: attempt.id, runner: attempt.runner, fence: attempt.fence };
      if (state === 'active') {
        const lease = await this.extendedPast(job, attempt);
        if (lease !== null) await contract.heartbeatAccepted(this.book(), who, job, req, lease - this.options.leaseMs, lease, true);
      } else if (state === 'completed' || state === 'failed') {
        const bull = await bounded(queue.getJob(hex(job.id)), false);
        await contract.resultAccepted(this.book(), who, job, { ...req, outcome: WORDS[state] }, bull.finishedOn);
      }
    }
  }

  /** The end of `attempt`'s lock when BullMQ extended it past the lease the records hold
   *  (judged on the lock's earliest possible end, so a lock read late is not taken for an
   *  extension), else null. */
  async extendedPast(job, attempt) {
    const { name } = await this.lane(job.deployment_key);
    const key = `bull:${name}:${hex(job.id)}:lock`;
    const sent = Date.now();
    const [[, held], [, left]] = await bounded(this.redis.multi().get(key).pttl(key).exec(), false);
    const token = tokenOf(attempt.runner, attempt.id, attempt.fence);
    if (held !== token || left <= 0 || sent + left <= attempt.lease_expires_ms) return null;
    return Date.now() + left + 1;
  }

  async enqueue(job) {
    const { queue } = await this.lane(job.deployment_key);
    const options = { jobId: hex(job.id), attempts: 1, removeOnComplete: false, removeOnFail: false };
    await bounded(queue.add('deploy', { job: job.id }, options), true);
  }
}

/** BullMQ's lock token for an attempt: the runner, the attempt and its fence, as BullMQ's own
 *  workers make theirs from the worker's id and a per-job counter. A report that names
 *  anything else presents another token, and BullMQ's lock check refuses it. */
const tokenOf = (runner, attempt, fence) => `${runner}/${attempt}/${fence}`;

contract.run(async () => {
  const options = parseArgs(process.argv.slice(2));
  let started;
  try {
    started = await redisServer.start(options.redisServer, options.dataDir, options.appendfsync);
  } catch (error) {
    process.stderr.write(`${error.message}\n`);
    process.exit(255);
  }
  const redis = new Redis({ host: '127.0.0.1', port: started.port, maxRetriesPerRequest: 1 });
  redis.on('error', (error) => process.stderr.write(`redis: ${error.message}\n`));
  const adapter = new Adapter(options, redis, started.port);
  await adapter.resume();
  contract.listen(adapter, options.listen, () => {
    if (started.child) started.child.kill('SIGTERM');
  });
});
