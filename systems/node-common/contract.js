'use strict';
// What fencelab's control-plane contract (docs/protocol.md) asks of an adapter that no job
// system decides: the command line, the HTTP server and its routes, the checks every request
// passes before a rule (token kind, shapes, field domains), the answers' JSON, the
// capability's signature, one-at-a-time rules and bounded calls, and how each decision a job
// system makes is recorded in the contract's words (the attempt it changes, its ledger entry,
// its answer, a refusal's reason). Each adapter (systems/bullmq, systems/pg-boss) brings the
// rules, every one decided by its job system, and its own store for projects, runners,
// tokens, attempts and the ledger.

const crypto = require('node:crypto');
const http = require('node:http');
const wire = require('./wire');

const { ApiError } = wire;

/** How long a capability the adapter grants lives when nothing shortens it. */
const CAPABILITY_TTL_MS = 30000;

/**
 * Reads `--name=value` words into `defaults`' copy: `names` maps a flag to its option,
 * `required` lists the options that must be given. A bad command line exits 254.
 */
function parseArgs(program, argv, names, defaults, required) {
  const options = { ...defaults };
  for (const arg of argv) {
    const eq = arg.indexOf('=');
    const name = names[eq < 0 ? arg : arg.slice(0, eq)];
    if (!name || eq < 0) usage(program, `unknown or incomplete argument ${arg} (each is --name=value)`);
    options[name] = arg.slice(eq + 1);
  }
  for (const option of required) {
    if (!options[option]) usage(program, `--${option.replace(/[A-Z]/g, (c) => `-${c.toLowerCase()}`)} is required`);
  }
  return options;
}

/** The lease an adapter takes when its job system sets no bound of its own. */
const LEASE = { min: 1, why: '--lease-ms must be a positive integer' };

/**
 * An adapter's command line: the contract's flags (`--listen`, default 127.0.0.1:7400;
 * `--lease-ms`, default 2000, an integer of at least `lease.min`, else `lease.why`;
 * `--operator-token`, `--secret`, both required) and the job system's own: `names`,
 * `defaults`, `required`, and `choices`, an option's allowed words (the first its default).
 * A bad command line exits 254.
 */
function options(argv, { names = {}, defaults = {}, required = [], choices = {}, lease = LEASE }) {
  const all = { '--listen': 'listen', '--lease-ms': 'leaseMs', '--operator-token': 'operatorToken', '--secret': 'secret', ...names };
  const chosen = Object.fromEntries(Object.entries(choices).map(([name, words]) => [name, words[0]]));
  const start = { listen: '127.0.0.1:7400', leaseMs: 2000, ...chosen, ...defaults };
  const read = parseArgs('adapter.js', argv, all, start, ['operatorToken', 'secret', ...required]);
  read.leaseMs = Number(read.leaseMs);
  if (!Number.isInteger(read.leaseMs) || read.leaseMs < lease.min) usage('adapter.js', lease.why);
  for (const [name, words] of Object.entries(choices)) {
    const flag = `--${name.replace(/[A-Z]/g, (c) => `-${c.toLowerCase()}`)}`;
    if (!words.includes(read[name])) usage('adapter.js', `${flag} must be ${words.join(' or ')}`);
  }
  return read;
}

function usage(program, why) {
  process.stderr.write(`${program}: ${why}\n`);
  process.exit(254);
}

/** JSON text where BigInt values are written as JSON numbers, exactly. */
function stringify(value) {
  return JSON.stringify(value, (_, v) => (typeof v === 'bigint' ? `__big:${v}` : v)).replace(/"__big:(-?[0-9]+)"/g, '$1');
}

const hex = (text) => Buffer.from(text, 'utf8').toString('hex');
const monoNs = () => process.hrtime.bigint();

/** One at a time: every rule given to the returned function runs after the one before. */
function serial() {
  let tail = Promise.resolve();
  return (work) => {
    const run = tail.then(work, work);
    tail = run.catch(() => {});
    return run;
  };
}

