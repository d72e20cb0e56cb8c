'use strict';
// fencelab's control-plane contract (docs/protocol.md) served by pg-boss on PostgreSQL.
// Every decision about a job is pg-boss's:
//
//   submit     boss.send(queue, data, {expireInSeconds, retryLimit})   a queue per deployment
//                                                 key, policy `singleton` (one active job)
//   claim      boss.fetch(queue)                 pg-boss picks the job and sets it active
//   result     boss.complete / boss.fail (job id) affected 1 accepted, 0 refused
//   expiry     pg-boss's maintenance (failJobsByTimeout): an active job past started_on +
//              expire_in goes back to `retry` under the same id (recorded as `requeued`)
//   heartbeat  none in pg-boss 10: answered from pg-boss's view of the job (active or not),
//              extending nothing
//
// The adapter keeps what pg-boss has no place for (projects, runners and their tokens,
// attempt ids, fences, the ledger) in tables of its own (`fl_*`) in pg-boss's schema, and
// runs each pg-boss call in the same transaction as the ledger entry that records it
// (pg-boss takes a `db` option per call), so a decision and its entry commit together. It
// adds no protection pg-boss lacks: a report is matched to pg-boss's job by the job id
// alone, as `complete(id)` is; a capability is granted to whoever asks; nothing is ever
// reconciled. `--reports=fetch-checked` is the user-side pattern of docs/analyses/pg-boss.md.
// Every mapping and why: systems/pg-boss/system.toml and docs/analyses/pg-boss.md.

const PgBoss = require('pg-boss');
const plans = require('pg-boss/src/plans');
const pg = require('pg');
const wire = require('../node-common/wire');
const contract = require('../node-common/contract');

const { ApiError } = wire;
const { hex, stringify, RawJson, exists } = contract;

/** Retries pg-boss may make of a job (its default is 2; see system.toml): every expiry is a retry. */
const RETRY_LIMIT = 1000000;
/** How often pg-boss's maintenance (and so its expiry) runs: its smallest interval. */
const MAINTENANCE_INTERVAL_S = 1;
/** The words pg-boss writes into a job it expired (`failJobsByTimeout`). */
const EXPIRED_MESSAGE = 'job failed by timeout in active state';
/** Bounds on every database wait (docs/protocol.md, "Bounds and failures"). */
const POOL = {
  max: 8, connectionTimeoutMillis: 5000, query_timeout: 8000, statement_timeout: 8000,
  lock_timeout: 5000, idle_in_transaction_session_timeout: 10000, application_name: 'fencelab-pg-boss',
};
const WORDS = { created: 'queued', retry: 'queued', active: 'running', completed: 'succeeded', failed: 'failed', cancelled: 'failed' };

function parseArgs(argv) {
  const options = contract.options(argv, {
    names: { '--database-url': 'databaseUrl', '--schema': 'schema', '--reports': 'reports' },
    required: ['databaseUrl', 'schema'],
    choices: { reports: ['boss', 'fetch-checked'] },
    // pg-boss refuses an expiration under one second (expireInSeconds >= 1).
    lease: { min: 1000, why: '--lease-ms must be an integer of at least 1000 (pg-boss expires in whole seconds or more)' },
  });
  if (!/^[a-z_][a-z0-9_]{0,49}$/.test(options.schema)) contract.usage('adapter.js', '--schema must be 1 to 50 of [a-z0-9_], not starting with a digit');
  return options;
}

const queueOf = (key) => `deploy_${hex(key)}`;
const ms = (text) => Number(text);

class Adapter {
  constructor(options, pool) {
    this.options = options;
    this.pool = pool;
    this.s = options.schema;
    this.serial = contract.serial();
    this.queues = new Set();
  }

  // ---------------------------------------------------------------- the database

