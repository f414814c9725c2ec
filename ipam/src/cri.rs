//! The container runtime's view of a node's pod sandboxes (the CRI
//! `RuntimeService.ListPodSandbox` call on the runtime's socket), for
//! holders whose netns is unknown: those adopted from host-local, whose
//! files name only the sandbox (container) ID. Whether such a sandbox still
//! exists is the runtime's to say; nothing else on the node knows.
//!
//! The wire format is gRPC over HTTP/2 on a unix socket. The few protobuf
//! fields read here are encoded and decoded by the pure functions below
//! (field numbers from k8s.io/cri-api's api.proto), so no code generator
//! is needed; `SandboxRuntime` is the seam tests replace.

use std::path::{Path, PathBuf};
use std::time::Duration;

/// containerd's CRI socket, where kubelet's `containerRuntimeEndpoint`
/// points by default on a containerd node.
pub const DEFAULT_CRI_SOCKET: &str = "/run/containerd/containerd.sock";

const LIST_POD_SANDBOX: &str = "/runtime.v1.RuntimeService/ListPodSandbox";

/// What the runtime says of one sandbox ID.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SandboxState {
    /// The runtime answered and has no sandbox with that ID.
    Absent,
    /// It has it (ready or not), with the pod it belongs to.
    Present(Sandbox),
    /// The runtime could not be asked: nothing can be concluded.
    Unknown(String),
}

#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Sandbox {
    pub id: String,
    pub name: String,
    pub uid: String,
    pub namespace: String,
    pub ready: bool,
}

/// The seam: the real CRI client, or a scripted one in tests.
pub trait SandboxRuntime {
    fn sandbox(&self, id: &str) -> SandboxState;
    /// Where the answer came from, for messages ("CRI at /run/...").
    fn describe(&self) -> String;
}

/// A CRI runtime reached at a unix socket, one short request per call.
pub struct CriClient {
    socket: PathBuf,
    timeout: Duration,
}

impl CriClient {
    pub fn new(socket: &Path, timeout: Duration) -> CriClient {
        CriClient {
            socket: socket.to_path_buf(),
            timeout,
        }
    }

    fn list(&self, id: &str) -> Result<Vec<Sandbox>, String> {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .map_err(|e| format!("cannot start a runtime for the CRI call: {e}"))?;
        let request = grpc_frame(&list_request(id));
        let body = runtime.block_on(async {
            tokio::time::timeout(self.timeout, call(&self.socket, request))
                .await
                .map_err(|_| format!("no answer within {:?}", self.timeout))?
        })?;
        decode_list_response(&body)
    }
}

impl SandboxRuntime for CriClient {
    fn sandbox(&self, id: &str) -> SandboxState {
        match self.list(id) {
            Ok(items) => match items.into_iter().find(|s| s.id == id) {
                Some(s) => SandboxState::Present(s),
                None => SandboxState::Absent,
            },
            Err(e) => SandboxState::Unknown(e),
        }
    }

    fn describe(&self) -> String {
        format!("the container runtime at {}", self.socket.display())
    }
}

/// One unary gRPC call: the request frame in, the response message out.
async fn call(socket: &Path, frame: Vec<u8>) -> Result<Vec<u8>, String> {
    use http_body_util::{BodyExt, Full};
    let stream = tokio::net::UnixStream::connect(socket)
        .await
        .map_err(|e| format!("cannot connect to {}: {e}", socket.display()))?;
    let (mut sender, connection) = hyper::client::conn::http2::handshake(
        hyper_util::rt::TokioExecutor::new(),
        hyper_util::rt::TokioIo::new(stream),
    )
    .await
    .map_err(|e| format!("HTTP/2 handshake with {}: {e}", socket.display()))?;
    tokio::spawn(connection);
    let request = hyper::Request::post(format!("http://localhost{LIST_POD_SANDBOX}"))
        .header("content-type", "application/grpc")
        .header("te", "trailers")
        .body(Full::new(bytes::Bytes::from(frame)))
        .map_err(|e| format!("cannot build the CRI request: {e}"))?;
    let response = sender
        .send_request(request)
        .await
        .map_err(|e| format!("ListPodSandbox: {e}"))?;
    let status = response.status();
    let header_status = grpc_status(response.headers());
    let collected = response
        .into_body()
        .collect()
        .await
        .map_err(|e| format!("ListPodSandbox answer: {e}"))?;
    let trailer_status = collected.trailers().and_then(grpc_status);
    let bytes = collected.to_bytes();
    if !status.is_success() {
        return Err(format!("ListPodSandbox: HTTP {status}"));
    }
    match trailer_status.or(header_status) {
        Some((0, _)) | None => {}
        Some((code, msg)) => return Err(format!("ListPodSandbox: gRPC status {code}: {msg}")),
    }
    grpc_message(&bytes)
}

