//! EndpointSlice lists and watches that ask for protobuf: the same events
//! kube's watcher gives ([`Event`]), for [`crate::k8s::watch::relist_with`],
//! with each object left as the bytes the API server sent until it is
//! converted. kube's watcher decodes JSON only (`Api::list` and
//! `Api::watch` deserialize with serde), so this is its protobuf twin for
//! the one kind this server lists in bulk.
//!
//! What it does as kube-runtime 5.0's watcher does: a paged list (`limit`,
//! `continue`, a consistent read), then a watch from the list's
//! resourceVersion with bookmarks, `timeoutSeconds=290`, and a new watch
//! from the last version seen when the server ends one; or a streaming list
//! (`sendInitialEvents=true`, `resourceVersionMatch=NotOlderThan`) whose end
//! is the bookmark annotated `k8s.io/initial-events-end`. A streaming list
//! the server ends before that bookmark starts again (a second
//! [`Event::Init`]), as kube's does, which the relist loop takes as a
//! refusal. Errors end the stream: the relist loop starts a fresh one with a
//! complete list.
//!
//! Content negotiation: every request accepts protobuf and JSON
//! (`--kube-encoding auto`) or JSON only (`json`). A response is read in
//! whichever it is in, by its `Content-Type`: a server (or proxy) that
//! answers JSON where protobuf was asked is read as JSON, counted in the
//! watch's health and logged once per API server.

use std::collections::VecDeque;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use bytes::{Buf, Bytes, BytesMut};
use futures::{Stream, StreamExt};
use http::header::{ACCEPT, CONTENT_TYPE, HeaderValue};
use http_body_util::BodyExt;
use k8s_openapi::api::discovery::v1::EndpointSlice;
use kube::Client;
use kube::api::{ListParams, ObjectList, WatchEvent, WatchParams};
use kube::core::{Request, Status};
use kube::runtime::watcher::{self, Event};
use tracing::{info, warn};

use super::decode::{self, DecodeError};
use super::slice::{self, SliceView};
use crate::k8s::watch::WatchHealth;

/// The protobuf content type; a watch's carries `;stream=watch`.
const PROTOBUF: &str = "application/vnd.kubernetes.protobuf";
/// What a request accepts in `--kube-encoding auto`: protobuf first.
const ACCEPT_PROTOBUF: &str = "application/vnd.kubernetes.protobuf, application/json";
/// What a request accepts in `--kube-encoding json`.
const ACCEPT_JSON: &str = "application/json";
/// The longest watch frame read: an object is at most 1.5 MiB in etcd
/// (kube-apiserver `--max-request-bytes`' default 3 MiB bounds writes); a
/// longer length is a broken stream, not an object.
const MAX_FRAME: usize = 16 << 20;
/// How long the API server keeps a watch open (kube's default).
const WATCH_TIMEOUT_SECONDS: u32 = 290;

/// How EndpointSlices are asked for (`--kube-encoding`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum KubeEncoding {
    /// Protobuf, read as JSON where the server answers JSON.
    Auto,
    /// JSON only.
    Json,
}

/// The encoding of one API server's watches, shared by their clones so
/// that a JSON answer to a protobuf request is logged once per server.
#[derive(Debug, Clone)]
pub struct Encoding {
    encoding: KubeEncoding,
    /// Whether the first protobuf answer was logged.
    told: Arc<AtomicBool>,
    /// Whether the first JSON answer to a protobuf request was logged.
    warned: Arc<AtomicBool>,
}

impl Encoding {
    /// Asks for `encoding`.
    pub fn new(encoding: KubeEncoding) -> Self {
        Self { encoding, told: Arc::default(), warned: Arc::default() }
    }

    fn accept(&self) -> &'static str {
        match self.encoding {
            KubeEncoding::Auto => ACCEPT_PROTOBUF,
            KubeEncoding::Json => ACCEPT_JSON,
        }
    }

    /// Whether a response with `content_type` is protobuf; a JSON one to a
    /// protobuf request is counted in `health` and logged once.
    fn is_protobuf(&self, content_type: &str, health: &WatchHealth) -> bool {
        if content_type.starts_with(PROTOBUF) {
            if !self.told.swap(true, Ordering::Relaxed) {
                info!(watch = %health.name, "reading EndpointSlices as Kubernetes protobuf");
            }
            return true;
        }
        if self.encoding == KubeEncoding::Auto {
            health.json_answer();
            if !self.warned.swap(true, Ordering::Relaxed) {
                warn!(
                    watch = %health.name,
                    content_type,
                    "the API server answered a request for protobuf EndpointSlices in another \
                     encoding; reading its answers as JSON (--kube-encoding json asks for JSON)"
                );
            }
        }
        false
    }
}