/** `promise`, or a 503 after `ms` (a call that mutates may have taken effect). */
function bounded(promise, mutates, ms, what) {
  let timer;
  const late = new Promise((_, reject) => {
    timer = setTimeout(() => reject(unavailable(mutates, `${what} did not answer in time`)), ms);
  });
  return Promise.race([promise, late]).finally(() => clearTimeout(timer));
}

function unavailable(mutates, why) {
  return mutates
    ? new ApiError(503, 'outcome_unknown', `${why}: the request may or may not have taken effect`)
    : new ApiError(503, 'unavailable', `${why}: the request did not take effect`);
}

const forbidden = (what) => new ApiError(403, 'forbidden', `this token may not be used for ${what}`);
const invalidField = (why) => new ApiError(400, 'invalid_field', why);
const exists = (what) => new ApiError(409, 'exists', `${what} exists`);
const unknownProject = (project) => new ApiError(404, 'unknown_project', `no project ${project}`);
const newToken = () => crypto.randomBytes(24).toString('hex');

// ---------------------------------------------------------------- requests, checked in the contract's order

function readProject(who, body) {
  const req = wire.read(body, { id: ['string', true] });
  if (who.kind !== 'operator') throw forbidden('creating a project');
  if (!wire.isId(req.id)) throw invalidField('id is not an id');
  return req;
}

/** A runner registration: its id and the project it goes in (whose existence is the store's). */
function readRunner(who, body) {
  const req = wire.read(body, { project: ['string', false], id: ['string', true] });
  if (!wire.isId(req.id)) throw invalidField('id is not an id');
  let project = req.project;
  if (who.kind === 'operator') {
    if (project === undefined) throw new ApiError(400, 'missing_field', 'the operator must name the project');
  } else if (who.kind === 'registration') {
    if (project !== undefined && project !== who.project) throw forbidden('registering a runner in another project');
    project = who.project;
  } else {
    throw forbidden('registering a runner');
  }
  if (!wire.isId(project)) throw invalidField('project is not an id');
  return { id: req.id, project };
}

function readSubmit(who, body) {
  const spec = { steps: ['u32', true], step_ms: ['u64', true] };
  const req = wire.read(body, { project: ['string', true], id: ['string', false], deployment_key: ['string', true], spec: [spec, true] });
  if (who.kind !== 'operator') throw forbidden('submitting a job');
  for (const name of ['project', 'deployment_key', 'id']) {
    if (req[name] !== undefined && !wire.isId(req[name])) throw invalidField(`${name} is not an id`);
  }
  if (req.spec.steps < 1n || req.spec.steps > 1000n) throw invalidField('spec.steps must be 1 ..= 1000');
  if (req.spec.step_ms > 600000n) throw invalidField('spec.step_ms must be 0 ..= 600000');
  return req;
}

function runnerOf(who, named) {
  if (who.kind !== 'runner') throw forbidden('a runner call');
  if (named !== who.runner) throw new ApiError(403, 'runner_mismatch', `this token is runner ${who.runner}'s, not ${named}'s`);
}

function readClaim(who, body) {
  const req = wire.read(body, { runner: ['string', true], observed_ms: ['i64', true] });
  runnerOf(who, req.runner);
  return req;
}

/** A claim report (heartbeat, capability, result with `extra`): up to the job's lookup. */
function readReport(who, body, extra = {}) {
  const shape = { job: ['string', true], attempt: ['string', true], runner: ['string', true], fence: ['u64', true], observed_ms: ['i64', true], ...extra };
  const req = wire.read(body, shape);
  runnerOf(who, req.runner);
  if (req.fence > wire.I64_MAX) throw invalidField('fence is above i64::MAX');
  return req;
}

const RESULT = { outcome: [['succeeded', 'failed'], true], detail: ['string', false] };

const unknownJob = (job, project) => new ApiError(404, 'unknown_job', `no job ${job} in project ${project}`);

