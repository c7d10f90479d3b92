//! Before every source has synced, a name not found may only be "not yet
//! known": SERVFAIL, never a cacheable NXDOMAIN.

use std::str::FromStr;

use clusterset_dns::store::{self, SourceId, Update, ZoneConfig};
use clusterset_dns::wire::{WireConfig, udp};
use hickory_proto::op::ResponseCode;
use hickory_proto::rr::Name;

use crate::support::q;

#[test]
fn names_not_found_are_servfail_until_every_source_synced() {
    let (reader, mut writer) = store::new(ZoneConfig::with_defaults(
        Name::from_str("clusterset.local.").unwrap(),
        store::AnswerConfig::standard(),
    ));
    writer.apply(Update::Register(SourceId::Watch(1)));
    writer.publish();
    let workers = udp::start(
        "127.0.0.1:0".parse().unwrap(),
        1,
        reader,
        WireConfig::default(),
        Default::default(),
        Default::default(),
    )
    .unwrap();
    let addr = workers.local_addr;
    let m = q("web.shop.svc.clusterset.local.", "A").udp(addr);
    assert_eq!(m.metadata.response_code, ResponseCode::ServFail);
    assert!(m.authorities.is_empty(), "nothing to cache");
    // Names that exist regardless of sources still answer.
    assert_eq!(q("dns-version.clusterset.local.", "TXT").udp(addr).answers.len(), 1);
    writer.apply(Update::Replace { source: SourceId::Watch(1), objects: vec![] });
    writer.publish();
    assert_eq!(
        q("web.shop.svc.clusterset.local.", "A").udp(addr).metadata.response_code,
        ResponseCode::NXDomain
    );
    workers.stop();
}
