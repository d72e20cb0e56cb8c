//! The bytes of incoming HTTP/1.1 requests, before hyper reads them, so that every request
//! is answered by the routes with the JSON error body.
//!
//! hyper answers a request it cannot parse itself, with a bare 400 (or 431, 414) and no
//! body. Two kinds of request reach it that way, and both are handled here:
//!
//! - a request-target with bytes RFC 3986 does not allow raw (any byte outside ASCII, and
//!   `"` `<` `>` `\` `^` `` ` `` `{` `|` `}`): each such byte is percent-encoded, so a raw
//!   `0xFF` in a path is read as `%FF` and answered as `%FF` is (`invalid_path` where a path
//!   parameter must be UTF-8, `no_route` elsewhere);
//! - a head that is not HTTP/1.x at all (request line or header syntax, a bad or conflicting
//!   `Content-Length`, a `Transfer-Encoding` that is not chunked), or one over
//!   [`HEAD_BYTES_MAX`] or [`HEADERS_MAX`]: it is replaced by a request for
//!   [`REFUSED_MALFORMED`] or [`REFUSED_TOO_LARGE`], which the routes' fallback answers with
//!   `malformed_request` (400) or `headers_too_large` (431), and the connection closes
//!   after that answer. No client can ask for those paths: every `{` a client sends in a
//!   request-target is percent-encoded.
//!
//! To find where each request begins in a connection's bytes, [`Framer`] follows HTTP/1.1
//! framing as hyper does: a head ends at its empty line, then come `Content-Length` bytes
//! or a chunked body. A body whose chunks it cannot follow is handed on unchanged from there
//! (hyper judges it; nothing after it is rewritten).

use std::io;
use std::pin::Pin;
use std::task::{Context, Poll};

use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};

/// Longest head (request line and header fields) read (16 KiB).
pub const HEAD_BYTES_MAX: usize = 16 * 1024;
/// Most header fields in one head.
pub const HEADERS_MAX: usize = 64;
/// Longest line of a chunked body's framing (size line, trailer field) followed (1 KiB).
const CHUNK_LINE_BYTES_MAX: usize = 1024;