/** A ledger page's bounds: `after` (default 0) and `limit` clamped to 1 ..= 10 000. */
function ledgerWindow(who, params) {
  if (who.kind !== 'operator') throw forbidden('reading the ledger');
  const after = params.after === undefined ? 0n : params.after;
  let limit = params.limit === undefined ? 1000n : params.limit;
  limit = limit < 1n ? 1n : limit > 10000n ? 10000n : limit;
  return { after, limit };
}

/** A ledger entry's stored text with its `seq` first. */
const withSeq = (seq, text) => `{"seq":${seq},${text.slice(1)}`;

/** A ledger entry for a report: the claim as the runner sent it, the receipt time. */
function reportEntry(kind, who, job, req, now, more) {
  return {
    kind, project: who.project, job: job.id, attempt: req.attempt, runner: req.runner, fence: req.fence,
    deployment_key: job.deployment_key, received_ms: now, observed_ms: req.observed_ms, mono_ns: monoNs(), ...more,
  };
}

/** The contract's reason for a refusal its job system made (docs/protocol.md, "Standing"),
 *  from the adapter's record of the attempt (null when there is none) and of the job. */
function standing(attempt, job, req, now) {
  if (!attempt) return 'unknown';
  if (attempt.job !== job.id || attempt.runner !== req.runner || BigInt(attempt.fence) !== req.fence) return 'not_current';
  if (job.current_attempt !== attempt.id) return 'superseded';
  if (attempt.state === 'running' && attempt.lease_expires_ms <= now) return 'expired';
  if (attempt.state === 'running') return 'expired';
  return 'not_current';
}

/** A capability for `req`'s claim on `key`, signed with the secret the target shares. */
function sign(secret, key, req, expires) {
  const message = [key, req.job, req.attempt, req.runner, req.fence, expires].join('\n');
  const signature = crypto.createHmac('sha256', secret).update(message, 'utf8').digest('hex');
  return { deployment_key: key, job: req.job, attempt: req.attempt, runner: req.runner, fence: req.fence, expires_ms: expires, signature };
}

// ---------------------------------------------------------------- what an adapter records of its job system's decisions
//
// Each function below records one decision the job system made, in the contract's words,
// through `book`, the adapter's store as one decision sees it: `attempt(id)`, the adapter's
// record of an attempt (null when there is none), and `append(entry, attempt)`, which
// appends a ledger entry and writes the attempt record it changed (if any) with it, and
// resolves to the entry's `seq`. Nothing here decides: the adapter calls the one that names
// what its job system answered.

/** The operator's submission as the contract states it: the job's spec and its ledger entry. */
function submitted(req, id, now) {
  const spec = { steps: Number(req.spec.steps), step_ms: Number(req.spec.step_ms) };
  const entry = { kind: 'submit', project: req.project, job: id, deployment_key: req.deployment_key, received_ms: now, mono_ns: monoNs() };
  return { spec, entry };
}

/** The id of the attempt a grant of `job` starts. */
const nextAttempt = (job) => `${job.id}-a${job.attempts + 1}`;

/** A claim's answer when the job system served nothing. */
const NO_GRANT = [200, { grant: null }];

/**
 * A grant the job system made of `job` to `who`: the attempt's record, the claim's ledger
 * entry and the answer, its lease from `now` (the grant's receipt time) to `lease`. The
 * adapter writes the record and the entry together, with whatever else of its own the
 * grant changed.
 */
function grant(who, req, job, { attempt, fence, now, lease }, leaseMs) {
  const record = { id: attempt, job: job.id, runner: who.runner, fence, state: 'running', claimed_ms: now, lease_expires_ms: lease };
  const entry = {
    kind: 'claim', project: job.project, job: job.id, attempt, runner: who.runner, fence, deployment_key: job.deployment_key,
    decision: 'accepted', received_ms: now, observed_ms: req.observed_ms, mono_ns: monoNs(), lease_expires_ms: lease,
  };
  const claim = { job: job.id, attempt, runner: who.runner, fence };
  const answer = [200, { grant: { claim, project: job.project, deployment_key: job.deployment_key, spec: job.spec, lease_ms: leaseMs, lease_expires_ms: lease } }];
  return { record, entry, answer };
}

