//! The data path of one proxied connection: two pumps (client → server and
//! server → client) that apply the toxics configured for their stream, and
//! Toxiproxy's rules for how a connection ends.
//!
//! A pump with no active toxic copies with a large buffer and no extra hop, so
//! a clean proxy costs little. When toxics appear (the proxy's toxic set is
//! watched, so changes reach live connections) the pump switches to a reader
//! that timestamps chunks into a bounded queue and a writer that runs each chunk
//! through the toxic chain. Every random choice comes from a ChaCha RNG derived
//! from the server seed, the proxy, the connection index and the toxic name.
//!
//! Ending, as in Toxiproxy: when one direction ends (its source reached EOF and
//! its chain drained, or a toxic closed it), its destination gets a FIN and the
//! other direction stops reading that socket, drains what it already read and
//! ends in turn: the whole connection closes. A proxy with the fencelab
//! half-close option forwards a plain EOF as a FIN and keeps the other
//! direction open instead. A `reset_peer` toxic resets both sockets.
//!
//! One-sided resets (fencelab's `reset_upstream` and `reset_downstream`) act on the whole
//! connection, beside the pumps: a connection watches for one added while it is open (or,
//! when it was accepted after one that has hit nothing yet, for its client's first bytes),
//! then stops both pumps, resets one socket and keeps the other open and silent — read and
//! discarded, never written — until the toxic is removed. That is a half-open connection:
//! one peer sees a reset, the other a connection that says nothing.

use crate::toxic::{Stream, Toxic, ToxicKind};
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use serde_json::Value;
use std::collections::HashMap;
use std::io;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::tcp::{OwnedReadHalf, OwnedWriteHalf};
use tokio::net::TcpStream;
use tokio::sync::{mpsc, watch};
use tokio::time::{sleep_until, Instant};

/// Copy buffer of the clean path.
const FAST_BUF_BYTES: usize = 256 * 1024;
/// Largest chunk read on the toxic path.
const CHUNK_BYTES: usize = 32 * 1024;
/// Chunks queued between reader and writer on the toxic path (bounds memory).
const CHUNK_QUEUE: usize = 64;
/// Longest wait for the upstream connect.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(10);
/// How far a paced stream may fall behind before its schedule restarts.
const PACE_SLACK: Duration = Duration::from_millis(5);

/// A toxic installed on a proxy. `id` stays the same for the toxic's life on
/// the proxy, so per-connection state (a `limit_data` count) survives updates;
/// `version` changes on every update, which restarts the toxic on live
/// connections (a new toxicity roll, a new `timeout` timer), as Toxiproxy
/// restarts a toxic's pipe on update.
#[derive(Debug)]
pub(crate) struct Installed {
    pub id: u64,
    pub version: u64,
    pub toxic: Toxic,
    /// The connections a `commit_cut` toxic has cut (after a COMMIT), or a one-sided reset
    /// has reset, over every connection; kept across updates of the toxic.
    pub cuts: Arc<AtomicU64>,
    /// The kinds of transaction a `distinct` `commit_cut` toxic has cut, over every
    /// connection; kept across updates of the toxic.
    pub shapes: Arc<std::sync::Mutex<std::collections::HashSet<u64>>>,
}

/// One hash for a transaction's kind (the set of its statements' hashes).
fn shape_hash(shape: &std::collections::BTreeSet<u64>) -> u64 {
    use std::hash::{Hash, Hasher};
    let mut hasher = std::collections::hash_map::DefaultHasher::new();
    shape.hash(&mut hasher);
    hasher.finish()
}

impl Installed {
    /// The toxic's JSON; a `commit_cut` toxic adds `fencelab_cuts` (not Toxiproxy's), how
    /// many connections it has cut so far.
    pub(crate) fn to_json(&self) -> Value {
        let mut body = self.toxic.to_json();
        if matches!(self.toxic.kind, ToxicKind::CommitCut { .. }) {
            body[CUTS_FIELD] = Value::from(self.cuts.load(Ordering::Relaxed));
        }
        if self.toxic.kind.is_one_sided() {
            body[RESETS_FIELD] = Value::from(self.cuts.load(Ordering::Relaxed));
        }
        body
    }
}

/// The JSON field of a `commit_cut` toxic's count of cut connections (fencelab's own).
pub const CUTS_FIELD: &str = "fencelab_cuts";
/// The JSON field of a one-sided reset's count of the connections it reset (fencelab's own).
pub const RESETS_FIELD: &str = "fencelab_resets";

/// The toxics of one proxy, split by stream, in insertion order.
#[derive(Debug, Default)]
pub(crate) struct ToxicSet {
    pub upstream: Vec<Arc<Installed>>,
    pub downstream: Vec<Arc<Installed>>,
}

impl ToxicSet {
    fn for_stream(&self, stream: Stream) -> &[Arc<Installed>] {
        match stream {
            Stream::Upstream => &self.upstream,
            Stream::Downstream => &self.downstream,
        }
    }

    /// The one-sided resets, on either stream (they act on whole connections).
    fn one_sided(&self) -> impl Iterator<Item = &Arc<Installed>> {
        self.upstream.iter().chain(&self.downstream).filter(|t| t.toxic.kind.is_one_sided())
    }
}

/// What a connection needs to know about its proxy.
#[derive(Clone)]
pub(crate) struct ConnCtx {
    pub seed: u64,
    pub proxy: Arc<str>,
    pub conn_index: u64,
    /// Bytes the proxy has read from either side, over its connections (fencelab's own).
    pub traffic: Arc<AtomicU64>,
    pub upstream: Arc<str>,
    pub toxics: watch::Receiver<Arc<ToxicSet>>,
    /// fencelab's option: forward a plain EOF as a FIN and keep the other
    /// direction open, instead of closing the whole connection.
    pub half_close: bool,
    /// Told once the client's first bytes were read (set on the upstream pump's copy only).
    pub first_read: Option<Arc<watch::Sender<bool>>>,
}

impl ConnCtx {
    /// Counts `bytes` read from a side; tells whoever waits for the client's first bytes.
    fn count(&self, bytes: usize) {
        self.traffic.fetch_add(bytes as u64, Ordering::Relaxed);
        if let Some(first) = &self.first_read {
            first.send_if_modified(|seen| !std::mem::replace(seen, true));
        }
    }
}

/// How a pump ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum End {
    /// Source reached EOF and the chain drained.
    Eof,
    /// A toxic closed the connection.
    Close,
    /// A toxic reset the connection (RST).
    Reset,
}