  /**
   * Runs `work(client, db)` in one transaction (`db` is pg-boss's `{executeSql}` on it). An
   * `ApiError` from `work` rolls back and is answered; a database failure before COMMIT is
   * 503 `unavailable`, one at COMMIT 503 `outcome_unknown` (it may have committed).
   */
  async transact(work) {
    let client;
    try {
      client = await this.pool.connect();
    } catch (error) {
      throw contract.unavailable(false, `the database could not be reached (${error.message})`);
    }
    let broken;
    try {
      await client.query('BEGIN');
      const value = await work(client, { executeSql: (text, values) => client.query(text, values) });
      try {
        await client.query('COMMIT');
      } catch (error) {
        broken = error;
        throw contract.unavailable(true, `COMMIT got no answer (${error.message})`);
      }
      return value;
    } catch (error) {
      if (error instanceof ApiError) {
        if (!broken) await client.query('ROLLBACK').catch((cause) => { broken = cause; });
        throw error;
      }
      broken = error;
      client.query('ROLLBACK').catch(() => {});
      throw contract.unavailable(false, `the database failed (${error.message})`);
    } finally {
      client.release(broken);
    }
  }

  /** The database's clock now, in Unix ms: the receipt time of every decision (pg-boss
   *  judges leases on `now()`, the transaction's start, which is this). */
  async now(client) {
    const { rows } = await client.query('SELECT floor(extract(epoch FROM now()) * 1000)::bigint AS now');
    return ms(rows[0].now);
  }

  /** Appends a ledger entry in `client`'s transaction; its `seq` is one past the largest
   *  (every writer runs in `serial`, one process). */
  async append(client, entry) {
    const { rows } = await client.query(`SELECT coalesce(max(seq), 0) + 1 AS seq FROM ${this.s}.fl_ledger`);
    const seq = ms(rows[0].seq);
    await client.query(`INSERT INTO ${this.s}.fl_ledger (seq, job, entry) VALUES ($1, $2, $3)`, [seq, entry.job, stringify(entry)]);
    return seq;
  }

  async jobRecord(client, id) {
    const { rows } = await client.query(`SELECT * FROM ${this.s}.fl_jobs WHERE id = $1`, [id]);
    return rows.length ? jobOf(rows[0]) : null;
  }

  async attemptRecord(client, id) {
    const { rows } = await client.query(`SELECT * FROM ${this.s}.fl_attempts WHERE id = $1`, [id]);
    return rows.length ? attemptOf(rows[0]) : null;
  }

  /** The adapter's records in `client`'s transaction as the contract's decisions read and
   *  write them (see contract.js): an attempt's record, and the ledger entry written with the
   *  attempt record it changed. */
  book(client) {
    return {
      attempt: (id) => this.attemptRecord(client, id),
      append: async (entry, attempt) => {
        if (attempt) await this.saveAttempt(client, attempt);
        return this.append(client, entry);
      },
    };
  }

  async saveAttempt(client, a) {
    await client.query(
      `INSERT INTO ${this.s}.fl_attempts (id, job, runner, fence, state, claimed_ms, lease_expires_ms, started_us, closed_by)
       VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9)
       ON CONFLICT (id) DO UPDATE SET state = $5, lease_expires_ms = $7, closed_by = $9`,
      [a.id, a.job, a.runner, a.fence, a.state, a.claimed_ms, a.lease_expires_ms, a.started_us, a.closed_by || null],
    );
  }

  /** The queue of a deployment key, made once: policy `singleton`, at most one active job. */
  async queue(db, key) {
    const name = queueOf(key);
    if (!this.queues.has(name)) {
      await this.boss.createQueue(name, { policy: 'singleton' });
      this.queues.add(name);
    }
    return name;
  }

  // ---------------------------------------------------------------- expiry: pg-boss's maintenance

  /**
   * pg-boss's `db`: every statement it runs goes to the pool, and its expiry command runs
   * one at a time with the rules, followed by the recording of what it expired.
   */
  bossDb() {
    const expire = plans.locked(this.s, plans.failJobsByTimeout(this.s));
    return {
      executeSql: (text, values) => {
        if (text !== expire) return this.pool.query(text, values);
        return this.serial(async () => {
          try {
            return await this.pool.query(text, values);
          } finally {
            await this.recordExpiries().catch((error) => process.stderr.write(`recording expiries: ${error.message}\n`));
          }
        });
      },
    };
  }