/** The job a report names, if it is in the reporting runner's project; else 404. */
function ownJob(job, req, who) {
  if (!job || job.project !== who.project) throw unknownJob(req.job, who.project);
  return job;
}

/** A refusal the job system made, recorded with the contract's reason for it (docs/protocol.md,
 *  "Standing"), read from the adapter's record of the attempt. */
async function refused(book, kind, who, job, req, now, more = {}) {
  const reason = standing(await book.attempt(req.attempt), job, req, now);
  const seq = await book.append(reportEntry(kind, who, job, req, now, { decision: 'rejected', reason, ...more }));
  return [409, { decision: 'rejected', reason, ledger_seq: seq }];
}

/** A result the job system refused: recorded as a late observation, its outcome kept. */
const lateResult = (book, who, job, req, now) =>
  refused(book, 'result', who, job, req, now, { outcome: req.outcome, recorded_as: 'late_observation' });

/** A heartbeat the job system accepted, the lease ending at `lease`; `extended`: the job
 *  system moved the lease there, and the attempt's record says so. */
async function heartbeatAccepted(book, who, job, req, now, lease, extended) {
  let changed = null;
  if (extended) {
    changed = await book.attempt(req.attempt);
    changed.lease_expires_ms = lease;
  }
  const seq = await book.append(reportEntry('heartbeat', who, job, req, now, { decision: 'accepted', lease_expires_ms: lease }), changed);
  return [200, { decision: 'accepted', ledger_seq: seq, lease_expires_ms: lease }];
}

/** A result the job system accepted: the attempt closed with the outcome reported. */
async function resultAccepted(book, who, job, req, now) {
  const attempt = await book.attempt(req.attempt);
  if (attempt) {
    attempt.state = req.outcome;
    attempt.closed_by = 'result';
  }
  const seq = await book.append(reportEntry('result', who, job, req, now, { decision: 'accepted', outcome: req.outcome }), attempt);
  return [200, { decision: 'accepted', ledger_seq: seq }];
}

/**
 * A capability for `req`'s claim, signed with `secret`. `hold` is what the job system was
 * asked: undefined when it was not (it has no capability, so one is granted to whoever asks,
 * living `CAPABILITY_TTL_MS`), else the end of its hold on the claim, null when it holds none
 * (refused); a capability never outlives the hold.
 */
async function capability(book, secret, who, job, req, now, hold) {
  let expires = now + CAPABILITY_TTL_MS;
  if (hold !== undefined) {
    if (hold === null) return refused(book, 'capability', who, job, req, now);
    expires = Math.min(expires, hold);
  }
  const attempt = await book.attempt(req.attempt);
  const lease = attempt ? attempt.lease_expires_ms : now;
  const signed = sign(secret, job.deployment_key, req, expires);
  const seq = await book.append(reportEntry('capability', who, job, req, now, { decision: 'accepted', lease_expires_ms: lease }));
  return [200, { decision: 'accepted', ledger_seq: seq, lease_expires_ms: lease, capability: signed }];
}

/** The job system ended `attempt`'s claim on its own (`recordedAs`: `requeued` or `failed`):
 *  the attempt closed, and the ledger entry that records it. */
function expired(job, attempt, recordedAs, now) {
  attempt.state = 'failed';
  attempt.closed_by = 'expired-requeued';
  return {
    kind: 'expire', project: job.project, job: job.id, attempt: attempt.id, runner: attempt.runner, fence: attempt.fence,
    deployment_key: job.deployment_key, recorded_as: recordedAs, received_ms: now, mono_ns: monoNs(),
    lease_expires_ms: attempt.lease_expires_ms,
  };
}

/** A job as the reads show it, in the state the job system gives it (a contract word);
 *  its attempts and ledger are the adapter's to fill for a full view. */