/// The path a head that is not HTTP/1.x is replaced by.
pub const REFUSED_MALFORMED: &str = "/{malformed-request}";
/// The path a head over the size or field-count bound is replaced by.
pub const REFUSED_TOO_LARGE: &str = "/{headers-too-large}";

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Chunk {
    /// The size line of the next chunk.
    Size,
    /// Bytes of chunk data still to come.
    Data(u64),
    /// The line ending after a chunk's data.
    DataEnd,
    /// Trailer fields, up to the empty line that ends the body.
    Trailer,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum State {
    Head,
    /// Bytes of a sized body still to come.
    Body(u64),
    Chunked(Chunk),
    /// The framing was lost (an upgrade, a chunked body it cannot follow): bytes pass unchanged.
    Unchanged,
    /// A head was refused: nothing after it is read.
    Closed,
}

/// How a request's body is framed, from its head.
enum Framing {
    Sized(u64),
    Chunked,
    /// `CONNECT` or `Upgrade`: what follows is not HTTP/1.1 requests.
    Opaque,
}

/// Follows the requests in one connection's bytes and rewrites their heads (see the module).
#[derive(Debug)]
pub struct Framer {
    state: State,
    /// The head being read, or the framing line of a chunked body.
    pending: Vec<u8>,
}

impl Default for Framer {
    fn default() -> Framer {
        Framer { state: State::Head, pending: Vec::new() }
    }
}

impl Framer {
    /// Reads `input`, the next bytes of the connection; appends what hyper is to read to `out`.
    pub fn feed(&mut self, input: &[u8], out: &mut Vec<u8>) {
        let mut input = input.to_vec();
        while !input.is_empty() {
            input = self.take(input, out);
        }
    }

    /// The connection's input ended: a partial head is handed on as it is.
    pub fn finish(&mut self, out: &mut Vec<u8>) {
        if self.state == State::Head {
            out.append(&mut self.pending);
        }
    }

    /// Whether a refused head ended the connection's input.
    pub fn closed(&self) -> bool {
        self.state == State::Closed
    }

    /// Consumes some of `input`; returns the rest.
    fn take(&mut self, mut input: Vec<u8>, out: &mut Vec<u8>) -> Vec<u8> {
        match self.state {
            State::Closed => Vec::new(),
            State::Unchanged => {
                out.append(&mut input);
                Vec::new()
            }
            State::Body(left) => {
                let passed = input.len().min(usize::try_from(left).unwrap_or(usize::MAX));
                out.extend_from_slice(&input[..passed]);
                let left = left - passed as u64;
                self.state = if left == 0 { State::Head } else { State::Body(left) };
                input.split_off(passed)
            }
            State::Chunked(Chunk::Data(left)) => {
                let passed = input.len().min(usize::try_from(left).unwrap_or(usize::MAX));
                out.extend_from_slice(&input[..passed]);
                let left = left - passed as u64;
                self.state = State::Chunked(if left == 0 { Chunk::DataEnd } else { Chunk::Data(left) });
                input.split_off(passed)
            }
            State::Chunked(chunk) => self.chunk_line(chunk, input, out),
            State::Head => {
                // A head, and its request line, can only end with a `\n`.
                let line_ended = input.contains(&b'\n');
                self.pending.append(&mut input);
                match line_ended || self.pending.len() > HEAD_BYTES_MAX {
                    true => self.head(out),
                    false => Vec::new(),
                }
            }
        }
    }

    /// Reads one framing line of a chunked body; returns the bytes after it.
    fn chunk_line(&mut self, chunk: Chunk, mut input: Vec<u8>, out: &mut Vec<u8>) -> Vec<u8> {
        let Some(end) = input.iter().position(|&byte| byte == b'\n') else {
            out.extend_from_slice(&input);
            self.pending.append(&mut input);
            if self.pending.len() > CHUNK_LINE_BYTES_MAX {
                self.state = State::Unchanged;
            }
            return Vec::new();
        };
        let rest = input.split_off(end + 1);
        out.extend_from_slice(&input);
        self.pending.append(&mut input);
        let line = std::mem::take(&mut self.pending);
        let line = line.strip_suffix(b"\n").unwrap_or(&line);
        let line = line.strip_suffix(b"\r").unwrap_or(line);
        self.state = match chunk {
            Chunk::Size => match chunk_size(line) {
                Some(0) => State::Chunked(Chunk::Trailer),
                Some(size) => State::Chunked(Chunk::Data(size)),
                None => State::Unchanged,
            },
            Chunk::DataEnd if line.is_empty() => State::Chunked(Chunk::Size),
            Chunk::Trailer if line.is_empty() => State::Head,
            Chunk::Trailer => State::Chunked(Chunk::Trailer),
            Chunk::DataEnd | Chunk::Data(_) => State::Unchanged,
        };
        rest
    }

    /// Judges the head read so far; returns the bytes after it once it is complete.
    fn head(&mut self, out: &mut Vec<u8>) -> Vec<u8> {
        let Some(line_end) = request_line_end(&self.pending) else {
            return match self.pending.len() > HEAD_BYTES_MAX {
                true => self.refuse(REFUSED_TOO_LARGE, out),
                false => Vec::new(),
            };
        };
        // httparse refuses a target that is not UTF-8: encode before it parses.
        let Some(encoded) = encode_target(&self.pending, line_end) else {
            return self.refuse(REFUSED_MALFORMED, out);
        };
        let grown = encoded.len() - self.pending.len();
        let mut fields = [httparse::EMPTY_HEADER; HEADERS_MAX];
        let mut request = httparse::Request::new(&mut fields);
        let length = match request.parse(&encoded) {
            Ok(httparse::Status::Partial) if self.pending.len() <= HEAD_BYTES_MAX => return Vec::new(),
            Ok(httparse::Status::Partial) | Err(httparse::Error::TooManyHeaders) => {
                return self.refuse(REFUSED_TOO_LARGE, out)
            }
            Err(_) => return self.refuse(REFUSED_MALFORMED, out),
            Ok(httparse::Status::Complete(length)) if length - grown > HEAD_BYTES_MAX => {
                return self.refuse(REFUSED_TOO_LARGE, out)
            }
            Ok(httparse::Status::Complete(length)) => length,
        };
        self.state = match framing(&request) {
            Some(Framing::Sized(0)) => State::Head,
            Some(Framing::Sized(length)) => State::Body(length),
            Some(Framing::Chunked) => State::Chunked(Chunk::Size),
            Some(Framing::Opaque) => State::Unchanged,
            None => return self.refuse(REFUSED_MALFORMED, out),
        };
        out.extend_from_slice(&encoded[..length]);
        let rest = self.pending.split_off(length - grown);
        self.pending.clear();
        rest
    }

    /// Replaces the head by a request for `path` that closes the connection after its answer.
    fn refuse(&mut self, path: &str, out: &mut Vec<u8>) -> Vec<u8> {
        out.extend_from_slice(format!("GET {path} HTTP/1.1\r\nconnection: close\r\n\r\n").as_bytes());
        self.pending.clear();
        self.state = State::Closed;
        Vec::new()
    }
}

/// How the body of a parsed request is framed, as hyper reads it; `None` when hyper
/// refuses the head (HTTP/1.0 with `Transfer-Encoding`, a last encoding that is not
/// `chunked`, a `Content-Length` that is not digits, two different lengths).
fn framing(request: &httparse::Request) -> Option<Framing> {
    let http_11 = request.version == Some(1);
    let mut opaque = request.method == Some("CONNECT");
    let (mut chunked, mut transfer_encoded, mut length) = (false, false, None);
    for field in request.headers.iter() {
        if field.name.eq_ignore_ascii_case("transfer-encoding") {
            if !http_11 {
                return None;
            }
            transfer_encoded = true;
            let last = field.value.rsplit(|&byte| byte == b',').next().unwrap_or_default();
            chunked = last.trim_ascii().eq_ignore_ascii_case(b"chunked");
        } else if field.name.eq_ignore_ascii_case("content-length") && !transfer_encoded {
            let value = digits(field.value)?;
            if length.is_some_and(|earlier| earlier != value) {
                return None;
            }
            length = Some(value);
        } else if field.name.eq_ignore_ascii_case("upgrade") && http_11 {
            opaque = true;
        }
    }
    match (transfer_encoded, chunked) {
        (true, false) => None,
        _ if opaque => Some(Framing::Opaque),
        (true, true) => Some(Framing::Chunked),
        (false, _) => Some(Framing::Sized(length.unwrap_or(0))),
    }
}

/// A decimal number of digits only, as hyper reads `Content-Length`.
fn digits(bytes: &[u8]) -> Option<u64> {
    if bytes.is_empty() {
        return None;
    }
    bytes.iter().try_fold(0u64, |number, &byte| {
        let digit = byte.checked_sub(b'0').filter(|digit| *digit <= 9)?;
        number.checked_mul(10)?.checked_add(u64::from(digit))
    })
}

/// The size of a chunk from its size line (hex digits, then optional extensions).
fn chunk_size(line: &[u8]) -> Option<u64> {
    let hex = line.iter().take_while(|byte| byte.is_ascii_hexdigit()).count();
    let text = std::str::from_utf8(&line[..hex]).ok()?;
    u64::from_str_radix(text, 16).ok()
}

/// Whether a request-target byte is sent percent-encoded (see the module).
fn needs_encoding(byte: u8) -> bool {
    !byte.is_ascii_graphic() || matches!(byte, b'"' | b'<' | b'>' | b'\\' | b'^' | b'`' | b'{' | b'|' | b'}')
}

/// Where the request line ends (its `\n`), after the empty lines httparse skips before it.
fn request_line_end(head: &[u8]) -> Option<usize> {
    let start = head.iter().position(|&byte| byte != b'\r' && byte != b'\n')?;
    Some(start + head[start..].iter().position(|&byte| byte == b'\n')?)
}

/// The head with the request-target of its request line (ending at `line_end`)
/// percent-encoded; `None` when the line has no target between two spaces, or the encoded
/// target is still not a URI hyper reads.
fn encode_target(head: &[u8], line_end: usize) -> Option<Vec<u8>> {
    let start = head.iter().position(|&byte| byte != b'\r' && byte != b'\n')?;
    let line = &head[start..line_end];
    let target_start = start + line.iter().position(|&byte| byte == b' ')? + 1;
    let target_end = target_start + head[target_start..line_end].iter().position(|&byte| byte == b' ')?;
    let mut target = Vec::with_capacity(target_end - target_start);
    for &byte in &head[target_start..target_end] {
        if needs_encoding(byte) {
            target.extend_from_slice(format!("%{byte:02X}").as_bytes());
        } else {
            target.push(byte);
        }
    }
    axum::http::Uri::try_from(target.as_slice()).ok()?;
    Some([&head[..target_start], &target, &head[target_end..]].concat())
}

/// A connection whose incoming bytes go through a [`Framer`]; outgoing bytes pass unchanged.
pub struct Ingress<IO> {
    io: IO,
    framer: Framer,
    /// Bytes the framer handed on that hyper has not read yet, from `ready_at`.
    ready: Vec<u8>,
    ready_at: usize,
    scratch: Vec<u8>,
}

impl<IO> Ingress<IO> {
    pub fn new(io: IO) -> Ingress<IO> {
        Ingress { io, framer: Framer::default(), ready: Vec::new(), ready_at: 0, scratch: vec![0; 8 * 1024] }
    }
}

impl<IO: AsyncRead + Unpin> AsyncRead for Ingress<IO> {
    fn poll_read(self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &mut ReadBuf<'_>) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        loop {
            if this.ready_at < this.ready.len() {
                let count = buf.remaining().min(this.ready.len() - this.ready_at);
                buf.put_slice(&this.ready[this.ready_at..this.ready_at + count]);
                this.ready_at += count;
                if this.ready_at == this.ready.len() {
                    this.ready.clear();
                    this.ready_at = 0;
                }
                return Poll::Ready(Ok(()));
            }
            if this.framer.closed() {
                return Poll::Ready(Ok(()));
            }
            let mut scratch = ReadBuf::new(&mut this.scratch);
            std::task::ready!(Pin::new(&mut this.io).poll_read(cx, &mut scratch))?;
            if scratch.filled().is_empty() {
                this.framer.finish(&mut this.ready);
                if this.ready.is_empty() {
                    return Poll::Ready(Ok(()));
                }
            } else {
                this.framer.feed(scratch.filled(), &mut this.ready);
            }
        }
    }
}