/// Serves one accepted client connection until both directions end, or until a one-sided
/// reset hits it (then until that toxic is removed).
pub(crate) async fn run_connection(client: TcpStream, ctx: ConnCtx) {
    // The one-sided resets already there when the connection was accepted: one added later
    // finds it open.
    let mut watcher = ctx.toxics.clone();
    let present: Vec<u64> = watcher.borrow_and_update().one_sided().map(|t| t.id).collect();
    let connect = TcpStream::connect(&*ctx.upstream);
    let server = match tokio::time::timeout(CONNECT_TIMEOUT, connect).await {
        Ok(Ok(s)) => s,
        _ => return, // dropping the client closes it, as Toxiproxy does
    };
    let _ = client.set_nodelay(true);
    let _ = server.set_nodelay(true);
    let (mut client_rd, mut client_wr) = client.into_split();
    let (mut server_rd, mut server_wr) = server.into_split();
    // Each pump tells the other when the socket they share is closed.
    let (client_closed, client_closed_rx) = watch::channel(false);
    let (server_closed, server_closed_rx) = watch::channel(false);
    let (first_read, first_read_rx) = watch::channel(false);
    let up_ctx = ConnCtx { first_read: Some(Arc::new(first_read)), ..ctx.clone() };
    let outcome = {
        let up_ends = Ends { source_closed: client_closed_rx, dest_closed: server_closed };
        let down_ends = Ends { source_closed: server_closed_rx, dest_closed: client_closed };
        let up = pump(&mut client_rd, &mut server_wr, Stream::Upstream, &up_ctx, up_ends);
        let down = pump(&mut server_rd, &mut client_wr, Stream::Downstream, &ctx, down_ends);
        tokio::select! {
            outcome = both_directions(up, down) => outcome,
            toxic = one_sided_hit(&mut watcher, &present, first_read_rx, &ctx) => {
                // The pumps are dropped: nothing more is forwarded either way.
                let sockets = (client_rd.reunite(client_wr), server_rd.reunite(server_wr));
                if let (Ok(client), Ok(server)) = sockets {
                    half_open(client, server, &toxic, &mut watcher).await;
                }
                return;
            }
        }
    };
    if outcome == Some(End::Reset) {
        // Reunited streams close without the write half's FIN; linger 0 makes it an RST.
        for (rd, wr) in [(client_rd, client_wr), (server_rd, server_wr)] {
            if let Ok(sock) = rd.reunite(wr) {
                let _ = sock.set_zero_linger();
            }
        }
    }
}

/// Waits until a one-sided reset applies to this connection, and answers it (counted):
/// one added while the connection is open (`present` holds those there before), once its
/// toxicity roll applies; or one that was there before and has hit no connection yet, once
/// the client's first bytes were read (`first_read`: a client that opens a connection per
/// request is hit in its next request). Never resolves otherwise.
async fn one_sided_hit(
    watcher: &mut watch::Receiver<Arc<ToxicSet>>,
    present: &[u64],
    mut first_read: watch::Receiver<bool>,
    ctx: &ConnCtx,
) -> Arc<Installed> {
    let mut judged: Vec<u64> = Vec::new();
    // Whether the client's first bytes were read; whether the pumps are gone (no more to read).
    let (mut read, mut ended) = (false, false);
    loop {
        let set = watcher.borrow_and_update().clone();
        for t in set.one_sided() {
            if judged.contains(&t.id) {
                continue;
            }
            if !present.contains(&t.id) {
                judged.push(t.id);
                let seed = derive_seed(ctx.seed, &ctx.proxy, ctx.conn_index, t.toxic.stream, &t.toxic.name);
                if roll(&mut ChaCha8Rng::seed_from_u64(seed), t.toxic.toxicity) {
                    t.cuts.fetch_add(1, Ordering::Relaxed);
                    return t.clone();
                }
            } else if read {
                judged.push(t.id);
                if t.cuts.compare_exchange(0, 1, Ordering::Relaxed, Ordering::Relaxed).is_ok() {
                    return t.clone();
                }
            }
        }
        tokio::select! {
            _ = toxics_changed(watcher) => {}
            seen = first_read.wait_for(|seen| *seen), if !read && !ended => {
                let seen = seen.is_ok();
                (read, ended) = (seen, !seen);
            }
        }
    }
}

/// Longest read of the silent side of a half-open connection.
const SILENT_BUF_BYTES: usize = 16 * 1024;

/// A half-open connection: the side `toxic` names is reset (linger 0, then closed: an RST),
/// the other kept open and silent — what it sends is read and dropped, nothing is written
/// to it — until the toxic is removed (or its peer closes), then closed.
async fn half_open(
    client: TcpStream,
    server: TcpStream,
    toxic: &Installed,
    watcher: &mut watch::Receiver<Arc<ToxicSet>>,
) {
    let (reset, mut silent) = match toxic.toxic.kind {
        ToxicKind::ResetUpstream => (server, client),
        _ => (client, server),
    };
    let _ = reset.set_zero_linger();
    drop(reset);
    let mut buf = vec![0u8; SILENT_BUF_BYTES];
    loop {
        tokio::select! {
            read = silent.read(&mut buf) => {
                if !matches!(read, Ok(n) if n > 0) {
                    return;
                }
            }
            _ = toxics_changed(watcher) => {
                if !watcher.borrow_and_update().one_sided().any(|t| t.id == toxic.id) {
                    return;
                }
            }
        }
    }
}

/// Drives both pumps until both end, or one resets or fails (then the
/// connection is dropped at once). A pump that ends otherwise has already
/// closed its destination, which ends the other pump's source.
async fn both_directions(
    up: impl std::future::Future<Output = io::Result<End>>,
    down: impl std::future::Future<Output = io::Result<End>>,
) -> Option<End> {
    tokio::pin!(up, down);
    let (mut up_done, mut down_done) = (false, false);
    while !(up_done && down_done) {
        let result = tokio::select! {
            r = &mut up, if !up_done => { up_done = true; r }
            r = &mut down, if !down_done => { down_done = true; r }
        };
        match result {
            Ok(End::Eof | End::Close) => {}
            Ok(End::Reset) => return Some(End::Reset),
            Err(_) => return Some(End::Close),
        }
    }
    None
}

/// How a pump learns that its source socket was closed by the other pump, and
/// tells the other pump that it closed its destination.
struct Ends {
    source_closed: watch::Receiver<bool>,
    dest_closed: watch::Sender<bool>,
}

/// Resolves once the socket was marked closed; never if the other pump ended
/// without marking it (a half-close leaves the socket open).
async fn closed(rx: &mut watch::Receiver<bool>) {
    if rx.wait_for(|closed| *closed).await.is_err() {
        std::future::pending::<()>().await;
    }
}