function jobView(job, state) {
  const view = { id: job.id, project: job.project, deployment_key: job.deployment_key, spec: job.spec, state };
  if (job.current_attempt !== undefined) view.current_attempt = job.current_attempt;
  if (state === 'succeeded' || state === 'failed') view.outcome = state;
  view.attempts = [];
  view.ledger = [];
  return view;
}

/** JSON already written. */
class RawJson {
  constructor(text) {
    this.text = text;
  }
}

// ---------------------------------------------------------------- routes and the server

function routes(adapter) {
  const post = (handle) => async (request, who) => {
    if (!wire.isJson(request.headers['content-type'])) throw new ApiError(415, 'unsupported_media_type', 'the body must be application/json');
    const text = await wire.body(request);
    return handle.call(adapter, who, wire.parseJson(text));
  };
  return [
    { path: /^\/v1\/health$/, methods: { GET: { open: true, handle: async () => [200, { status: 'ok' }] } } },
    { path: /^\/v1\/projects$/, methods: { POST: { handle: post(adapter.createProject) } } },
    { path: /^\/v1\/runners$/, methods: { POST: { handle: post(adapter.registerRunner) } } },
    {
      path: /^\/v1\/jobs$/,
      methods: { POST: { handle: post(adapter.submit) }, GET: { handle: (_, who) => jobs(adapter, who) } },
    },
    { path: /^\/v1\/jobs\/([^/]+)$/, methods: { GET: { idPath: true, handle: (_, who, id) => job(adapter, who, id) } } },
    { path: /^\/v1\/claim$/, methods: { POST: { handle: post(adapter.claim) } } },
    { path: /^\/v1\/heartbeat$/, methods: { POST: { handle: post(adapter.heartbeat) } } },
    { path: /^\/v1\/capability$/, methods: { POST: { handle: post(adapter.capability) } } },
    { path: /^\/v1\/result$/, methods: { POST: { handle: post(adapter.result) } } },
    { path: /^\/v1\/ledger$/, methods: { GET: { ledger: true, handle: (_, who, __, params) => adapter.ledger(who, params) } } },
  ];
}

/** Every job's view, for the operator only. */
async function jobs(adapter, who) {
  if (who.kind !== 'operator') throw forbidden('reading jobs');
  return [200, await adapter.jobs()];
}

/** One job's full view, for the operator only; 404 when the adapter has no such job. */
async function job(adapter, who, id) {
  if (who.kind !== 'operator') throw forbidden('reading a job');
  const view = await adapter.job(id);
  if (!view) throw new ApiError(404, 'unknown_job', `no job ${id}`);
  return [200, view];
}

/** Who a request is: the operator by its token, else what `lookup(token)` (the store's
 *  record of the token as JSON text, null when it has none) says; an unknown token is 401. */
async function who(request, operatorToken, lookup) {
  const token = wire.bearer(request);
  if (token === operatorToken) return { kind: 'operator' };
  const text = await lookup(token);
  if (text === null) throw new ApiError(401, 'unauthorized', 'the bearer token is not known');
  return JSON.parse(text);
}

function decodePath(text) {
  try {
    return decodeURIComponent(text);
  } catch {
    if (/%(?![0-9a-fA-F]{2})/.test(text)) return text;
    throw new ApiError(400, 'invalid_path', 'the path does not percent-decode to UTF-8');
  }
}

async function serve(adapter, request) {
  const target = request.url;
  const mark = target.indexOf('?');
  const path = mark < 0 ? target : target.slice(0, mark);
  const search = mark < 0 ? '' : target.slice(mark + 1);
  const route = routes(adapter).find((candidate) => candidate.path.test(path));
  if (!route) throw new ApiError(404, 'no_route', `no route ${path}`);
  const method = request.method === 'HEAD' && route.methods.GET ? 'GET' : request.method;
  const chosen = route.methods[method];
  if (!chosen) {
    const allow = Object.keys(route.methods).flatMap((m) => (m === 'GET' ? ['GET', 'HEAD'] : [m])).join(', ');
    throw new ApiError(405, 'method_not_allowed', `${request.method} is not allowed on ${path}`, { Allow: allow });
  }
  const params = chosen.ledger ? wire.query(search, ['after', 'limit']) : {};
  const id = chosen.idPath ? decodePath(route.path.exec(path)[1]) : undefined;
  const who = chosen.open ? null : await adapter.who(request);
  return chosen.handle(request, who, id, params);
}

