//! Which server answered, with `dig` alone: CHAOS TXT `id.server.`,
//! `hostname.bind.`, `version.server.`, `version.bind.` (RFC 4892) and NSID
//! (RFC 5001), so two replicas behind one Service can be told apart.

use crate::binary::Served;

#[test]
fn chaos_txt_names_give_the_server_id_and_version_over_udp_and_tcp() {
    let s = Served::start(&["--server-id", "replica-1"]);
    for transport in ["+notcp", "+tcp"] {
        for name in ["id.server", "hostname.bind", "ID.Server"] {
            assert_eq!(s.dig(&["CH", "TXT", name, "+short", transport]).trim(), "\"replica-1\"", "{name}");
        }
        let version = format!("\"clusterset-dns {}\"", env!("CARGO_PKG_VERSION"));
        for name in ["version.server", "version.bind"] {
            assert_eq!(s.dig(&["CH", "TXT", name, "+short", transport]).trim(), version, "{name}");
        }
    }
    let full = s.dig(&["CH", "TXT", "id.server"]);
    assert!(full.contains("status: NOERROR") && full.contains("flags: qr aa"), "{full}");
    assert!(full.contains("id.server.\t\t0\tCH\tTXT\t\"replica-1\""), "{full}");
    // Other CHAOS names are not ours.
    assert!(s.dig(&["CH", "TXT", "authors.bind"]).contains("status: REFUSED"));
    // The zone itself is IN only.
    assert!(s.dig(&["CH", "TXT", "web.shop.svc.clusterset.local"]).contains("status: REFUSED"));
}

#[test]
fn hide_version_refuses_the_version_and_keeps_the_id() {
    let s = Served::start(&["--server-id", "replica-2", "--hide-version"]);
    assert!(s.dig(&["CH", "TXT", "version.bind"]).contains("status: REFUSED"));
    assert!(s.dig(&["CH", "TXT", "version.server"]).contains("status: REFUSED"));
    assert_eq!(s.dig(&["CH", "TXT", "id.server", "+short"]).trim(), "\"replica-2\"");
}

#[test]
fn nsid_tells_two_replicas_apart_and_defaults_to_the_pod_name() {
    let a = Served::start_env("serve", &[], &[("HOSTNAME", "clusterset-dns-7d9f8-abcde")]);
    let b = Served::start_env("serve", &[], &[("HOSTNAME", "clusterset-dns-7d9f8-xyz12")]);
    for (s, id) in [(&a, "clusterset-dns-7d9f8-abcde"), (&b, "clusterset-dns-7d9f8-xyz12")] {
        let out = s.dig(&["web.shop.svc.clusterset.local", "A", "+nsid"]);
        assert!(out.contains("; NSID: ") && out.contains(&format!("(\"{id}\")")), "{out}");
        assert!(out.contains("10.42.0.10"), "the answer is unchanged: {out}");
        // Not asked, not sent.
        assert!(!s.dig(&["web.shop.svc.clusterset.local", "A"]).contains("NSID"));
        assert_eq!(s.dig(&["CH", "TXT", "hostname.bind", "+short"]).trim(), format!("\"{id}\""));
    }
}