/// Waits for a change of the toxic set; never resolves if the proxy is gone.
async fn toxics_changed(rx: &mut watch::Receiver<Arc<ToxicSet>>) {
    if rx.changed().await.is_err() {
        std::future::pending::<()>().await;
    }
}

/// One direction of a connection.
async fn pump(
    rd: &mut OwnedReadHalf,
    wr: &mut OwnedWriteHalf,
    stream: Stream,
    ctx: &ConnCtx,
    mut ends: Ends,
) -> io::Result<End> {
    let mut toxics = ctx.toxics.clone();
    let mut state = DirState::new(ctx, stream);
    let mut buf = vec![0u8; FAST_BUF_BYTES];
    let source_closed = &mut ends.source_closed;
    let end = loop {
        let set = toxics.borrow_and_update().clone();
        let step = match state.refresh(set.for_stream(stream)) {
            Err(end) => Step::Done(end),
            Ok(chain) if chain.is_empty() => {
                clean_copy(rd, wr, &mut buf, &mut toxics, source_closed, &mut state).await?
            }
            Ok(_) => toxic_copy(rd, wr, &mut toxics, &mut state, source_closed).await?,
        };
        match step {
            Step::Again => continue,
            Step::Done(end) => break end,
        }
    };
    match end {
        End::Eof | End::Close => {
            let _ = wr.shutdown().await;
            if end == End::Close || !ctx.half_close {
                let _ = ends.dest_closed.send(true);
            }
        }
        End::Reset => {}
    }
    Ok(end)
}

/// Result of one mode of a pump.
enum Step {
    /// The toxic set changed (or drained): choose the mode again.
    Again,
    Done(End),
}

/// The clean path: plain copy until EOF or a toxic change.
async fn clean_copy(
    rd: &mut OwnedReadHalf,
    wr: &mut OwnedWriteHalf,
    buf: &mut [u8],
    toxics: &mut watch::Receiver<Arc<ToxicSet>>,
    source_closed: &mut watch::Receiver<bool>,
    state: &mut DirState,
) -> io::Result<Step> {
    loop {
        let n = tokio::select! {
            biased;
            r = rd.read(buf) => r?,
            _ = toxics_changed(toxics) => return Ok(Step::Again),
            _ = closed(source_closed) => 0,
        };
        if n == 0 {
            return Ok(Step::Done(End::Eof));
        }
        state.ctx.count(n);
        state.learn(&buf[..n]);
        wr.write_all(&buf[..n]).await?;
    }
}

/// A chunk read from the source, stamped with its arrival time.
struct Chunk {
    data: Vec<u8>,
    arrived: Instant,
}

/// The toxic path: a reader feeding a bounded queue and a writer applying toxics.
async fn toxic_copy(
    rd: &mut OwnedReadHalf,
    wr: &mut OwnedWriteHalf,
    toxics: &mut watch::Receiver<Arc<ToxicSet>>,
    state: &mut DirState,
    source_closed: &mut watch::Receiver<bool>,
) -> io::Result<Step> {
    let (tx, mut rx) = mpsc::channel::<Chunk>(CHUNK_QUEUE);
    let reader = read_chunks(rd, tx, source_closed, state.ctx.clone());
    let writer = write_chunks(wr, &mut rx, toxics, state);
    tokio::pin!(reader, writer);
    let mut reader_done = false;
    loop {
        tokio::select! {
            r = &mut reader, if !reader_done => { r?; reader_done = true; }
            w = &mut writer => return w,
        }
    }
}

/// Reads chunks into the queue until EOF (or the source was closed by the
/// other direction). Takes a queue slot before reading so that cancelling it
/// (on a switch back to the clean path) never loses data.
async fn read_chunks(
    rd: &mut OwnedReadHalf,
    tx: mpsc::Sender<Chunk>,
    source_closed: &mut watch::Receiver<bool>,
    ctx: ConnCtx,
) -> io::Result<()> {
    let mut buf = vec![0u8; CHUNK_BYTES];
    loop {
        let Ok(permit) = tx.reserve().await else {
            return Ok(());
        };
        let n = tokio::select! {
            biased;
            r = rd.read(&mut buf) => r?,
            _ = closed(source_closed) => 0,
        };
        if n == 0 {
            return Ok(()); // dropping `tx` tells the writer about EOF
        }
        ctx.count(n);
        permit.send(Chunk { data: buf[..n].to_vec(), arrived: Instant::now() });
    }
}

/// Applies the chain to queued chunks; reacts to toxic changes and deadlines.
async fn write_chunks(
    wr: &mut OwnedWriteHalf,
    rx: &mut mpsc::Receiver<Chunk>,
    toxics: &mut watch::Receiver<Arc<ToxicSet>>,
    state: &mut DirState,
) -> io::Result<Step> {
    loop {
        let set = toxics.borrow_and_update().clone();
        let chain = match state.refresh(set.for_stream(state.stream)) {
            Ok(chain) => chain,
            Err(end) => return Ok(Step::Done(end)),
        };
        if chain.is_empty() && rx.is_empty() {
            return Ok(Step::Again);
        }
        // Toxiproxy's bandwidth toxic with rate 0 never lets data through.
        let stalled = chain.iter().any(|t| matches!(t.toxic.kind, ToxicKind::Bandwidth { rate_kbps: 0 }));
        let deadline = state.deadline(&chain);
        let far = Instant::now() + Duration::from_secs(86_400);
        tokio::select! {
            biased;
            _ = sleep_until(deadline.map_or(far, |d| d.0)), if deadline.is_some() => {
                return Ok(Step::Done(deadline.map_or(End::Close, |d| d.1)));
            }
            _ = toxics_changed(toxics) => continue,
            chunk = rx.recv(), if !stalled => match chunk {
                Some(chunk) => {
                    if let Some(end) = state.apply(&chain, chunk, wr, toxics).await? {
                        return Ok(Step::Done(end));
                    }
                }
                None => return state.finish(&chain).await.map(Step::Done),
            },
        }
    }
}

/// A PostgreSQL simple-query message whose text is `COMMIT`: `Q`, its length (11), the
/// text and its NUL.
const PG_COMMIT: &[u8] = b"Q\0\0\0\x0bCOMMIT\0";

/// A PostgreSQL simple-query message whose text is `ROLLBACK` (length 13).
const PG_ROLLBACK: &[u8] = b"Q\0\0\0\x0dROLLBACK\0";