function answer(response, status, value) {
  const text = value instanceof RawJson ? value.text : stringify(value);
  response.writeHead(status, { 'Content-Type': 'application/json', 'Content-Length': Buffer.byteLength(text) });
  response.end(response.req.method === 'HEAD' ? undefined : text);
}

/** What a request Node's HTTP parser refused is answered: a head too large, a body cut
 *  short (it could not be read), else not HTTP/1.x. */
function clientErrorAnswer(error) {
  if (error.code === 'HPE_HEADER_OVERFLOW') return [431, 'headers_too_large', 'the request head is too large'];
  if (error.code === 'HPE_INVALID_EOF_STATE') return [413, 'body_too_large', 'the body could not be read'];
  return [400, 'malformed_request', 'the request is not HTTP/1.x'];
}

/** The adapter's HTTP server. An error that is not an `ApiError` is the store's: 503, the
 *  outcome unknown for a POST (it may have taken effect). */
function server(adapter) {
  const handler = (request, response) => {
    serve(adapter, request)
      .then(([status, value]) => answer(response, status, value))
      .catch((error) => {
        if (!(error instanceof ApiError)) {
          process.stderr.write(`internal: ${error.stack || error}\n`);
          error = unavailable(request.method === 'POST', `the store failed (${error.message})`);
        }
        if (!response.headersSent) wire.sendError(response, error);
      });
  };
  const created = http.createServer({ maxHeaderSize: 16384 }, handler);
  created.on('clientError', (error, socket) => {
    const [status, code, why] = clientErrorAnswer(error);
    const text = JSON.stringify({ error: why, code, status });
    if (socket.writable) {
      socket.end(`HTTP/1.1 ${status} Error\r\nContent-Type: application/json\r\nContent-Length: ${Buffer.byteLength(text)}\r\nConnection: close\r\n\r\n${text}`);
    } else {
      socket.destroy();
    }
  });
  return created;
}

/** Serves `adapter` on `listen` (HOST:PORT), printing `{"listening": ADDR}` once bound;
 *  `stop` runs on SIGTERM and SIGINT, then the process exits 0. */
function listen(adapter, listenOn, stop = () => {}) {
  const [host, portText] = listenOn.split(':');
  const listening = server(adapter);
  listening.on('error', (error) => {
    process.stderr.write(`cannot listen on ${listenOn}: ${error.message}\n`);
    process.exit(255);
  });
  listening.listen(Number(portText), host, () => {
    const address = listening.address();
    process.stdout.write(`${JSON.stringify({ listening: `${address.address}:${address.port}` })}\n`);
  });
  const end = () => {
    stop();
    process.exit(0);
  };
  process.on('SIGTERM', end);
  process.on('SIGINT', end);
}

/** Runs an adapter's `main`: whatever it throws is printed and the process exits 255. */
function run(main) {
  main().catch((error) => {
    process.stderr.write(`${error.stack || error}\n`);
    process.exit(255);
  });
}

module.exports = {
  CAPABILITY_TTL_MS, RESULT, NO_GRANT, RawJson, options, usage, stringify, hex, monoNs, serial, bounded, unavailable,
  forbidden, invalidField, exists, unknownProject, unknownJob, newToken, readProject, readRunner, readSubmit,
  runnerOf, readClaim, readReport, ledgerWindow, withSeq, reportEntry, standing, sign, who, listen, run,
  submitted, nextAttempt, grant, ownJob, refused, lateResult, heartbeatAccepted, resultAccepted, capability,
  expired, jobView,
};
