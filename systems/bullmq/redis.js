'use strict';
// The adapter's Redis: a `redis-server` of its own, started in the adapter's process group
// (the system contract has no database role), its data and log under the control plane's
// `{data_dir}`, with AOF on and `maxmemory-policy noeviction` (so that Redis never drops a
// job's keys under memory pressure), as BullMQ's production guide asks. The AOF is fsynced
// before every answer (`appendfsync always`) unless `everysec` (the guide's setting) is
// asked for: under `everysec` Redis may answer a write whose AOF write it postponed behind a
// slow fsync, and a SIGKILL then loses it (docs/analyses/bullmq.md, "Redis persistence").
// Killing the control plane's group (the `restart-control-plane` fault) kills this Redis
// too: the restart is a restart of Redis from its append-only file.

const { spawn } = require('node:child_process');
const fs = require('node:fs');
const net = require('node:net');
const path = require('node:path');
const Redis = require('ioredis');

/** How long Redis may take to answer after it was started (loading its AOF included). */
const READY_MS_MAX = 20000;

function freePort() {
  return new Promise((resolve, reject) => {
    const server = net.createServer();
    server.on('error', reject);
    server.listen(0, '127.0.0.1', () => {
      const { port } = server.address();
      server.close(() => resolve(port));
    });
  });
}

/** Answers PING within `ms`, else false. */
async function answers(port, ms) {
  const client = new Redis({ host: '127.0.0.1', port, lazyConnect: true, maxRetriesPerRequest: 0, retryStrategy: () => null });
  client.on('error', () => {});
  try {
    await Promise.race([client.connect().then(() => client.ping()), new Promise((_, no) => setTimeout(no, ms))]);
    return true;
  } catch {
    return false;
  } finally {
    client.disconnect();
  }
}

/**
 * Starts `program` (redis-server) on the port kept in `dataDir/redis.port` (a new free one
 * the first time), or adopts the one already answering there (a Redis whose adapter alone
 * was killed), its AOF fsynced per `appendfsync` (`always` or `everysec`). Resolves to
 * `{port, child}` once it answers; rejects after `READY_MS_MAX`.
 */
async function start(program, dataDir, appendfsync) {
  const folder = path.join(dataDir, 'redis');
  fs.mkdirSync(folder, { recursive: true });
  const portFile = path.join(dataDir, 'redis.port');
  let port = fs.existsSync(portFile) ? Number(fs.readFileSync(portFile, 'utf8')) : 0;
  if (port && (await answers(port, 500))) return { port, child: null };
  if (!port) {
    port = await freePort();
    fs.writeFileSync(portFile, String(port));
  }
  const args = [
    '--bind', '127.0.0.1', '--port', String(port), '--dir', folder, '--daemonize', 'no',
    '--appendonly', 'yes', '--appendfsync', appendfsync, '--save', '',
    '--maxmemory-policy', 'noeviction', '--logfile', path.join(dataDir, 'redis.log'),
  ];
  const child = spawn(program, args, { stdio: ['ignore', 'ignore', 'inherit'] });
  let exited = null;
  child.on('exit', (code, signal) => {
    exited = `redis-server exited (${signal || code}); see ${path.join(dataDir, 'redis.log')}`;
  });
  child.on('error', (error) => {
    exited = `redis-server could not be started: ${error.message}`;
  });
  const until = Date.now() + READY_MS_MAX;
  while (Date.now() < until) {
    if (exited) throw new Error(exited);
    if (await answers(port, 500)) return { port, child };
    await new Promise((resolve) => setTimeout(resolve, 50));
  }
  child.kill('SIGKILL');
  throw new Error(`redis-server did not answer on 127.0.0.1:${port} within ${READY_MS_MAX} ms`);
}

module.exports = { start };