/// What a `commit_cut` toxic knows of its connection's transaction.
#[derive(Debug, Default)]
pub(crate) struct Writes {
    /// The connection sent a write since its last COMMIT or ROLLBACK.
    pub wrote: bool,
    /// The transaction's kind: the statements it ran (each a hash of its text, literals
    /// left out), as a set.
    shape: std::collections::BTreeSet<u64>,
}

/// The prepared statements a connection's client parsed, read off its stream from the
/// connection's first byte whether or not a toxic is watching: a client that caches its
/// statements (a pool's long-lived connection) sends a statement's text once, and
/// afterwards only binds its name. Kept for a PostgreSQL connection only (its first message
/// is a startup or an SSL request), at most [`NAMED_STATEMENTS_MAX`] names.
#[derive(Debug, Default)]
pub(crate) struct Statements {
    /// Whether the connection speaks PostgreSQL: unknown until its first bytes.
    postgres: Option<bool>,
    /// Each statement name parsed: whether it writes, and its text's hash.
    named: HashMap<Vec<u8>, Parsed>,
}

/// A statement parsed: whether it writes, and its text's hash ([`statement_hash`]).
#[derive(Debug, Clone, Copy)]
struct Parsed {
    write: bool,
    hash: u64,
}

/// At most this many prepared statement names are remembered per connection.
const NAMED_STATEMENTS_MAX: usize = 4096;

/// Longest statement or portal name looked for in a Parse or Bind message.
const NAME_MAX_BYTES: usize = 64;

/// The protocol version a PostgreSQL startup message names (3.0), and the codes of its
/// SSL and GSSAPI encryption requests: what a client sends first.
const PG_FIRST_CODES: [u32; 3] = [196_608, 80_877_103, 80_877_104];

impl Statements {
    /// Reads a stretch of the client's stream: on the first, whether it is PostgreSQL; on
    /// a PostgreSQL connection, every named Parse, remembered as a write or a read.
    fn learn(&mut self, data: &[u8]) {
        let postgres = *self.postgres.get_or_insert_with(|| {
            let code = data.get(4..8).map(|code| u32::from_be_bytes(code.try_into().unwrap_or_default()));
            code.is_some_and(|code| PG_FIRST_CODES.contains(&code))
        });
        if !postgres {
            return;
        }
        for at in positions(b'P', data) {
            let Some((name, rest)) = c_string(data.get(at + 5..).unwrap_or_default()) else { continue };
            if name.is_empty() || (self.named.len() >= NAMED_STATEMENTS_MAX && !self.named.contains_key(name)) {
                continue;
            }
            let query = rest.split(|&byte| byte == 0).next().unwrap_or_default();
            self.named.insert(name.to_vec(), Parsed { write: names_a_write(query), hash: statement_hash(query) });
        }
    }

    /// What binding statement `name` runs, when it was seen parsed. A name never seen
    /// parsed (on a connection not read from its start, or past the bound) may write.
    fn bound(&self, name: &[u8]) -> Option<Parsed> {
        self.named.get(name).copied()
    }
}

/// A statement's text, hashed up to its first digit or quote (where literals begin, so
/// that one statement with other values is the same statement), at most 256 bytes of it.
fn statement_hash(text: &[u8]) -> u64 {
    use std::hash::{Hash, Hasher};
    let end =
        text.iter().take(256).position(|byte| byte.is_ascii_digit() || *byte == b'\'').unwrap_or(text.len().min(256));
    let mut hasher = std::collections::hash_map::DefaultHasher::new();
    text[..end].hash(&mut hasher);
    hasher.finish()
}

/// The positions of `byte` in `data`.
fn positions(byte: u8, data: &[u8]) -> impl Iterator<Item = usize> + '_ {
    data.iter().enumerate().filter(move |(_, &b)| b == byte).map(|(at, _)| at)
}

/// Keeps the pieces up to and including the first `COMMIT` message (looked for within
/// each piece) that ends a transaction which wrote (`writes`, carried from chunk to chunk;
/// `statements`, the connection's prepared statements, tells a bound read from a bound
/// write) and that `cut` takes (given the transaction's kind). A COMMIT of a transaction
/// that only read passes (its outcome cannot matter); a ROLLBACK ends a transaction too.
/// Whether one was cut, so the connection closes after it.
fn cut_after_commit(
    pieces: &mut Vec<Piece>,
    writes: &mut Writes,
    statements: &Statements,
    cut: &mut dyn FnMut(&std::collections::BTreeSet<u64>) -> bool,
) -> bool {
    let find = |data: &[u8], message: &[u8]| data.windows(message.len()).position(|window| window == message);
    for index in 0..pieces.len() {
        let mut from = 0;
        loop {
            let data = &pieces[index].data[from..];
            let ends = [(find(data, PG_COMMIT), PG_COMMIT), (find(data, PG_ROLLBACK), PG_ROLLBACK)];
            let first = ends.iter().filter_map(|&(at, message)| Some((at?, message))).min_by_key(|&(at, _)| at);
            writes.read(&data[..first.map_or(data.len(), |(at, _)| at)], statements);
            let Some((at, message)) = first else { break };
            let end = from + at + message.len();
            let wrote = std::mem::take(&mut writes.wrote);
            let shape = std::mem::take(&mut writes.shape);
            if message == PG_COMMIT && wrote && cut(&shape) {
                pieces[index].data.truncate(end);
                pieces.truncate(index + 1);
                return true;
            }
            from = end;
        }
    }
    false
}

impl Writes {
    /// Reads a stretch of the client's stream: a simple query or an unnamed Parse naming a
    /// write marks the transaction as writing, and so does a Bind of a named statement
    /// that may write (`statements`). Each framed simple query, Parse and Bind adds its
    /// statement to the transaction's kind.
    fn read(&mut self, data: &[u8], statements: &Statements) {
        self.wrote |= names_a_write(data);
        for at in 0..data.len() {
            let kind = data[at];
            if !matches!(kind, b'Q' | b'P' | b'B') {
                continue;
            }
            // Framed: a length that fits the stretch (the letter inside a query's text or a
            // value is followed by bytes that make no such length).
            let Some(body) = framed_body(&data[at..]) else { continue };
            match kind {
                b'Q' => {
                    self.shape.insert(statement_hash(body.split(|&byte| byte == 0).next().unwrap_or_default()));
                }
                b'P' => {
                    let Some((_name, rest)) = c_string(body) else { continue };
                    self.shape.insert(statement_hash(rest.split(|&byte| byte == 0).next().unwrap_or_default()));
                }
                _ => {
                    let Some((_portal, rest)) = c_string(body) else { continue };
                    let Some((name, _)) = c_string(rest) else { continue };
                    if name.is_empty() {
                        continue;
                    }
                    match statements.bound(name) {
                        Some(parsed) => {
                            self.wrote |= parsed.write;
                            self.shape.insert(parsed.hash);
                        }
                        None => {
                            self.wrote = true;
                            self.shape.insert(statement_hash(name));
                        }
                    }
                }
            }
        }
    }
}

