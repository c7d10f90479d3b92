//! `GET` on the HTTP endpoint of a `clusterset-dns` process (`/health`,
//! `/ready`, `/metrics`), and reading one value out of a metrics scrape.

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::time::Duration;

/// `GET path` over HTTP/1.0: (status code, body); panics when the endpoint
/// does not accept the connection.
pub fn http_get(addr: SocketAddr, path: &str) -> (u16, String) {
    try_http_get(addr, path).unwrap_or_else(|| panic!("connect HTTP {addr}"))
}

/// `GET path` over HTTP/1.0: (status code, body), `None` when the
/// connection is refused or not made within 1 s (status 0 when the answer
/// does not parse).
pub fn try_http_get(addr: SocketAddr, path: &str) -> Option<(u16, String)> {
    let mut s = TcpStream::connect_timeout(&addr, Duration::from_secs(1)).ok()?;
    s.set_read_timeout(Some(Duration::from_secs(5))).ok()?;
    write!(s, "GET {path} HTTP/1.0\r\nHost: localhost\r\n\r\n").ok()?;
    let mut text = String::new();
    let _ = s.read_to_string(&mut text);
    let status = text.split_whitespace().nth(1).and_then(|c| c.parse().ok()).unwrap_or(0);
    let body = text.split_once("\r\n\r\n").map(|(_, b)| b.to_owned()).unwrap_or_default();
    Some((status, body))
}

/// The value of the first metric line that starts with `line` (a name, or a
/// name with its labels) in a scrape.
pub fn metric_value(scrape: &str, line: &str) -> Option<f64> {
    scrape.lines().find_map(|l| l.strip_prefix(line)?.trim().parse().ok())
}