fn grpc_status(headers: &hyper::HeaderMap) -> Option<(u32, String)> {
    let code = headers.get("grpc-status")?.to_str().ok()?.parse().ok()?;
    let msg = headers
        .get("grpc-message")
        .and_then(|v| v.to_str().ok())
        .unwrap_or_default()
        .to_string();
    Some((code, msg))
}

/// A gRPC length-prefixed message: no compression, 4-byte length.
pub fn grpc_frame(message: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(message.len() + 5);
    out.push(0);
    out.extend_from_slice(&(message.len() as u32).to_be_bytes());
    out.extend_from_slice(message);
    out
}

/// The message inside one gRPC frame.
pub fn grpc_message(frame: &[u8]) -> Result<Vec<u8>, String> {
    if frame.is_empty() {
        return Ok(Vec::new());
    }
    if frame.len() < 5 {
        return Err("a truncated gRPC frame".into());
    }
    if frame[0] != 0 {
        return Err("a compressed gRPC frame, which was not asked for".into());
    }
    let len = u32::from_be_bytes([frame[1], frame[2], frame[3], frame[4]]) as usize;
    frame
        .get(5..5 + len)
        .map(<[u8]>::to_vec)
        .ok_or_else(|| "a gRPC frame shorter than its length".into())
}

fn put_varint(out: &mut Vec<u8>, mut v: u64) {
    while v >= 0x80 {
        out.push((v as u8) | 0x80);
        v >>= 7;
    }
    out.push(v as u8);
}

fn put_bytes(out: &mut Vec<u8>, field: u32, bytes: &[u8]) {
    put_varint(out, u64::from(field << 3 | 2));
    put_varint(out, bytes.len() as u64);
    out.extend_from_slice(bytes);
}

/// ListPodSandboxRequest { filter (1): PodSandboxFilter { id (1) } }.
pub fn list_request(id: &str) -> Vec<u8> {
    let mut filter = Vec::new();
    put_bytes(&mut filter, 1, id.as_bytes());
    let mut out = Vec::new();
    put_bytes(&mut out, 1, &filter);
    out
}

/// One field of a protobuf message: its number and its value.
enum Field<'a> {
    Varint(u64),
    Bytes(&'a [u8]),
}

/// The fields of a message, in order; None if it is malformed.
fn fields(mut b: &[u8]) -> Option<Vec<(u32, Field<'_>)>> {
    fn varint(b: &mut &[u8]) -> Option<u64> {
        let mut v: u64 = 0;
        for shift in (0..64).step_by(7) {
            let (&byte, rest) = b.split_first()?;
            *b = rest;
            v |= u64::from(byte & 0x7f) << shift;
            if byte & 0x80 == 0 {
                return Some(v);
            }
        }
        None
    }
    let mut out = Vec::new();
    while !b.is_empty() {
        let key = varint(&mut b)?;
        let number = u32::try_from(key >> 3).ok()?;
        match key & 7 {
            0 => out.push((number, Field::Varint(varint(&mut b)?))),
            1 => b = b.get(8..)?,
            2 => {
                let len = usize::try_from(varint(&mut b)?).ok()?;
                let (value, rest) = (b.get(..len)?, b.get(len..)?);
                out.push((number, Field::Bytes(value)));
                b = rest;
            }
            5 => b = b.get(4..)?,
            _ => return None,
        }
    }
    Some(out)
}

fn text(v: &[u8]) -> String {
    String::from_utf8_lossy(v).into_owned()
}