/// The body of the message at the start of `data` if its length (4 bytes after its type,
/// counting themselves) fits within `data`.
fn framed_body(data: &[u8]) -> Option<&[u8]> {
    let length = u32::from_be_bytes(data.get(1..5)?.try_into().ok()?) as usize;
    match length >= 4 && length < data.len() {
        true => data.get(5..1 + length),
        false => None,
    }
}

/// A NUL-terminated name of at most [`NAME_MAX_BYTES`] at the start of `data`, and what
/// follows its NUL.
fn c_string(data: &[u8]) -> Option<(&[u8], &[u8])> {
    let end = data.iter().take(NAME_MAX_BYTES + 1).position(|&byte| byte == 0)?;
    Some((&data[..end], &data[end + 1..]))
}

/// The words that make a statement a write, when followed by whitespace.
const WRITE_WORDS: [&[u8]; 4] = [b"INSERT", b"UPDATE", b"DELETE", b"MERGE"];

/// Whether `data` (a client's stream: simple queries or Parse messages) names a write
/// statement: one of [`WRITE_WORDS`], in any case, followed by whitespace. A word split
/// across two chunks is not seen.
fn names_a_write(data: &[u8]) -> bool {
    WRITE_WORDS.iter().any(|word| {
        data.windows(word.len() + 1)
            .any(|window| window[..word.len()].eq_ignore_ascii_case(word) && window[word.len()].is_ascii_whitespace())
    })
}

/// Per-connection state of one toxic.
struct ToxicState {
    /// The toxic's version this state was last started for.
    version: u64,
    /// A timeout toxic, whose removal closes the connection.
    is_timeout: bool,
    active: bool,
    rng: ChaCha8Rng,
    /// When the toxic started on this connection, or last dropped data (timeout).
    timer_from: Instant,
    /// Bytes passed so far (limit_data); kept across updates.
    passed_bytes: u64,
    /// When a reset_peer toxic fires, once triggered by data.
    reset_at: Option<Instant>,
    /// A commit_cut toxic: what it knows of the connection's transaction.
    writes: Writes,
}

/// Per-direction state of a connection: toxic states and the pacing clock.
struct DirState {
    stream: Stream,
    seed: u64,
    proxy: Arc<str>,
    conn_index: u64,
    toxics: HashMap<u64, ToxicState>,
    paced_until: Instant,
    /// The connection's context, for counting what is read.
    ctx: ConnCtx,
    /// The client's prepared statements (the upstream stream only), read from its start.
    statements: Statements,
}

/// A piece of a chunk and the pause to take before writing it.
struct Piece {
    data: Vec<u8>,
    gap: Duration,
}

impl DirState {
    fn new(ctx: &ConnCtx, stream: Stream) -> Self {
        DirState {
            stream,
            seed: ctx.seed,
            proxy: ctx.proxy.clone(),
            conn_index: ctx.conn_index,
            toxics: HashMap::new(),
            paced_until: Instant::now(),
            ctx: ctx.clone(),
            statements: Statements::default(),
        }
    }

    /// Reads a chunk of the client's stream into its prepared statements.
    fn learn(&mut self, data: &[u8]) {
        if self.stream == Stream::Upstream {
            self.statements.learn(data);
        }
    }

    /// Brings the per-toxic states up to date with `chain` and answers the
    /// toxics that apply to this connection. Toxicity is rolled when a toxic
    /// starts on the connection and again when it is updated. A removed
    /// `timeout` toxic closes the connection (Toxiproxy's cleanup), whether or
    /// not its roll applied it here.
    fn refresh(&mut self, chain: &[Arc<Installed>]) -> Result<Vec<Arc<Installed>>, End> {
        let timeout_removed = self.toxics.iter().any(|(id, st)| st.is_timeout && !chain.iter().any(|t| t.id == *id));
        if timeout_removed {
            return Err(End::Close);
        }
        self.toxics.retain(|id, _| chain.iter().any(|t| t.id == *id));
        let mut out = Vec::with_capacity(chain.len());
        for t in chain {
            let toxicity = t.toxic.toxicity;
            let is_timeout = matches!(t.toxic.kind, ToxicKind::Timeout { .. });
            let st = self.toxics.entry(t.id).or_insert_with(|| {
                let seed = derive_seed(self.seed, &self.proxy, self.conn_index, self.stream, &t.toxic.name);
                let mut rng = ChaCha8Rng::seed_from_u64(seed);
                let active = roll(&mut rng, toxicity);
                ToxicState {
                    version: t.version,
                    is_timeout,
                    active,
                    rng,
                    timer_from: Instant::now(),
                    passed_bytes: 0,
                    reset_at: None,
                    writes: Writes::default(),
                }
            });
            if st.version != t.version {
                st.version = t.version;
                st.is_timeout = is_timeout;
                st.active = roll(&mut st.rng, toxicity);
                st.timer_from = Instant::now();
            }
            // A one-sided reset acts on the whole connection, beside the pumps.
            if st.active && !t.toxic.kind.is_one_sided() {
                out.push(t.clone());
            }
        }
        Ok(out)
    }

    /// The earliest time-driven event of the chain: a timeout close or a reset.
    fn deadline(&self, chain: &[Arc<Installed>]) -> Option<(Instant, End)> {
        let mut best: Option<(Instant, End)> = None;
        for t in chain {
            let Some(st) = self.toxics.get(&t.id) else {
                continue;
            };
            let event = match t.toxic.kind {
                ToxicKind::Timeout { timeout_ms } if timeout_ms > 0 => {
                    Some((st.timer_from + Duration::from_millis(timeout_ms), End::Close))
                }
                ToxicKind::ResetPeer { .. } => st.reset_at.map(|at| (at, End::Reset)),
                _ => None,
            };
            if let Some(ev) = event {
                if !matches!(best, Some(b) if b.0 <= ev.0) {
                    best = Some(ev);
                }
            }
        }
        best
    }

