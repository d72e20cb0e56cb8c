'use strict';
// The contract's wire (docs/protocol.md, "Conventions", "Errors", "Authentication"): strict
// JSON bodies read through typed shapes, the error body, the order of the checks. Nothing
// here knows a job system; each adapter holds its rules.

const MAX_BODY = 65536;
const I64_MAX = (1n << 63n) - 1n;
const U64_MAX = (1n << 64n) - 1n;
const U32_MAX = (1n << 32n) - 1n;
const ID = /^[A-Za-z0-9\-_.:]{1,128}$/;

/** An error answer: `{"error", "code", "status"}`. */
class ApiError extends Error {
  constructor(status, code, message, headers = {}) {
    super(message);
    this.status = status;
    this.code = code;
    this.headers = headers;
  }
}

const isId = (value) => typeof value === 'string' && ID.test(value);

/** A JSON number kept as its text, so that integers are judged exactly (no float rounding). */
class Num {
  constructor(raw) {
    this.raw = raw;
  }
}

/**
 * Parses RFC 8259 JSON strictly. Numbers come back as `Num`; objects as Maps, so that
 * duplicate keys are seen (they throw `duplicate`, an `invalid_body`, after the whole text
 * was found to be valid syntax).
 */
function parseJson(text) {
  let at = 0;
  let duplicate = false;
  const fail = () => {
    throw new ApiError(400, 'malformed_json', `the body is not valid JSON (at byte ${at})`);
  };
  const space = () => {
    while (at < text.length && ' \t\n\r'.includes(text[at])) at += 1;
  };
  const literal = (word, value) => {
    if (text.startsWith(word, at)) {
      at += word.length;
      return value;
    }
    return fail();
  };
  const string = () => {
    at += 1;
    let out = '';
    for (;;) {
      if (at >= text.length) fail();
      const c = text[at];
      const code = c.charCodeAt(0);
      if (c === '"') {
        at += 1;
        return out;
      }
      if (code < 0x20) fail();
      if (c !== '\\') {
        out += c;
        at += 1;
        continue;
      }
      const e = text[at + 1];
      const simple = { '"': '"', '\\': '\\', '/': '/', b: '\b', f: '\f', n: '\n', r: '\r', t: '\t' };
      if (e in simple) {
        out += simple[e];
        at += 2;
      } else if (e === 'u' && /^[0-9a-fA-F]{4}$/.test(text.slice(at + 2, at + 6))) {
        out += String.fromCharCode(parseInt(text.slice(at + 2, at + 6), 16));
        at += 6;
      } else {
        fail();
      }
    }
  };
  const number = () => {
    const match = /^-?(0|[1-9][0-9]*)(\.[0-9]+)?([eE][+-]?[0-9]+)?/.exec(text.slice(at));
    if (!match) fail();
    at += match[0].length;
    return new Num(match[0]);
  };
  const value = (depth) => {
    if (depth > 512) throw new ApiError(400, 'invalid_body', 'the body nests too deeply');
    space();
    const c = text[at];
    if (c === '{') return object(depth);
    if (c === '[') return array(depth);
    if (c === '"') return string();
    if (c === 't') return literal('true', true);
    if (c === 'f') return literal('false', false);
    if (c === 'n') return literal('null', null);
    return number();
  };
  const object = (depth) => {
    at += 1;
    const map = new Map();
    space();
    if (text[at] === '}') {
      at += 1;
      return map;
    }
    for (;;) {
      space();
      if (text[at] !== '"') fail();
      const key = string();
      space();
      if (text[at] !== ':') fail();
      at += 1;
      const item = value(depth + 1);
      if (map.has(key)) duplicate = true;
      map.set(key, item);
      space();
      if (text[at] === ',') {
        at += 1;
      } else if (text[at] === '}') {
        at += 1;
        return map;
      } else {
        fail();
      }
    }
  };
  const array = (depth) => {
    at += 1;
    const items = [];
    space();
    if (text[at] === ']') {
      at += 1;
      return items;
    }
    for (;;) {
      items.push(value(depth + 1));
      space();
      if (text[at] === ',') {
        at += 1;
      } else if (text[at] === ']') {
        at += 1;
        return items;
      } else {
        fail();
      }
    }
  };
  const parsed = value(0);
  space();
  if (at !== text.length) fail();
  if (duplicate) throw new ApiError(400, 'invalid_body', 'a field appears twice');
  return parsed;
}

const invalidBody = (why) => new ApiError(400, 'invalid_body', why);

/** An unsigned integer of at most `max`, from a `Num` whose text is digits only. */
function unsigned(value, name, max) {
  if (!(value instanceof Num) || !/^(0|[1-9][0-9]*)$/.test(value.raw)) {
    throw invalidBody(`${name} must be an unsigned integer`);
  }
  const big = BigInt(value.raw);
  if (big > max) throw invalidBody(`${name} is out of its type's range`);
  return big;
}

function signed64(value, name) {
  if (!(value instanceof Num) || !/^-?(0|[1-9][0-9]*)$/.test(value.raw)) {
    throw invalidBody(`${name} must be an integer`);
  }
  const big = BigInt(value.raw);
  if (big > I64_MAX || big < -I64_MAX - 1n) throw invalidBody(`${name} is out of its type's range`);
  return big;
}