  /**
   * Records each attempt pg-boss's maintenance expired: its job is back in `retry` (or
   * `failed`) from the very fetch the attempt got (`started_on` unchanged), with the words
   * pg-boss writes when it expires a job. Run after every maintenance and at start, so an
   * expiry a crash left unrecorded is recorded then.
   */
  async recordExpiries() {
    await this.transact(async (client) => {
      const { rows } = await client.query(
        `SELECT a.id, j.state::text AS boss_state FROM ${this.s}.fl_attempts a JOIN ${this.s}.fl_jobs f ON f.id = a.job
           JOIN ${this.s}.job j ON j.id = f.boss_id
          WHERE a.state = 'running' AND (extract(epoch FROM j.started_on) * 1000000)::bigint = a.started_us
            AND j.state IN ('retry', 'failed') AND j.output -> 'value' ->> 'message' = $1
          ORDER BY a.id`,
        [EXPIRED_MESSAGE],
      );
      const now = await this.now(client);
      for (const row of rows) {
        const attempt = await this.attemptRecord(client, row.id);
        const job = await this.jobRecord(client, attempt.job);
        const entry = contract.expired(job, attempt, row.boss_state === 'retry' ? 'requeued' : 'failed', now);
        await this.book(client).append(entry, attempt);
      }
    });
  }

  // ---------------------------------------------------------------- operator

  who(request) {
    return contract.who(request, this.options.operatorToken, async (token) => {
      const { rows } = await this.pool.query(`SELECT who FROM ${this.s}.fl_tokens WHERE token = $1`, [token]);
      return rows.length === 0 ? null : rows[0].who;
    });
  }

  async createProject(who, body) {
    const req = contract.readProject(who, body);
    const token = contract.newToken();
    return this.transact(async (client) => {
      const made = await client.query(`INSERT INTO ${this.s}.fl_projects (id) VALUES ($1) ON CONFLICT DO NOTHING`, [req.id]);
      if (made.rowCount === 0) throw exists(`project ${req.id}`);
      await client.query(`INSERT INTO ${this.s}.fl_tokens (token, who) VALUES ($1, $2)`, [token, JSON.stringify({ kind: 'registration', project: req.id })]);
      return [201, { id: req.id, registration_token: token }];
    });
  }

  async registerRunner(who, body) {
    const { id, project } = contract.readRunner(who, body);
    const token = contract.newToken();
    return this.transact(async (client) => {
      const known = await client.query(`SELECT 1 FROM ${this.s}.fl_projects WHERE id = $1`, [project]);
      if (known.rowCount === 0) throw contract.unknownProject(project);
      const made = await client.query(`INSERT INTO ${this.s}.fl_runners (id, project) VALUES ($1, $2) ON CONFLICT DO NOTHING`, [id, project]);
      if (made.rowCount === 0) throw exists(`runner ${id}`);
      await client.query(`INSERT INTO ${this.s}.fl_tokens (token, who) VALUES ($1, $2)`, [token, JSON.stringify({ kind: 'runner', project, runner: id })]);
      return [201, { id, project, token }];
    });
  }

  /** The operator's submit is pg-boss's `send`, in the transaction of its ledger entry. */
  async submit(who, body) {
    const req = contract.readSubmit(who, body);
    return this.serial(() => this.transact(async (client, db) => {
      const known = await client.query(`SELECT 1 FROM ${this.s}.fl_projects WHERE id = $1`, [req.project]);
      if (known.rowCount === 0) throw contract.unknownProject(req.project);
      const id = req.id === undefined ? await this.freeId(client) : req.id;
      if (await this.jobRecord(client, id)) throw exists(`job ${id}`);
      const queue = await this.queue(db, req.deployment_key);
      const options = { db, expireInSeconds: this.options.leaseMs / 1000, retryLimit: RETRY_LIMIT };
      const bossId = await this.boss.send(queue, { job: id }, options);
      if (!bossId) throw new ApiError(500, 'internal', `pg-boss did not take job ${id}`);
      const { spec, entry } = contract.submitted(req, id, await this.now(client));
      await client.query(
        `INSERT INTO ${this.s}.fl_jobs (id, project, deployment_key, spec, boss_id, queue, attempts) VALUES ($1, $2, $3, $4, $5, $6, 0)`,
        [id, req.project, req.deployment_key, JSON.stringify(spec), bossId, queue],
      );
      await this.append(client, entry);
      return [201, { id }];
    }));
  }

  async freeId(client) {
    for (let tries = 0; tries < 1000; tries += 1) {
      const { rows } = await client.query(
        `INSERT INTO ${this.s}.fl_counters (name, value) VALUES ('job', 1) ON CONFLICT (name) DO UPDATE SET value = fl_counters.value + 1 RETURNING value`,
      );
      const id = `j${rows[0].value}`;
      if (!(await this.jobRecord(client, id))) return id;
    }
    throw new ApiError(500, 'internal', 'no free generated job id');
  }