    /// Runs one chunk through the chain and writes what survives.
    async fn apply(
        &mut self,
        chain: &[Arc<Installed>],
        chunk: Chunk,
        wr: &mut OwnedWriteHalf,
        toxics: &mut watch::Receiver<Arc<ToxicSet>>,
    ) -> io::Result<Option<End>> {
        self.learn(&chunk.data);
        let mut pieces = vec![Piece { data: chunk.data, gap: Duration::ZERO }];
        // Each latency toxic delays the chunk from the time the previous one
        // released it, so latencies on one stream add up (as in Toxiproxy).
        let mut released = chunk.arrived;
        let mut close_after = false;
        for t in chain {
            let Some(st) = self.toxics.get_mut(&t.id) else {
                continue;
            };
            match t.toxic.kind {
                ToxicKind::Noop
                | ToxicKind::SlowClose { .. }
                | ToxicKind::ResetUpstream
                | ToxicKind::ResetDownstream => {}
                ToxicKind::Latency { latency_ms, jitter_ms } => {
                    let delay_ms = jittered_ms(&mut st.rng, latency_ms, jitter_ms);
                    released += Duration::from_millis(delay_ms);
                    if !hold_until(released, toxics, self.stream, t).await {
                        released = Instant::now();
                    }
                }
                ToxicKind::Timeout { .. } => {
                    st.timer_from = Instant::now();
                    return Ok(None); // data is dropped on the floor
                }
                ToxicKind::ResetPeer { timeout_ms } => {
                    if st.reset_at.is_none() {
                        st.reset_at = Some(Instant::now() + Duration::from_millis(timeout_ms));
                    }
                    return Ok(None);
                }
                ToxicKind::LimitData { bytes } => {
                    close_after |= limit(&mut pieces, &mut st.passed_bytes, bytes);
                }
                ToxicKind::CommitCut { distinct } => {
                    let mut cut = |shape: &std::collections::BTreeSet<u64>| {
                        !distinct || t.shapes.lock().is_ok_and(|mut seen| seen.insert(shape_hash(shape)))
                    };
                    if cut_after_commit(&mut pieces, &mut st.writes, &self.statements, &mut cut) {
                        t.cuts.fetch_add(1, Ordering::Relaxed);
                        close_after = true;
                    }
                }
                ToxicKind::Bandwidth { rate_kbps } => pieces = pace(pieces, rate_kbps),
                ToxicKind::Slicer { average_size_bytes, size_variation_bytes, delay_us } => {
                    let sizes = (average_size_bytes, size_variation_bytes);
                    pieces = slice(pieces, sizes, delay_us, &mut st.rng);
                }
            }
            if close_after && pieces.iter().all(|p| p.data.is_empty()) {
                break;
            }
        }
        self.write_pieces(pieces, wr).await?;
        Ok(close_after.then_some(End::Close))
    }

    /// Writes pieces, pausing before each by its gap on a schedule that does
    /// not accumulate timer overshoot.
    async fn write_pieces(&mut self, pieces: Vec<Piece>, wr: &mut OwnedWriteHalf) -> io::Result<()> {
        for piece in pieces {
            if !piece.gap.is_zero() {
                let now = Instant::now();
                let base = self.paced_until.max(now.checked_sub(PACE_SLACK).unwrap_or(now));
                self.paced_until = base + piece.gap;
                sleep_until(self.paced_until).await;
            }
            if !piece.data.is_empty() {
                wr.write_all(&piece.data).await?;
            }
        }
        Ok(())
    }

    /// Handles EOF of the source, toxic by toxic in chain order: a reset_peer
    /// toxic triggers on it (as on data), a timeout toxic closes the connection
    /// at once, slow_close delays the close.
    async fn finish(&mut self, chain: &[Arc<Installed>]) -> io::Result<End> {
        for t in chain {
            match t.toxic.kind {
                ToxicKind::ResetPeer { timeout_ms } => {
                    let at = self.toxics.get(&t.id).and_then(|s| s.reset_at);
                    let at = at.unwrap_or_else(|| Instant::now() + Duration::from_millis(timeout_ms));
                    sleep_until(at).await;
                    return Ok(End::Reset);
                }
                ToxicKind::Timeout { .. } => return Ok(End::Close),
                ToxicKind::SlowClose { delay_ms } => {
                    tokio::time::sleep(Duration::from_millis(delay_ms)).await;
                }
                _ => {}
            }
        }
        Ok(End::Eof)
    }
}

/// Holds a chunk in latency toxic `toxic` until `until`; false when the toxic was removed
/// or updated first, which releases the chunk at once (as Toxiproxy does: data held by a
/// toxic taken away is passed on, never dropped nor held for a delay no longer asked for).
async fn hold_until(
    until: Instant,
    toxics: &mut watch::Receiver<Arc<ToxicSet>>,
    stream: Stream,
    toxic: &Installed,
) -> bool {
    loop {
        tokio::select! {
            biased;
            _ = sleep_until(until) => return true,
            _ = toxics_changed(toxics) => {
                let set = toxics.borrow_and_update().clone();
                let unchanged = set.for_stream(stream).iter().any(|t| t.id == toxic.id && t.version == toxic.version);
                if !unchanged {
                    return false;
                }
            }
        }
    }
}

/// Whether a toxic applies, drawn from its RNG (toxicity 1 always does).
fn roll(rng: &mut ChaCha8Rng, toxicity: f32) -> bool {
    let draw: f32 = rng.gen();
    toxicity >= 1.0 || draw < toxicity
}

/// latency ± jitter, uniformly, never below zero.
fn jittered_ms(rng: &mut ChaCha8Rng, latency_ms: u64, jitter_ms: u64) -> u64 {
    if jitter_ms == 0 {
        return latency_ms;
    }
    let offset = rng.gen_range(0..=2 * jitter_ms) as i128 - jitter_ms as i128;
    (latency_ms as i128 + offset).max(0) as u64
}

/// Keeps at most `limit_bytes - passed` bytes; true once the limit is reached.
fn limit(pieces: &mut Vec<Piece>, passed: &mut u64, limit_bytes: u64) -> bool {
    let mut kept = Vec::with_capacity(pieces.len());
    for mut piece in pieces.drain(..) {
        let room = limit_bytes.saturating_sub(*passed);
        if room == 0 {
            break;
        }
        let take = (piece.data.len() as u64).min(room) as usize;
        piece.data.truncate(take);
        *passed += take as u64;
        kept.push(piece);
    }
    *pieces = kept;
    *passed >= limit_bytes
}

