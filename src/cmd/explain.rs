//! `clusterset-dns explain NAME`: asks a running server's
//! `/debug/explain` endpoint how it would answer and prints the report. The
//! report itself is built by the server (`ops::explain`), from the snapshot
//! it answers with, so it is what the server would do, not a re-enactment.
//!
//! HTTP/1.1 is hyper's (the client half of what serves `/debug/`); the
//! query string is form_urlencoded's. The TCP connection is ours, so a
//! server that cannot be reached is named with the system's reason.

use std::net::SocketAddr;
use std::time::Duration;

use bytes::Bytes;
use http_body_util::{BodyExt, Empty};
use hyper_util::rt::TokioIo;
use tokio::net::TcpStream;

use crate::cli::ExplainArgs;

/// How long connecting may take.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(5);
/// How long the report may take once connected.
const ANSWER_TIMEOUT: Duration = Duration::from_secs(10);

/// Why `explain` could not get a report.
#[derive(Debug, thiserror::Error)]
pub enum ExplainError {
    /// The server could not be reached.
    #[error("--server {addr}: {source}")]
    Io {
        /// The server address.
        addr: SocketAddr,
        /// The error.
        source: std::io::Error,
    },
    /// The server was reached but did not speak HTTP as expected.
    #[error("--server {addr}: {source}")]
    Http {
        /// The server address.
        addr: SocketAddr,
        /// The error.
        source: hyper::Error,
    },
    /// Connecting, or the answer, took too long.
    #[error("--server {addr}: no answer within {} s", .after.as_secs())]
    Timeout {
        /// The server address.
        addr: SocketAddr,
        /// How long was waited.
        after: Duration,
    },
    /// The server answered with an error status.
    #[error("the server answered {status}: {body}")]
    Status {
        /// The HTTP status.
        status: http::StatusCode,
        /// Its explanation.
        body: String,
    },
}

/// The request's path and query.
fn path(args: &ExplainArgs) -> String {
    let mut query = form_urlencoded::Serializer::new(String::new());
    query.append_pair("name", &args.name).append_pair("type", &args.qtype.to_string());
    if let Some(c) = &args.from_cluster {
        query.append_pair("cluster", c);
    }
    format!("/debug/explain?{}", query.finish())
}

/// Fetches the report; returns its text.
pub fn run(args: &ExplainArgs) -> Result<String, ExplainError> {
    let addr = args.server;
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(|source| ExplainError::Io { addr, source })?;
    runtime.block_on(fetch(addr, &path(args)))
}

async fn fetch(addr: SocketAddr, path: &str) -> Result<String, ExplainError> {
    let io = |source| ExplainError::Io { addr, source };
    let http = |source| ExplainError::Http { addr, source };
    let timeout = |after| ExplainError::Timeout { addr, after };
    let stream = tokio::time::timeout(CONNECT_TIMEOUT, TcpStream::connect(addr))
        .await
        .map_err(|_| timeout(CONNECT_TIMEOUT))?
        .map_err(io)?;
    let exchange = async {
        let (mut sender, connection) = hyper::client::conn::http1::handshake(TokioIo::new(stream)).await?;
        let request = http::Request::get(path)
            .header(http::header::HOST, addr.to_string())
            .body(Empty::<Bytes>::new())
            .expect("a path, a host and an empty body make a request");
        // The connection is driven beside the request; `join` ends when
        // both have: the body read whole, the connection closed after it.
        let response = async {
            let response = sender.send_request(request).await?;
            let status = response.status();
            let body = response.into_body().collect().await?.to_bytes();
            drop(sender);
            Ok::<_, hyper::Error>((status, body))
        };
        let (connection, response) = tokio::join!(connection, response);
        let response = response?;
        connection?;
        Ok::<_, hyper::Error>(response)
    };
    let (status, body) = tokio::time::timeout(ANSWER_TIMEOUT, exchange)
        .await
        .map_err(|_| timeout(ANSWER_TIMEOUT))?
        .map_err(http)?;
    let body = String::from_utf8_lossy(&body).into_owned();
    if status != http::StatusCode::OK {
        return Err(ExplainError::Status { status, body: body.trim().to_owned() });
    }
    Ok(body)
}

#[cfg(test)]
mod tests {
    use clap::Parser;

    use super::*;

    fn args(line: &[&str]) -> ExplainArgs {
        match crate::cli::Cli::parse_from(line).command {
            crate::cli::Command::Explain(a) => a,
            _ => unreachable!("an explain command line"),
        }
    }

    #[test]
    fn parameters_are_form_encoded() {
        let a = args(&["x", "explain", "web.shop svc&x", "--type", "aaaa", "--from-cluster", "a/b"]);
        assert_eq!(path(&a), "/debug/explain?name=web.shop+svc%26x&type=AAAA&cluster=a%2Fb");
    }

    #[test]
    fn a_server_that_cannot_be_reached_is_named_with_the_reason() {
        // A port nothing listens on: bound, then closed.
        let addr =
            std::net::TcpListener::bind("127.0.0.1:0").and_then(|l| l.local_addr()).expect("a free port");
        let e = run(&args(&["x", "explain", "web.shop", "--server", &addr.to_string()])).unwrap_err();
        let text = e.to_string();
        assert!(text.starts_with(&format!("--server {addr}: ")), "{text}");
        assert!(text.to_lowercase().contains("refused"), "{text}");
    }

    #[test]
    fn a_server_that_does_not_speak_http_is_an_http_error_not_a_hang() {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
        let addr = listener.local_addr().expect("addr");
        let talker = std::thread::spawn(move || {
            use std::io::Write;
            let (mut s, _) = listener.accept().expect("accept");
            let _ = s.write_all(b"SSH-2.0-not-http\r\n");
        });
        let e = run(&args(&["x", "explain", "web.shop", "--server", &addr.to_string()])).unwrap_err();
        talker.join().expect("talker");
        assert!(matches!(e, ExplainError::Http { .. }), "{e}");
        assert!(e.to_string().starts_with(&format!("--server {addr}: ")), "{e}");
    }
}
