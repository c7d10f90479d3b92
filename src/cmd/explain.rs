//! `clusterset-dns explain NAME`: asks a running server's
//! `/debug/explain` endpoint how it would answer and prints the report. The
//! report itself is built by the server (`ops::explain`), from the snapshot
//! it answers with, so it is what the server would do, not a re-enactment.

use std::io::{Read, Write};
use std::net::TcpStream;
use std::time::Duration;

use crate::cli::ExplainArgs;

/// Why `explain` could not get a report.
#[derive(Debug, thiserror::Error)]
pub enum ExplainError {
    /// The server could not be reached or did not answer.
    #[error("--server {addr}: {source}")]
    Io {
        /// The server address.
        addr: std::net::SocketAddr,
        /// The error.
        source: std::io::Error,
    },
    /// The server answered with an error status.
    #[error("the server answered {status}: {body}")]
    Status {
        /// The HTTP status line.
        status: String,
        /// Its explanation.
        body: String,
    },
}

/// Percent-encodes a query parameter value.
fn encode(v: &str) -> String {
    v.bytes()
        .map(|b| match b {
            b'a'..=b'z' | b'A'..=b'Z' | b'0'..=b'9' | b'-' | b'.' | b'_' => (b as char).to_string(),
            _ => format!("%{b:02X}"),
        })
        .collect()
}

/// Fetches the report; returns its text.
pub fn run(args: &ExplainArgs) -> Result<String, ExplainError> {
    let io = |source| ExplainError::Io { addr: args.server, source };
    let qtype = args.qtype.to_string();
    let mut path = format!("/debug/explain?name={}&type={}", encode(&args.name), encode(&qtype));
    if let Some(c) = &args.from_cluster {
        path += &format!("&cluster={}", encode(c));
    }
    let mut s = TcpStream::connect_timeout(&args.server, Duration::from_secs(5)).map_err(io)?;
    s.set_read_timeout(Some(Duration::from_secs(10))).map_err(io)?;
    write!(s, "GET {path} HTTP/1.1\r\nHost: {}\r\nConnection: close\r\n\r\n", args.server).map_err(io)?;
    let mut response = String::new();
    s.read_to_string(&mut response).map_err(io)?;
    let (head, body) = response.split_once("\r\n\r\n").unwrap_or((&response, ""));
    let status = head.lines().next().unwrap_or("").to_owned();
    if status.split_whitespace().nth(1) != Some("200") {
        return Err(ExplainError::Status { status, body: body.trim().to_owned() });
    }
    Ok(body.to_owned())
}

#[cfg(test)]
mod tests {
    #[test]
    fn parameters_are_percent_encoded() {
        assert_eq!(super::encode("web.shop svc&x"), "web.shop%20svc%26x");
    }
}
