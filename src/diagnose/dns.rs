//! One member's DNS answers for a service name: A, AAAA and SRV, asked with
//! hickory's client over UDP, again over TCP when the answer is truncated
//! (as a stub resolver would). The messages are hickory's; nothing of the
//! wire format is written here.

use std::net::SocketAddr;
use std::time::Duration;

use hickory_net::client::{Client, ClientHandle};
use hickory_net::runtime::TokioRuntimeProvider;
use hickory_net::tcp::TcpClientStream;
use hickory_net::udp::UdpClientStream;
use hickory_proto::op::ResponseCode;
use hickory_proto::rr::{DNSClass, Name, RData, RecordType};

use super::observed::{Answer, SeenDns};

/// Asks `server` for the A, AAAA and SRV records of `name` (fully
/// qualified); each question may take `timeout`.
pub async fn ask(server: SocketAddr, name: &Name, timeout: Duration) -> SeenDns {
    let (a, aaaa, srv) = tokio::join!(
        question(server, name, RecordType::A, timeout),
        question(server, name, RecordType::AAAA, timeout),
        question(server, name, RecordType::SRV, timeout),
    );
    SeenDns { server, name: name.to_string(), a, aaaa, srv }
}

async fn question(server: SocketAddr, name: &Name, rtype: RecordType, timeout: Duration) -> Answer {
    match over_udp(server, name, rtype, timeout).await {
        Ok(Some(answer)) => answer,
        // Truncated: the whole answer over TCP.
        Ok(None) => over_tcp(server, name, rtype, timeout).await.unwrap_or_else(Answer::NoResponse),
        Err(e) => Answer::NoResponse(e),
    }
}

/// The answer, or `None` when it came truncated.
async fn over_udp(
    server: SocketAddr,
    name: &Name,
    rtype: RecordType,
    timeout: Duration,
) -> Result<Option<Answer>, String> {
    let provider = TokioRuntimeProvider::new();
    let stream = UdpClientStream::builder(server, provider).with_timeout(Some(timeout)).build();
    let (mut client, background) = Client::<TokioRuntimeProvider>::from_sender(stream);
    let task = tokio::spawn(background);
    let response = tokio::time::timeout(timeout, client.query(name.clone(), DNSClass::IN, rtype)).await;
    task.abort();
    let response =
        response.map_err(|_| format!("no answer within {timeout:?}"))?.map_err(|e| e.to_string())?;
    if response.metadata.truncation {
        return Ok(None);
    }
    Ok(Some(answer(response.metadata.response_code, &response.answers)))
}

async fn over_tcp(
    server: SocketAddr,
    name: &Name,
    rtype: RecordType,
    timeout: Duration,
) -> Result<Answer, String> {
    let provider = TokioRuntimeProvider::new();
    let (connect, handle) = TcpClientStream::new(server, None, Some(timeout), provider);
    let exchange = async {
        let stream = connect.await.map_err(|e| format!("TCP: {e}"))?;
        let (mut client, background) = Client::<TokioRuntimeProvider>::with_timeout(stream, handle, timeout);
        let task = tokio::spawn(background);
        let response = client.query(name.clone(), DNSClass::IN, rtype).await;
        task.abort();
        response.map_err(|e| format!("TCP: {e}"))
    };
    let response = tokio::time::timeout(timeout, exchange)
        .await
        .map_err(|_| format!("no answer within {timeout:?} (TCP)"))??;
    Ok(answer(response.metadata.response_code, &response.answers))
}

fn answer(rcode: ResponseCode, records: &[hickory_proto::rr::Record]) -> Answer {
    let mut data: Vec<String> = records
        .iter()
        .filter_map(|r| match &r.data {
            RData::A(a) => Some(a.to_string()),
            RData::AAAA(a) => Some(a.to_string()),
            RData::SRV(s) => Some(format!("{} {} {} {}", s.priority, s.weight, s.port, s.target)),
            // CNAMEs and the like are not part of an MCS answer.
            _ => None,
        })
        .collect();
    data.sort();
    Answer::Response { rcode: rcode_name(rcode), records: data }
}

/// The mnemonic dig prints.
pub fn rcode_name(rcode: ResponseCode) -> String {
    match rcode {
        ResponseCode::NoError => "NOERROR".into(),
        ResponseCode::FormErr => "FORMERR".into(),
        ResponseCode::ServFail => "SERVFAIL".into(),
        ResponseCode::NXDomain => "NXDOMAIN".into(),
        ResponseCode::NotImp => "NOTIMP".into(),
        ResponseCode::Refused => "REFUSED".into(),
        other => format!("RCODE{}", u16::from(other)),
    }
}
