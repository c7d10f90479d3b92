//! The proof: `dns-version.<zone>` TXT asked through the cluster's DNS,
//! which answers it only by forwarding to clusterset-dns (the MCS DNS
//! specification's schema version record), with hickory's client.

use std::net::SocketAddr;
use std::time::{Duration, Instant};

use hickory_net::client::{Client, ClientHandle};
use hickory_net::runtime::TokioRuntimeProvider;
use hickory_net::udp::UdpClientStream;
use hickory_proto::op::ResponseCode;
use hickory_proto::rr::{DNSClass, Name, RData, RecordType};

/// What one attempt got.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Outcome {
    /// The TXT record's text.
    Answered(String),
    /// A response without it: its code.
    Code(ResponseCode),
    /// No response.
    Silent(String),
}

/// Asks `server` once for `name` TXT.
pub async fn ask(server: SocketAddr, name: &Name, timeout: Duration) -> Outcome {
    let stream =
        UdpClientStream::builder(server, TokioRuntimeProvider::new()).with_timeout(Some(timeout)).build();
    let (mut client, background) = Client::<TokioRuntimeProvider>::from_sender(stream);
    let task = tokio::spawn(background);
    let response =
        tokio::time::timeout(timeout, client.query(name.clone(), DNSClass::IN, RecordType::TXT)).await;
    task.abort();
    let response = match response {
        Err(_) => return Outcome::Silent(format!("no answer within {timeout:?}")),
        Ok(Err(e)) => return Outcome::Silent(e.to_string()),
        Ok(Ok(r)) => r,
    };
    let text = response.answers.iter().find_map(|r| match &r.data {
        RData::TXT(t) => {
            Some(t.txt_data.iter().map(|s| String::from_utf8_lossy(s).into_owned()).collect::<String>())
        }
        _ => None,
    });
    match text {
        Some(t) => Outcome::Answered(t),
        None => Outcome::Code(response.metadata.response_code),
    }
}

/// Asks until an answer comes or `patience` runs out (CoreDNS's `reload`
/// plugin picks up an edited ConfigMap within about two minutes); returns
/// the last outcome and how long it took.
pub async fn until_answered(server: SocketAddr, name: &Name, patience: Duration) -> (Outcome, Duration) {
    let start = Instant::now();
    loop {
        let outcome = ask(server, name, Duration::from_secs(2)).await;
        if matches!(outcome, Outcome::Answered(_)) || start.elapsed() >= patience {
            return (outcome, start.elapsed());
        }
        tokio::time::sleep(Duration::from_secs(1)).await;
    }
}