  // ---------------------------------------------------------------- runners

  async claim(who, body) {
    const req = contract.readClaim(who, body);
    return this.serial(() => this.transact((client, db) => this.grant(client, db, who, req)));
  }

  /**
   * The project's queues whose next job (in pg-boss's own fetch order: priority, then
   * creation) is the project's, oldest first; each is asked with `fetch` in turn. pg-boss
   * answers nothing for a queue whose singleton slot is taken. A fetch that served another
   * project's job is undone with its savepoint (routing only: it never reaches a runner).
   */
  async grant(client, db, who, req) {
    const { rows } = await client.query(
      `SELECT DISTINCT ON (j.name) j.name, j.id, f.project, j.created_on FROM ${this.s}.job j JOIN ${this.s}.fl_jobs f ON f.boss_id = j.id
        WHERE j.state < 'active' AND j.start_after < now() ORDER BY j.name, j.priority DESC, j.created_on, j.id`,
    );
    const candidates = rows.filter((row) => row.project === who.project).sort((a, b) => a.created_on - b.created_on);
    for (const candidate of candidates) {
      await client.query('SAVEPOINT boss_fetch');
      const [got] = await this.boss.fetch(candidate.name, { db, includeMetadata: true });
      const job = got && (await this.bossJob(client, got.id));
      if (!job || job.project !== who.project) {
        await client.query('ROLLBACK TO SAVEPOINT boss_fetch');
        continue;
      }
      await client.query('RELEASE SAVEPOINT boss_fetch');
      return this.granted(client, who, req, job, got.id);
    }
    return contract.NO_GRANT;
  }

  async bossJob(client, bossId) {
    const { rows } = await client.query(`SELECT * FROM ${this.s}.fl_jobs WHERE boss_id = $1`, [bossId]);
    return rows.length ? jobOf(rows[0]) : null;
  }

  /** A grant of the fetch pg-boss just made: its `started_on` (the transaction's `now()`)
   *  is the receipt time, and the lease ends `lease_ms` later, when pg-boss's expire_in does. */
  async granted(client, who, req, job, bossId) {
    const { rows } = await client.query(
      `SELECT floor(extract(epoch FROM started_on) * 1000)::bigint AS started_ms, (extract(epoch FROM started_on) * 1000000)::bigint AS started_us
         FROM ${this.s}.job WHERE id = $1`,
      [bossId],
    );
    const now = ms(rows[0].started_ms);
    const lease = now + this.options.leaseMs;
    const counted = await client.query(
      `INSERT INTO ${this.s}.fl_counters (name, value) VALUES ('fence', 1) ON CONFLICT (name) DO UPDATE SET value = fl_counters.value + 1 RETURNING value`,
    );
    const fence = ms(counted.rows[0].value);
    const attempt = contract.nextAttempt(job);
    const { record, entry, answer } = contract.grant(who, req, job, { attempt, fence, now, lease }, this.options.leaseMs);
    await this.saveAttempt(client, { ...record, started_us: rows[0].started_us });
    await client.query(`UPDATE ${this.s}.fl_jobs SET attempts = attempts + 1, current_attempt = $2 WHERE id = $1`, [job.id, attempt]);
    await this.append(client, entry);
    return answer;
  }

  /** A report's checks, then `decide(client, db, req, job, now)` in one transaction. */
  async report(who, body, extra, decide) {
    const req = contract.readReport(who, body, extra);
    return this.serial(() => this.transact(async (client, db) => {
      const job = contract.ownJob(await this.jobRecord(client, req.job), req, who);
      return decide(client, db, req, job, await this.now(client));
    }));
  }

  /**
   * pg-boss's view of the job's current fetch: its state, and the instant its expiration
   * ends (`started_on` + the lease). With `--reports=fetch-checked`, null unless the fetch
   * is the one `req`'s attempt got and its expiration has not ended (the user-side pattern).
   */
  async view(client, db, req, job, now) {
    const row = await this.boss.getJobById(job.queue, job.boss_id, { db });
    if (!row || row.state !== 'active') return null;
    const end = Math.floor(row.startedOn.getTime()) + this.options.leaseMs;
    if (this.options.reports !== 'fetch-checked') return { end };
    const attempt = await this.attemptRecord(client, req.attempt);
    const { rows } = await client.query(`SELECT (extract(epoch FROM started_on) * 1000000)::bigint AS started_us FROM ${this.s}.job WHERE id = $1 FOR UPDATE`, [job.boss_id]);
    const same = attempt && attempt.job === job.id && attempt.runner === req.runner && BigInt(attempt.fence) === req.fence && attempt.started_us === rows[0].started_us;
    return same && end > now ? { end } : null;
  }