/// One EndpointSlice as the API server sent it.
#[derive(Debug, Clone)]
pub enum SliceObject {
    /// Its protobuf message (out of its envelope), and its place in the
    /// list that brought it, for naming it when it does not decode.
    Protobuf {
        /// The message.
        message: Bytes,
        /// Its index in its list; `None` for a watch event.
        position: Option<usize>,
    },
    /// Read from JSON.
    Json(Box<EndpointSlice>),
}

impl SliceObject {
    /// `read` applied to the slice, read as protobuf or JSON: the same
    /// generic function twice (`SliceFields` has one implementation per
    /// encoding). A message that does not decode is an error naming the
    /// slice as far as it can be read, else its place in its list.
    pub fn read<R>(
        &self,
        protobuf: impl FnOnce(&SliceView<'_>) -> R,
        json: impl FnOnce(&EndpointSlice) -> R,
    ) -> Result<R, String> {
        match self {
            Self::Json(s) => Ok(json(s)),
            Self::Protobuf { message, position } => match SliceView::parse(message) {
                Ok(view) => Ok(protobuf(&view)),
                Err(e) => Err(match (slice::identity(message), position) {
                    ((namespace, Some(name)), _) => {
                        format!("EndpointSlice {}/{name}: protobuf: {e}", namespace.unwrap_or(""))
                    }
                    (_, Some(i)) => format!("EndpointSlice at position {i} of its list: protobuf: {e}"),
                    (_, None) => format!("EndpointSlice of a watch event: protobuf: {e}"),
                }),
            },
        }
    }
}

/// What to list and watch.
#[derive(Clone)]
pub struct SliceWatch {
    /// The API server.
    pub client: Client,
    /// The collection's path (`Api::resource_url`).
    pub url: String,
    /// The label selector.
    pub labels: String,
    /// Objects per list request; `None`: one request.
    pub page_size: Option<u32>,
    /// How to ask.
    pub encoding: Encoding,
    /// The watch's health, for counting JSON answers.
    pub health: Arc<WatchHealth>,
}

/// The watch's events: a streaming list when `streaming`, else a paged
/// one, then changes; ends after its first error.
pub fn slices(
    watch: SliceWatch,
    streaming: bool,
) -> impl Stream<Item = Result<Event<SliceObject>, watcher::Error>> {
    let state = State {
        pending: VecDeque::from([Event::Init]),
        phase: if streaming { Phase::Stream } else { Phase::List { token: None } },
        version: String::new(),
        listed: 0,
        watch,
    };
    futures::stream::unfold(state, |mut state| async move { state.next().await.map(|item| (item, state)) })
}

struct State {
    watch: SliceWatch,
    phase: Phase,
    pending: VecDeque<Event<SliceObject>>,
    /// The last resourceVersion seen: where the next watch starts.
    version: String,
    /// Objects of the current paged list so far.
    listed: usize,
}

enum Phase {
    /// Next: a page of the list.
    List { token: Option<String> },
    /// Next: a streaming list.
    Stream,
    /// Next: a watch from `version`.
    Watch,
    /// Reading a watch; `initial` while its streaming list runs.
    Read { frames: Frames, initial: bool },
    /// Failed.
    Done,
}

impl State {
    async fn next(&mut self) -> Option<Result<Event<SliceObject>, watcher::Error>> {
        loop {
            if let Some(event) = self.pending.pop_front() {
                return Some(Ok(event));
            }
            let step = match std::mem::replace(&mut self.phase, Phase::Done) {
                Phase::Done => return None,
                Phase::List { token } => self.list(token).await,
                Phase::Stream => self.start(true).await,
                Phase::Watch => self.start(false).await,
                Phase::Read { mut frames, initial } => match frames.next().await {
                    Ok(Some(frame)) => {
                        let event = self.event(&frames, frame, initial);
                        let initial = initial && !matches!(event, Ok(Some(Event::InitDone)));
                        event.map(|e| {
                            self.pending.extend(e);
                            self.phase = Phase::Read { frames, initial };
                        })
                    }
                    // The server ended the watch (its timeout): watch on
                    // from the last version. A streaming list that ends
                    // unfinished starts again, as kube's watcher does.
                    Ok(None) if initial => {
                        self.pending.push_back(Event::Init);
                        self.phase = Phase::Stream;
                        Ok(())
                    }
                    Ok(None) => {
                        self.phase = Phase::Watch;
                        Ok(())
                    }
                    Err(e) => Err(watcher::Error::WatchFailed(e)),
                },
            };
            if let Err(e) = step {
                self.phase = Phase::Done;
                return Some(Err(e));
            }
        }
    }
}

impl SliceWatch {
    /// Sends `request`, with the Accept header of the encoding; the
    /// response and whether it is protobuf, or the error it carries.
    async fn send(
        &self,
        request: http::Request<Vec<u8>>,
    ) -> Result<(http::Response<kube::client::Body>, bool), kube::Error> {
        let mut request = request.map(kube::client::Body::from);
        request.headers_mut().insert(ACCEPT, HeaderValue::from_static(self.encoding.accept()));
        let response = self.client.send(request).await?;
        let content_type =
            response.headers().get(CONTENT_TYPE).and_then(|v| v.to_str().ok()).unwrap_or("").to_owned();
        if !response.status().is_success() {
            let code = response.status().as_u16();
            let body = response.into_body().collect().await?.to_bytes();
            return Err(kube::Error::Api(
                error_status(code, &body, content_type.starts_with(PROTOBUF)).boxed(),
            ));
        }
        let protobuf = self.encoding.is_protobuf(&content_type, &self.health);
        Ok((response, protobuf))
    }
}

impl State {
    async fn list(&mut self, token: Option<String>) -> Result<(), watcher::Error> {
        let mut params = ListParams::default().labels(&self.watch.labels);
        params.limit = self.watch.page_size;
        params.continue_token = token;
        let request = Request::new(&self.watch.url).list(&params).map_err(kube::Error::BuildRequest);
        let failed = watcher::Error::InitialListFailed;
        let (response, protobuf) = self.watch.send(request.map_err(failed)?).await.map_err(failed)?;
        let body = response.into_body().collect().await.map_err(failed)?.to_bytes();
        let token = if protobuf {
            let list = decode::envelope_of(&body, "EndpointSliceList").and_then(decode::list);
            let list = list.map_err(|e| failed(decoding(e)))?;
            for (i, item) in list.items.iter().enumerate() {
                let object =
                    SliceObject::Protobuf { message: body.slice_ref(item), position: Some(self.listed + i) };
                self.pending.push_back(Event::InitApply(object));
            }
            self.listed += list.items.len();
            self.version = list.resource_version.to_owned();
            list.continue_token.to_owned()
        } else {
            let list: ObjectList<EndpointSlice> =
                serde_json::from_slice(&body).map_err(|e| failed(kube::Error::SerdeError(e)))?;
            self.listed += list.items.len();
            self.pending
                .extend(list.items.into_iter().map(|s| Event::InitApply(SliceObject::Json(Box::new(s)))));
            self.version = list.metadata.resource_version.unwrap_or_default();
            list.metadata.continue_.unwrap_or_default()
        };
        if token.is_empty() {
            self.pending.push_back(Event::InitDone);
            self.listed = 0;
            self.phase = Phase::Watch;
        } else {
            self.phase = Phase::List { token: Some(token) };
        }
        Ok(())
    }