/// ListPodSandboxResponse { repeated PodSandbox items (1) }, PodSandbox
/// { id (1), metadata (2): { name (1), uid (2), namespace (3) }, state (3):
/// 0 ready, 1 not ready }.
pub fn decode_list_response(message: &[u8]) -> Result<Vec<Sandbox>, String> {
    let bad = || "an undecodable ListPodSandbox answer".to_string();
    let mut out = Vec::new();
    for (number, field) in fields(message).ok_or_else(bad)? {
        let (1, Field::Bytes(item)) = (number, field) else {
            continue;
        };
        let mut s = Sandbox {
            ready: true,
            ..Sandbox::default()
        };
        for (number, field) in fields(item).ok_or_else(bad)? {
            match (number, field) {
                (1, Field::Bytes(v)) => s.id = text(v),
                (2, Field::Bytes(meta)) => {
                    for (number, field) in fields(meta).ok_or_else(bad)? {
                        match (number, field) {
                            (1, Field::Bytes(v)) => s.name = text(v),
                            (2, Field::Bytes(v)) => s.uid = text(v),
                            (3, Field::Bytes(v)) => s.namespace = text(v),
                            _ => {}
                        }
                    }
                }
                (3, Field::Varint(state)) => s.ready = state == 0,
                _ => {}
            }
        }
        out.push(s);
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sandbox_message(id: &str, name: &str, uid: &str, ns: &str, state: u64) -> Vec<u8> {
        let mut meta = Vec::new();
        put_bytes(&mut meta, 1, name.as_bytes());
        put_bytes(&mut meta, 2, uid.as_bytes());
        put_bytes(&mut meta, 3, ns.as_bytes());
        put_varint(&mut meta, 4 << 3);
        put_varint(&mut meta, 1); // attempt, skipped
        let mut s = Vec::new();
        put_bytes(&mut s, 1, id.as_bytes());
        put_bytes(&mut s, 2, &meta);
        if state != 0 {
            put_varint(&mut s, 3 << 3);
            put_varint(&mut s, state);
        }
        put_varint(&mut s, 4 << 3);
        put_varint(&mut s, 1_700_000_000_000_000_000); // created_at, skipped
        s
    }

    #[test]
    fn requests_and_answers_on_the_wire() {
        assert_eq!(list_request("ab"), vec![0x0a, 4, 0x0a, 2, b'a', b'b']);
        let frame = grpc_frame(&[1, 2, 3]);
        assert_eq!(frame, vec![0, 0, 0, 0, 3, 1, 2, 3]);
        assert_eq!(grpc_message(&frame).unwrap(), vec![1, 2, 3]);
        assert!(grpc_message(&frame[..6]).is_err());
        assert!(grpc_message(&[1, 0, 0, 0, 0]).is_err());
        assert_eq!(grpc_message(&[]).unwrap(), Vec::<u8>::new());

        let mut answer = Vec::new();
        put_bytes(
            &mut answer,
            1,
            &sandbox_message("s1", "db-0", "u1", "db", 0),
        );
        put_bytes(
            &mut answer,
            1,
            &sandbox_message("s2", "db-1", "u2", "db", 1),
        );
        let got = decode_list_response(&answer).unwrap();
        assert_eq!(
            got,
            vec![
                Sandbox {
                    id: "s1".into(),
                    name: "db-0".into(),
                    uid: "u1".into(),
                    namespace: "db".into(),
                    ready: true
                },
                Sandbox {
                    id: "s2".into(),
                    name: "db-1".into(),
                    uid: "u2".into(),
                    namespace: "db".into(),
                    ready: false
                },
            ]
        );
        assert_eq!(decode_list_response(&[]).unwrap(), vec![]);
        assert!(decode_list_response(&[0x0a, 9, 1]).is_err(), "truncated");
    }

    #[test]
    fn an_unreachable_runtime_is_unknown_not_absent() {
        let c = CriClient::new(
            Path::new("/nonexistent/cri.sock"),
            Duration::from_millis(200),
        );
        match c.sandbox("abc") {
            SandboxState::Unknown(why) => assert!(why.contains("/nonexistent/cri.sock"), "{why}"),
            other => panic!("{other:?}"),
        }
    }
}