  /**
   * pg-boss has no heartbeat (nothing extends a job's expiration in 10.x). The answer is
   * pg-boss's view: accepted while the job is active — whichever fetch holds it, as
   * `complete(id)` would accept — with the expiration as it stands, unchanged; else refused.
   */
  async heartbeat(who, body) {
    return this.report(who, body, {}, async (client, db, req, job, now) => {
      const seen = await this.view(client, db, req, job, now);
      if (!seen) return contract.refused(this.book(client), 'heartbeat', who, job, req, now);
      return contract.heartbeatAccepted(this.book(client), who, job, req, now, seen.end, false);
    });
  }

  /**
   * pg-boss has no capability: whoever asks is granted one, for the claim as presented, for
   * `CAPABILITY_TTL_MS`, with no call to pg-boss. With `--reports=fetch-checked` only while
   * the claim's fetch holds the job, expiring with it.
   */
  async capability(who, body) {
    return this.report(who, body, {}, async (client, db, req, job, now) => {
      let hold;
      if (this.options.reports === 'fetch-checked') {
        const seen = await this.view(client, db, req, job, now);
        hold = seen ? seen.end : null;
      }
      return contract.capability(this.book(client), this.options.secret, who, job, req, now, hold);
    });
  }

  /** `complete(id)` or `fail(id)`: pg-boss's answer (rows affected) is the decision. */
  async result(who, body) {
    return this.report(who, body, contract.RESULT, async (client, db, req, job, now) => {
      if (this.options.reports === 'fetch-checked' && !(await this.view(client, db, req, job, now))) {
        return contract.lateResult(this.book(client), who, job, req, now);
      }
      const data = { attempt: req.attempt, detail: req.detail || null };
      const answer = req.outcome === 'succeeded'
        ? await this.boss.complete(job.queue, job.boss_id, data, { db })
        : await this.boss.fail(job.queue, job.boss_id, data, { db });
      if (answer.affected !== 1) return contract.lateResult(this.book(client), who, job, req, now);
      return contract.resultAccepted(this.book(client), who, job, req, now);
    });
  }

  // ---------------------------------------------------------------- reads

  /** Job views; a job's state is pg-boss's (created and retry read `queued`). */
  async views(client, where, values, full) {
    const { rows } = await client.query(
      `SELECT f.*, j.state::text AS boss_state FROM ${this.s}.fl_jobs f LEFT JOIN ${this.s}.job j ON j.id = f.boss_id ${where} ORDER BY f.ord`,
      values,
    );
    const views = [];
    for (const row of rows) {
      const job = jobOf(row);
      const view = contract.jobView(job, WORDS[row.boss_state] || 'queued');
      if (full) await this.history(client, job, view);
      views.push(view);
    }
    return views;
  }

  async history(client, job, view) {
    const attempts = await client.query(`SELECT * FROM ${this.s}.fl_attempts WHERE job = $1 ORDER BY fence`, [job.id]);
    for (const row of attempts.rows) {
      const a = attemptOf(row);
      const shown = { id: a.id, job: a.job, runner: a.runner, fence: a.fence, state: a.state === 'running' ? 'running' : a.state, current: a.id === job.current_attempt, lease_expires_ms: a.lease_expires_ms, claimed_ms: a.claimed_ms };
      if (a.closed_by) shown.closed_by = a.closed_by;
      view.attempts.push(shown);
    }
    const entries = await client.query(`SELECT seq, entry FROM ${this.s}.fl_ledger WHERE job = $1 ORDER BY seq`, [job.id]);
    for (const row of entries.rows) view.ledger.push(JSON.parse(contract.withSeq(ms(row.seq), row.entry)));
  }

  async jobs() {
    return this.transact((client) => this.views(client, '', [], false));
  }

  async job(id) {
    return this.transact(async (client) => (await this.views(client, 'WHERE f.id = $1', [id], true))[0]);
  }

