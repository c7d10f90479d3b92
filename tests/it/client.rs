//! A stock DNS client library (hickory-net) resolves the example fleet over
//! UDP and TCP: what an application's resolver would see.

use hickory_net::client::{Client, ClientHandle};
use hickory_net::runtime::TokioRuntimeProvider;
use hickory_net::tcp::TcpClientStream;
use hickory_net::udp::UdpClientStream;
use hickory_proto::rr::{DNSClass, Name, RData, RecordType};

use crate::support::TestServer;

async fn answers(client: &mut Client<TokioRuntimeProvider>, name: &str, rtype: RecordType) -> Vec<String> {
    let response =
        client.query(Name::from_ascii(name).expect("name"), DNSClass::IN, rtype).await.expect("answer");
    assert!(response.metadata.authoritative);
    response
        .answers
        .iter()
        .map(|r| match &r.data {
            RData::A(a) => a.to_string(),
            RData::AAAA(a) => a.to_string(),
            other => other.to_string(),
        })
        .collect()
}

async fn resolve_the_fleet(client: &mut Client<TokioRuntimeProvider>) {
    assert_eq!(answers(client, "web.shop.svc.clusterset.local.", RecordType::A).await, ["10.42.0.10"]);
    assert_eq!(answers(client, "api.shop.svc.clusterset.local.", RecordType::AAAA).await, ["fd00:42::11"]);
    let db = answers(client, "db.shop.svc.clusterset.local.", RecordType::A).await;
    assert_eq!(db.len(), 3, "{db:?}");
    let srv = answers(client, "_postgres._tcp.db.shop.svc.clusterset.local.", RecordType::SRV).await;
    assert!(srv.iter().any(|r| r.ends_with("5432 db-0.cluster-b.db.shop.svc.clusterset.local.")), "{srv:?}");
}

#[test]
fn hickory_client_resolves_over_udp_and_tcp() {
    let server = TestServer::embedded();
    let addr = server.addr;
    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().expect("runtime");
    rt.block_on(async move {
        let provider = TokioRuntimeProvider::new();
        let (mut udp, bg) = Client::<TokioRuntimeProvider>::from_sender(
            UdpClientStream::builder(addr, provider.clone()).build(),
        );
        tokio::spawn(bg);
        resolve_the_fleet(&mut udp).await;

        let (stream, handle) = TcpClientStream::new(addr, None, None, provider);
        let (mut tcp, bg) = Client::<TokioRuntimeProvider>::new(stream.await.expect("tcp connect"), handle);
        tokio::spawn(bg);
        resolve_the_fleet(&mut tcp).await;
    });
}
