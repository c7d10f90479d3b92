//! `GET` on the HTTP endpoint of a `clusterset-dns` process (`/health`,
//! `/ready`, `/metrics`), and reading one value out of a metrics scrape.

use std::io::{Read, Write};
use std::net::{IpAddr, SocketAddr, TcpStream};
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
    let s = TcpStream::connect_timeout(&addr, Duration::from_secs(1)).ok()?;
    exchange(s, path)
}

/// [`http_get`] from a connection bound to `source` (e.g. 127.0.0.2, one
/// of loopback's other addresses), for what the server allows by the
/// peer's address.
pub fn http_get_from(source: IpAddr, addr: SocketAddr, path: &str) -> (u16, String) {
    use socket2::{Domain, Socket, Type};
    let socket = Socket::new(Domain::for_address(addr), Type::STREAM, None).expect("socket");
    socket.bind(&SocketAddr::new(source, 0).into()).unwrap_or_else(|e| panic!("bind {source}: {e}"));
    socket
        .connect_timeout(&addr.into(), Duration::from_secs(1))
        .unwrap_or_else(|e| panic!("connect HTTP {addr} from {source}: {e}"));
    exchange(socket.into(), path).unwrap_or_else(|| panic!("HTTP {addr} from {source}: no answer"))
}

/// Sends `GET path` on `s` and reads the whole answer.
fn exchange(mut s: TcpStream, path: &str) -> Option<(u16, String)> {
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

/// The sum of every series of family `name` in a scrape (a counter whose
/// labels split it, as `clusterset_dns_sync_reconciles_total{reason}`);
/// `None` when the scrape has none.
pub fn metric_sum(scrape: &str, name: &str) -> Option<f64> {
    let values: Vec<f64> = scrape
        .lines()
        .filter_map(|l| {
            let rest = l.strip_prefix(name)?;
            let value = match rest.strip_prefix('{') {
                Some(labelled) => labelled.split_once("} ")?.1,
                None => rest.strip_prefix(' ')?,
            };
            value.trim().parse().ok()
        })
        .collect();
    (!values.is_empty()).then(|| values.iter().sum())
}