impl<IO: AsyncWrite + Unpin> AsyncWrite for Ingress<IO> {
    fn poll_write(self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &[u8]) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.get_mut().io).poll_write(cx, buf)
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.get_mut().io).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.io.is_write_vectored()
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().io).poll_flush(cx)
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().io).poll_shutdown(cx)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// What hyper reads when the connection brings `input` in pieces of `piece` bytes.
    fn framed(input: &[u8], piece: usize) -> Vec<u8> {
        let mut framer = Framer::default();
        let mut out = Vec::new();
        for part in input.chunks(piece) {
            framer.feed(part, &mut out);
        }
        framer.finish(&mut out);
        out
    }

    fn check(input: &[u8], expected: &[u8]) {
        for piece in [1, 2, 7, 64, input.len().max(1)] {
            let out = framed(input, piece);
            assert_eq!(
                String::from_utf8_lossy(&out),
                String::from_utf8_lossy(expected),
                "in pieces of {piece} bytes: {:?}",
                String::from_utf8_lossy(input)
            );
        }
    }

    #[test]
    fn a_raw_byte_outside_ascii_in_a_target_is_percent_encoded() {
        check(b"GET /v1/jobs/\xff HTTP/1.1\r\nhost: x\r\n\r\n", b"GET /v1/jobs/%FF HTTP/1.1\r\nhost: x\r\n\r\n");
        check(b"GET /a{b}?c=<\"> HTTP/1.1\r\n\r\n", b"GET /a%7Bb%7D?c=%3C%22%3E HTTP/1.1\r\n\r\n");
        check(b"\r\nGET /%41\xc3\xa4 HTTP/1.1\n\n", b"\r\nGET /%41%C3%A4 HTTP/1.1\n\n");
    }

    #[test]
    fn bodies_pass_unchanged_and_the_next_request_is_found_after_them() {
        let sized = b"POST /v1/jobs HTTP/1.1\r\ncontent-length: 13\r\n\r\n{\"k\": \"\xc3\xa4 \xff\"}";
        let next = b"GET /\xff HTTP/1.1\r\n\r\n";
        check(&[&sized[..], next].concat(), &[&sized[..], b"GET /%FF HTTP/1.1\r\n\r\n"].concat());
        let chunked =
            b"POST /v1/steps HTTP/1.1\r\ntransfer-encoding: chunked\r\n\r\n3;x=y\r\n\xff \xff\r\n0\r\nt: 1\r\n\r\n";
        check(&[&chunked[..], next].concat(), &[&chunked[..], b"GET /%FF HTTP/1.1\r\n\r\n"].concat());
    }

    #[test]
    fn a_head_hyper_would_refuse_becomes_a_request_for_the_refusal() {
        let malformed = format!("GET {REFUSED_MALFORMED} HTTP/1.1\r\nconnection: close\r\n\r\n");
        let too_large = format!("GET {REFUSED_TOO_LARGE} HTTP/1.1\r\nconnection: close\r\n\r\n");
        check(b"GARBAGE\r\n\r\nGET / HTTP/1.1\r\n\r\n", malformed.as_bytes());
        check(b"GET / HTTP/2.0\r\n\r\n", malformed.as_bytes());
        check(b"GET :// HTTP/1.1\r\n\r\n", malformed.as_bytes());
        check(b"GET / HTTP/1.1\r\nbad header\r\n\r\n", malformed.as_bytes());
        check(b"POST / HTTP/1.1\r\ncontent-length: +5\r\n\r\n", malformed.as_bytes());
        check(b"POST / HTTP/1.1\r\ncontent-length: 5\r\ncontent-length: 6\r\n\r\n", malformed.as_bytes());
        check(b"POST / HTTP/1.1\r\ntransfer-encoding: gzip\r\n\r\n", malformed.as_bytes());
        check(b"POST / HTTP/1.0\r\ntransfer-encoding: chunked\r\n\r\n", malformed.as_bytes());
        let many: String = (0..=HEADERS_MAX).map(|n| format!("x-{n}: 1\r\n")).collect();
        check(format!("GET / HTTP/1.1\r\n{many}\r\n").as_bytes(), too_large.as_bytes());
        let long = format!("GET / HTTP/1.1\r\nx: {}\r\n\r\n", "a".repeat(HEAD_BYTES_MAX));
        check(long.as_bytes(), too_large.as_bytes());
        check(format!("GET /{} HTTP/1.1", "a".repeat(HEAD_BYTES_MAX)).as_bytes(), too_large.as_bytes());
    }

    #[test]
    fn an_unfinished_head_is_handed_on_at_the_end_of_input() {
        check(b"GET /\xff HTTP/1.1\r\nhost", b"GET /\xff HTTP/1.1\r\nhost");
    }
}