    /// Starts a watch: a streaming list when `initial`, else from the last
    /// version seen.
    async fn start(&mut self, initial: bool) -> Result<(), watcher::Error> {
        let mut params = WatchParams::default().labels(&self.watch.labels).timeout(WATCH_TIMEOUT_SECONDS);
        if initial {
            params = params.initial_events();
            // A consistent read: the objects as of now, not whatever the
            // API server's watch cache holds (`resourceVersion=0`).
            self.version.clear();
        }
        let failed = watcher::Error::WatchStartFailed;
        let request =
            Request::new(&self.watch.url).watch(&params, &self.version).map_err(kube::Error::BuildRequest);
        let (response, protobuf) = self.watch.send(request.map_err(failed)?).await.map_err(failed)?;
        let frames = Frames {
            body: Box::pin(response.into_body().into_data_stream()),
            buffer: BytesMut::new(),
            protobuf,
        };
        self.phase = Phase::Read { frames, initial };
        Ok(())
    }

    /// One watch event; `None` for a bookmark that only moves the version.
    fn event(
        &mut self,
        frames: &Frames,
        frame: Bytes,
        initial: bool,
    ) -> Result<Option<Event<SliceObject>>, watcher::Error> {
        let failed = |e| watcher::Error::WatchFailed(decoding(e));
        if !frames.protobuf {
            let event: WatchEvent<EndpointSlice> = serde_json::from_slice(&frame)
                .map_err(|e| watcher::Error::WatchFailed(kube::Error::SerdeError(e)))?;
            let (kind, object) = match event {
                WatchEvent::Added(s) => ("ADDED", s),
                WatchEvent::Modified(s) => ("MODIFIED", s),
                WatchEvent::Deleted(s) => ("DELETED", s),
                WatchEvent::Bookmark(b) => {
                    self.version = b.metadata.resource_version;
                    let end =
                        b.metadata.annotations.get(slice::INITIAL_EVENTS_END).is_some_and(|v| v == "true");
                    return Ok((initial && end).then_some(Event::InitDone));
                }
                WatchEvent::Error(status) => return Err(watcher::Error::WatchError(status)),
            };
            if let Some(version) = &object.metadata.resource_version {
                self.version.clone_from(version);
            }
            return Ok(Some(to_event(kind, SliceObject::Json(Box::new(object)), initial)));
        }
        let event = decode::watch_event(&frame).map_err(failed)?;
        let envelope = decode::envelope(event.object).map_err(failed)?;
        if event.kind == "ERROR" {
            let status = decode::status(envelope.raw).map_err(failed)?;
            let status = Status::failure(status.message, status.reason).with_code(status.code);
            return Err(watcher::Error::WatchError(Box::new(status)));
        }
        let (version, end) = slice::version_and_end(envelope.raw).map_err(failed)?;
        version.clone_into(&mut self.version);
        if event.kind == "BOOKMARK" {
            return Ok((initial && end).then_some(Event::InitDone));
        }
        let object = SliceObject::Protobuf { message: frame.slice_ref(envelope.raw), position: None };
        Ok(Some(to_event(event.kind, object, initial)))
    }
}

/// An object event as the watcher names it: `DELETED` a deletion, anything
/// else an object that is (during a streaming list: part of the list).
fn to_event(kind: &str, object: SliceObject, initial: bool) -> Event<SliceObject> {
    match kind {
        "DELETED" => Event::Delete(object),
        _ if initial => Event::InitApply(object),
        _ => Event::Apply(object),
    }
}

fn decoding(e: DecodeError) -> kube::Error {
    kube::Error::Service(Box::new(e))
}

/// The Status an error response carries, in whichever encoding it came;
/// its text when it is neither (a proxy's page).
fn error_status(code: u16, body: &[u8], protobuf: bool) -> Status {
    if protobuf && let Ok(s) = decode::envelope_of(body, "Status").and_then(decode::status) {
        return Status::failure(s.message, s.reason).with_code(if s.code == 0 { code } else { s.code });
    }
    if let Ok(s) = serde_json::from_slice::<Status>(body) {
        return s;
    }
    Status::failure(String::from_utf8_lossy(body).trim(), "").with_code(code)
}

/// A watch response split into frames: 4-byte big-endian lengths before
/// protobuf events, lines of JSON.
struct Frames {
    body: std::pin::Pin<Box<http_body_util::BodyDataStream<kube::client::Body>>>,
    buffer: BytesMut,
    protobuf: bool,
}

impl Frames {
    /// The next frame; `None` when the server ended the response.
    async fn next(&mut self) -> Result<Option<Bytes>, kube::Error> {
        loop {
            if let Some(frame) = self.split()? {
                return Ok(Some(frame));
            }
            match self.body.next().await {
                Some(chunk) => self.buffer.extend_from_slice(&chunk?),
                None => return Ok(None),
            }
        }
    }

    fn split(&mut self) -> Result<Option<Bytes>, kube::Error> {
        if !self.protobuf {
            return Ok(loop {
                let Some(end) = memchr::memchr(b'\n', &self.buffer) else { break None };
                let line = self.buffer.split_to(end + 1).freeze();
                if !line.trim_ascii().is_empty() {
                    break Some(line);
                }
            });
        }
        let Some(length) = self.buffer.first_chunk::<4>().map(|b| u32::from_be_bytes(*b) as usize) else {
            return Ok(None);
        };
        if length > MAX_FRAME {
            let e = std::io::Error::other(format!("a watch frame of {length} bytes (at most {MAX_FRAME})"));
            return Err(kube::Error::ReadEvents(e));
        }
        if self.buffer.len() < 4 + length {
            self.buffer.reserve(4 + length - self.buffer.len());
            return Ok(None);
        }
        self.buffer.advance(4);
        Ok(Some(self.buffer.split_to(length).freeze()))
    }
}