/// Splits pieces into ≤100 ms portions and gives each its transmission time.
fn pace(pieces: Vec<Piece>, rate_kbps: u64) -> Vec<Piece> {
    if rate_kbps == 0 {
        return pieces;
    }
    let bytes_per_sec = rate_kbps.saturating_mul(1000);
    let portion = (bytes_per_sec / 10).max(1) as usize;
    let mut out = Vec::new();
    for piece in pieces {
        let mut first = true;
        for part in piece.data.chunks(portion) {
            let secs = part.len() as f64 / bytes_per_sec as f64;
            let extra = if first { piece.gap } else { Duration::ZERO };
            first = false;
            out.push(Piece { data: part.to_vec(), gap: extra + Duration::from_secs_f64(secs) });
        }
    }
    out
}

/// Splits pieces into slices of average ± variation bytes, `delay_us` apart.
fn slice(pieces: Vec<Piece>, sizes: (u64, u64), delay_us: u64, rng: &mut ChaCha8Rng) -> Vec<Piece> {
    let (average, variation) = sizes;
    let variation = variation.min(average.saturating_sub(1));
    let mut out = Vec::new();
    for piece in pieces {
        let mut rest = &piece.data[..];
        let mut gap = piece.gap;
        while !rest.is_empty() {
            let size = if variation == 0 { average } else { average - variation + rng.gen_range(0..=2 * variation) };
            let take = (size.max(1) as usize).min(rest.len());
            out.push(Piece { data: rest[..take].to_vec(), gap });
            rest = &rest[take..];
            gap = Duration::from_micros(delay_us);
        }
    }
    out
}

/// A stable 64-bit seed for one toxic on one connection direction (FNV-1a over
/// the identifying parts, then the run seed mixed in).
fn derive_seed(seed: u64, proxy: &str, conn_index: u64, stream: Stream, toxic: &str) -> u64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    let mut eat = |bytes: &[u8]| {
        for b in bytes {
            h ^= u64::from(*b);
            h = h.wrapping_mul(0x0000_0100_0000_01b3);
        }
        h ^= 0xff;
        h = h.wrapping_mul(0x0000_0100_0000_01b3);
    };
    eat(&seed.to_le_bytes());
    eat(proxy.as_bytes());
    eat(&conn_index.to_le_bytes());
    eat(stream.as_str().as_bytes());
    eat(toxic.as_bytes());
    h
}

#[cfg(test)]
mod tests {
    use super::*;

    fn piece(n: usize) -> Piece {
        Piece { data: vec![7; n], gap: Duration::ZERO }
    }

    fn data(bytes: &[u8]) -> Piece {
        Piece { data: bytes.to_vec(), gap: Duration::ZERO }
    }

    #[test]
    fn a_write_and_its_commit_in_one_chunk_are_cut_after_the_commit() {
        let mut every = |_: &std::collections::BTreeSet<u64>| true;
        // A Parse message (extended protocol) holding the write, then COMMIT and more.
        let mut chunk = b"P\0\0\0\x20\0INSERT INTO t VALUES ($1)\0\0\0".to_vec();
        let kept = chunk.len() + PG_COMMIT.len();
        chunk.extend_from_slice(PG_COMMIT);
        chunk.extend_from_slice(b"Q\0\0\0\x09BEGIN\0");
        let mut pieces = vec![data(&chunk), piece(3)];
        let mut writes = Writes::default();
        assert!(cut_after_commit(&mut pieces, &mut writes, &postgres(), &mut every));
        assert_eq!((pieces.len(), pieces[0].data.len(), writes.wrote), (1, kept, false));
    }

    #[test]
    fn a_read_only_commit_passes_and_a_later_write_is_carried_to_its_commit() {
        let mut every = |_: &std::collections::BTreeSet<u64>| true;
        let mut read_only = b"Q\0\0\0\x1eSELECT updated_at FROM t\0".to_vec();
        read_only.extend_from_slice(PG_COMMIT);
        read_only.extend_from_slice(b"Q\0\0\0\x17delete\tfrom t\0");
        let mut pieces = vec![data(&read_only)];
        let mut writes = Writes::default();
        let statements = postgres();
        assert!(!cut_after_commit(&mut pieces, &mut writes, &statements, &mut every), "the read-only COMMIT passes");
        assert_eq!(pieces[0].data, read_only, "nothing is kept back");
        assert!(writes.wrote, "the delete after it is remembered");
        let mut pieces = vec![data(PG_COMMIT), piece(4)];
        assert!(
            cut_after_commit(&mut pieces, &mut writes, &statements, &mut every),
            "its COMMIT, in the next chunk, is cut"
        );
        assert_eq!(pieces.len(), 1);
    }

    /// A message: its type, its length (counting itself) and its body.
    fn message(kind: u8, body: &[u8]) -> Vec<u8> {
        let mut message = vec![kind];
        message.extend_from_slice(&(body.len() as u32 + 4).to_be_bytes());
        message.extend_from_slice(body);
        message
    }

    /// What a PostgreSQL client sends first: its startup message (protocol 3.0).
    fn startup() -> Vec<u8> {
        let mut startup = 17u32.to_be_bytes().to_vec();
        startup.extend_from_slice(&196_608u32.to_be_bytes());
        startup.extend_from_slice(b"user\0pg\0\0");
        startup
    }

    /// The statements of a PostgreSQL connection that has sent only its startup.
    fn postgres() -> Statements {
        let mut statements = Statements::default();
        statements.learn(&startup());
        statements
    }

    /// A Bind of statement `name` (no parameters), its Execute and a COMMIT.
    fn bind(name: &[u8]) -> Vec<u8> {
        let mut body = b"\0".to_vec();
        body.extend_from_slice(name);
        body.extend_from_slice(b"\0\0\0\0\0\0\0");
        let mut sent = message(b'B', &body);
        sent.extend(message(b'E', b"\0\0\0\0\0"));
        sent.extend_from_slice(PG_COMMIT);
        sent
    }

    #[test]
    fn a_bind_of_a_prepared_write_makes_its_transaction_a_write() {
        let mut every = |_: &std::collections::BTreeSet<u64>| true;
        let mut writes = Writes::default();
        let mut statements = postgres();
        // Prepared once per connection (Parse, Describe, Sync), in a transaction of its own,
        // learned whether or not a toxic watched.
        let mut prepare = message(b'P', b"s7\0UPDATE attempts SET state = $1 WHERE id = $2\0\0\0");
        prepare.extend(message(b'P', b"s8\0SELECT id FROM attempts\0\0\0"));
        prepare.extend(message(b'S', b""));
        statements.learn(&prepare);
        // Later transactions only bind the names.
        let mut pieces = vec![data(&bind(b"s8"))];
        assert!(!cut_after_commit(&mut pieces, &mut writes, &statements, &mut every), "a bound read passes");
        let mut pieces = vec![data(&bind(b"s7"))];
        assert!(cut_after_commit(&mut pieces, &mut writes, &statements, &mut every), "a bound write's COMMIT is cut");
        // A statement never seen parsed may write: its COMMIT is cut.
        let mut pieces = vec![data(&bind(b"s3"))];
        assert!(
            cut_after_commit(&mut pieces, &mut writes, &statements, &mut every),
            "a bound statement never seen parsed is cut"
        );
        // A `B` in a query's text is not a Bind: a read-only transaction's COMMIT passes.
        let mut read_only = message(b'Q', b"BEGIN ISOLATION LEVEL READ COMMITTED\0");
        read_only.extend(bind(b"s8"));
        let mut pieces = vec![data(&read_only)];
        assert!(!cut_after_commit(&mut pieces, &mut writes, &statements, &mut every), "BEGIN and a bound read pass");
    }