  async ledger(who, params) {
    const { after, limit } = contract.ledgerWindow(who, params);
    if (after >= wire.I64_MAX) return [200, []];
    let rows;
    try {
      ({ rows } = await this.pool.query(`SELECT seq, entry FROM ${this.s}.fl_ledger WHERE seq > $1 ORDER BY seq LIMIT $2`, [after.toString(), limit.toString()]));
    } catch (error) {
      throw contract.unavailable(false, `the database failed (${error.message})`);
    }
    return [200, new RawJson(`[${rows.map((row) => contract.withSeq(ms(row.seq), row.entry)).join(',')}]`)];
  }

  // ---------------------------------------------------------------- start

  /** The adapter's tables, next to pg-boss's in its schema (made under an advisory lock so
   *  that two starts on one schema do not race on the catalog). */
  async tables() {
    const s = this.s;
    await this.pool.query(`
      BEGIN;
      SELECT pg_advisory_xact_lock(hashtext('fencelab-pg-boss.${s}'));
      CREATE TABLE IF NOT EXISTS ${s}.fl_projects (id text PRIMARY KEY);
      CREATE TABLE IF NOT EXISTS ${s}.fl_runners (id text PRIMARY KEY, project text NOT NULL);
      CREATE TABLE IF NOT EXISTS ${s}.fl_tokens (token text PRIMARY KEY, who text NOT NULL);
      CREATE TABLE IF NOT EXISTS ${s}.fl_counters (name text PRIMARY KEY, value bigint NOT NULL);
      CREATE TABLE IF NOT EXISTS ${s}.fl_jobs (ord bigserial, id text PRIMARY KEY, project text NOT NULL, deployment_key text NOT NULL,
        spec text NOT NULL, boss_id uuid NOT NULL UNIQUE, queue text NOT NULL, attempts integer NOT NULL, current_attempt text);
      CREATE TABLE IF NOT EXISTS ${s}.fl_attempts (id text PRIMARY KEY, job text NOT NULL, runner text NOT NULL, fence bigint NOT NULL,
        state text NOT NULL, claimed_ms bigint NOT NULL, lease_expires_ms bigint NOT NULL, started_us bigint NOT NULL, closed_by text);
      CREATE TABLE IF NOT EXISTS ${s}.fl_ledger (seq bigint PRIMARY KEY, job text NOT NULL, entry text NOT NULL);
      COMMIT;`);
  }

  async start() {
    this.boss = new PgBoss({
      db: this.bossDb(), schema: this.s, supervise: true, schedule: false, migrate: true,
      maintenanceIntervalSeconds: MAINTENANCE_INTERVAL_S,
    });
    this.boss.on('error', (error) => process.stderr.write(`pg-boss: ${error.message}\n`));
    await this.boss.start();
    await this.tables();
    for (const row of (await this.pool.query(`SELECT DISTINCT deployment_key FROM ${this.s}.fl_jobs`)).rows) {
      this.queues.add(queueOf(row.deployment_key));
    }
    await this.serial(() => this.recordExpiries());
  }
}

function jobOf(row) {
  return {
    id: row.id, project: row.project, deployment_key: row.deployment_key, spec: JSON.parse(row.spec), boss_id: row.boss_id,
    queue: row.queue, attempts: Number(row.attempts), current_attempt: row.current_attempt || undefined,
  };
}

function attemptOf(row) {
  return {
    id: row.id, job: row.job, runner: row.runner, fence: ms(row.fence), state: row.state, claimed_ms: ms(row.claimed_ms),
    lease_expires_ms: ms(row.lease_expires_ms), started_us: row.started_us, closed_by: row.closed_by || undefined,
  };
}

contract.run(async () => {
  const options = parseArgs(process.argv.slice(2));
  const pool = new pg.Pool({ connectionString: options.databaseUrl, ...POOL });
  pool.on('error', (error) => process.stderr.write(`database: ${error.message}\n`));
  pool.on('connect', (client) => client.on('error', (error) => process.stderr.write(`database: ${error.message}\n`)));
  const adapter = new Adapter(options, pool);
  try {
    await adapter.start();
  } catch (error) {
    process.stderr.write(`cannot start on the database: ${error.stack || error}\n`);
    process.exit(255);
  }
  contract.listen(adapter, options.listen);
});