/**
 * Reads `map` (a parsed JSON object) through `shape`: `{field: [type, required]}` where type
 * is `string`, `u32`, `u64`, `i64`, an array of allowed words, or a nested shape. `null` for
 * an optional field is the field absent; unknown fields are refused.
 */
function read(map, shape, where = 'the body') {
  if (!(map instanceof Map)) throw invalidBody(`${where} must be a JSON object`);
  for (const key of map.keys()) {
    if (!(key in shape)) throw invalidBody(`unknown field ${key} in ${where}`);
  }
  const out = {};
  for (const [name, [type, required]] of Object.entries(shape)) {
    const value = map.has(name) ? map.get(name) : undefined;
    if (value === undefined || (value === null && !required)) {
      if (required) throw invalidBody(`${where} lacks ${name}`);
      continue;
    }
    out[name] = field(value, type, name);
  }
  return out;
}

function field(value, type, name) {
  if (type === 'string') {
    if (typeof value !== 'string') throw invalidBody(`${name} must be a string`);
    return value;
  }
  if (type === 'u32') return unsigned(value, name, U32_MAX);
  if (type === 'u64') return unsigned(value, name, U64_MAX);
  if (type === 'i64') return signed64(value, name);
  if (Array.isArray(type)) {
    if (typeof value !== 'string' || !type.includes(value)) throw invalidBody(`${name} must be one of ${type.join(', ')}`);
    return value;
  }
  return read(value, type, name);
}

/** The media type of a `Content-Type` is `application/json` (any case, any parameters). */
function isJson(contentType) {
  if (typeof contentType !== 'string') return false;
  return contentType.split(';')[0].trim().toLowerCase() === 'application/json';
}

/** Reads a request's body, at most `MAX_BODY` bytes, as strict UTF-8. */
function body(request) {
  return new Promise((resolve, reject) => {
    const declared = request.headers['content-length'];
    if (declared !== undefined && Number(declared) > MAX_BODY) {
      reject(new ApiError(413, 'body_too_large', `the body is over ${MAX_BODY} bytes`));
      request.resume();
      return;
    }
    const chunks = [];
    let size = 0;
    let over = false;
    request.on('data', (chunk) => {
      size += chunk.length;
      if (size > MAX_BODY) over = true;
      else chunks.push(chunk);
    });
    request.on('error', () => reject(new ApiError(413, 'body_too_large', 'the body could not be read')));
    request.on('aborted', () => reject(new ApiError(413, 'body_too_large', 'the body could not be read')));
    request.on('end', () => {
      if (over) return reject(new ApiError(413, 'body_too_large', `the body is over ${MAX_BODY} bytes`));
      try {
        resolve(new TextDecoder('utf-8', { fatal: true, ignoreBOM: true }).decode(Buffer.concat(chunks)));
      } catch {
        reject(new ApiError(400, 'malformed_json', 'the body is not valid UTF-8'));
      }
    });
  });
}

/** The token of `Authorization: Bearer <token>`, else 401. */
function bearer(request) {
  const header = (request.headers.authorization || '').trim();
  if (!header.startsWith('Bearer ') || header.length === 'Bearer '.length) {
    throw new ApiError(401, 'unauthorized', 'an Authorization: Bearer token is required');
  }
  return header.slice('Bearer '.length);
}

/** `after` and `limit` of a ledger query: digits up to u64::MAX, each at most once. */
function query(search, allowed) {
  const out = {};
  if (!search) return out;
  for (const pair of search.split('&')) {
    if (pair === '') continue;
    const eq = pair.indexOf('=');
    const name = decodeQuery(eq < 0 ? pair : pair.slice(0, eq));
    const value = eq < 0 ? undefined : decodeQuery(pair.slice(eq + 1));
    if (!allowed.includes(name)) throw new ApiError(400, 'invalid_query', `unknown query parameter ${name}`);
    if (name in out) throw new ApiError(400, 'invalid_query', `${name} is given twice`);
    if (value === undefined || !/^[0-9]+$/.test(value) || BigInt(value) > U64_MAX) {
      throw new ApiError(400, 'invalid_query', `${name} must be a decimal integer up to ${U64_MAX}`);
    }
    out[name] = BigInt(value);
  }
  return out;
}

function decodeQuery(text) {
  try {
    return decodeURIComponent(text.replace(/\+/g, ' '));
  } catch {
    throw new ApiError(400, 'invalid_query', 'a query parameter is not percent-encoded UTF-8');
  }
}

/** Answers `error` with the error body (no body for HEAD). */
function sendError(response, error) {
  const text = JSON.stringify({ error: error.message, code: error.code, status: error.status });
  response.writeHead(error.status, { 'Content-Type': 'application/json', 'Content-Length': Buffer.byteLength(text), ...error.headers });
  response.end(response.req.method === 'HEAD' ? undefined : text);
}

module.exports = {
  ApiError, Num, I64_MAX, MAX_BODY, isId, parseJson, read, isJson, body, bearer, query, sendError,
};