    #[test]
    fn statements_are_learned_only_on_a_connection_that_began_as_postgresql() {
        let read = message(b'P', b"s8\0SELECT id FROM attempts\0\0\0");
        // A connection whose first bytes are not a startup (HTTP, or one joined midway).
        let mut other = Statements::default();
        other.learn(b"POST /v1/claim HTTP/1.1\r\n");
        other.learn(&read);
        assert_eq!((other.postgres, other.bound(b"s8").is_none()), (Some(false), true), "unknown: it may write");
        let mut statements = postgres();
        statements.learn(&read);
        assert_eq!(
            (statements.postgres, statements.bound(b"s8").map(|parsed| parsed.write)),
            (Some(true), Some(false))
        );
        // The bound holds: names past it are not remembered, so they count as writes.
        for n in 0..NAMED_STATEMENTS_MAX + 10 {
            statements.learn(&message(b'P', format!("r{n}\0SELECT 1\0\0\0").as_bytes()));
        }
        assert_eq!(statements.named.len(), NAMED_STATEMENTS_MAX);
        assert!(statements.bound(format!("r{}", NAMED_STATEMENTS_MAX + 5).as_bytes()).is_none());
    }

    #[test]
    fn a_distinct_cut_takes_each_kind_of_transaction_once_and_a_rollback_ends_one() {
        let mut statements = postgres();
        let mut prepare = message(b'P', b"s1\0UPDATE attempts SET lease = $1\0\0\0");
        prepare.extend(message(b'P', b"s2\0INSERT INTO attempts VALUES ($1)\0\0\0"));
        statements.learn(&prepare);
        let mut seen = std::collections::HashSet::new();
        let mut distinct = |shape: &std::collections::BTreeSet<u64>| seen.insert(shape_hash(shape));
        let mut writes = Writes::default();
        let mut pieces = vec![data(&bind(b"s1"))];
        assert!(cut_after_commit(&mut pieces, &mut writes, &statements, &mut distinct), "the first renewal is cut");
        let mut pieces = vec![data(&bind(b"s1"))];
        assert!(!cut_after_commit(&mut pieces, &mut writes, &statements, &mut distinct), "a second passes");
        // Simple queries with other literals are the same kind of transaction.
        let update = |value: &str| {
            let mut sent = message(b'Q', format!("UPDATE jobs SET state = '{value}' WHERE n = 7\0").as_bytes());
            sent.extend_from_slice(PG_COMMIT);
            sent
        };
        let mut pieces = vec![data(&update("running"))];
        assert!(cut_after_commit(&mut pieces, &mut writes, &statements, &mut distinct), "a new kind is cut");
        let mut pieces = vec![data(&update("failed"))];
        assert!(!cut_after_commit(&mut pieces, &mut writes, &statements, &mut distinct), "the same kind passes");
        // A rolled-back write leaves neither its write nor its statements to the next one.
        let mut rolled = bind(b"s2");
        rolled.truncate(rolled.len() - PG_COMMIT.len());
        rolled.extend_from_slice(PG_ROLLBACK);
        rolled.extend(message(b'Q', b"SELECT 1\0"));
        rolled.extend_from_slice(PG_COMMIT);
        let mut pieces = vec![data(&rolled)];
        assert!(
            !cut_after_commit(&mut pieces, &mut writes, &statements, &mut distinct),
            "a read after a rollback passes"
        );
        let mut pieces = vec![data(&bind(b"s2"))];
        assert!(
            cut_after_commit(&mut pieces, &mut writes, &statements, &mut distinct),
            "the insert's first commit is cut"
        );
    }

    #[test]
    fn limit_keeps_exactly_the_budget() {
        let mut passed = 0;
        let mut pieces = vec![piece(6), piece(6)];
        assert!(!limit(&mut pieces, &mut passed, 20));
        assert_eq!(passed, 12);
        let mut pieces = vec![piece(6), piece(6)];
        assert!(limit(&mut pieces, &mut passed, 20));
        let kept: usize = pieces.iter().map(|p| p.data.len()).sum();
        assert_eq!(kept, 8);
    }

    #[test]
    fn slicer_covers_the_input_in_bounded_slices() {
        let mut rng = ChaCha8Rng::seed_from_u64(1);
        let out = slice(vec![piece(1000)], (10, 4), 3, &mut rng);
        assert_eq!(out.iter().map(|p| p.data.len()).sum::<usize>(), 1000);
        assert!(out.iter().all(|p| p.data.len() <= 14));
        assert!(out[..out.len() - 1].iter().all(|p| p.data.len() >= 6));
        assert!(out.len() > 60);
        assert_eq!(out[1].gap, Duration::from_micros(3));
    }

    #[test]
    fn pacing_sums_to_rate() {
        let out = pace(vec![piece(250_000)], 100);
        let total: Duration = out.iter().map(|p| p.gap).sum();
        assert!((total.as_secs_f64() - 2.5).abs() < 0.01, "{total:?}");
        assert!(out.iter().all(|p| p.data.len() <= 10_000));
    }

    #[test]
    fn jitter_stays_in_range_and_is_seeded() {
        let mut a = ChaCha8Rng::seed_from_u64(derive_seed(9, "p", 0, Stream::Upstream, "l"));
        let mut b = ChaCha8Rng::seed_from_u64(derive_seed(9, "p", 0, Stream::Upstream, "l"));
        for _ in 0..100 {
            let x = jittered_ms(&mut a, 100, 20);
            assert!((80..=120).contains(&x));
            assert_eq!(x, jittered_ms(&mut b, 100, 20));
        }
        assert_ne!(derive_seed(9, "p", 0, Stream::Upstream, "l"), derive_seed(10, "p", 0, Stream::Upstream, "l"));
    }
}
