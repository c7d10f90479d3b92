//! Writes the generated seeds of every fuzz target into `fuzz/seeds/`, so the
//! committed corpus can be rebuilt and reviewed: each seed is a readable
//! model value ([`Query`]) or text, named for what it holds.
//!
//! `cd fuzz && cargo run --example seeds`
//!
//! - `seeds/query/`: the queries in wire form (the raw-bytes target);
//! - `seeds/structured/`, `seeds/differential/`: the same queries as the
//!   bytes `arbitrary` builds them from (`clusterset_dns_fuzz::seed`);
//! - `seeds/objects/`: objects files, YAML and JSON.
//!
//! Every EDNS option code a server meets (Client Subnet, COOKIE, NSID,
//! padding, TCP keepalive, an unknown one) gets a seed for each data length
//! 0..=20, and every malformed shape of `tests/it/hostile.rs` gets one.
//! Seeds written by hand or kept from fuzzing runs (other names) are left
//! alone.

use std::path::Path;

use clusterset_dns_fuzz::query::*;
use clusterset_dns_fuzz::seed;

/// Index of a word of [`WORDS`].
fn w(word: &str) -> Label {
    let i = WORDS.iter().position(|x| *x == word).expect("a word of WORDS");
    Label::Word(i as u8)
}

fn name(words: &[&str], end: NameEnd) -> Name {
    Name { labels: words.iter().map(|x| w(x)).collect(), end }
}

/// A query of one question, true counts, no EDNS.
fn query(qname: Name, qtype: Type) -> Query {
    Query {
        id: 0x1234,
        flags: 0x0100, // RD, as dig sends it
        opcode: Opcode::Query,
        response: 0,
        counts: [None; 4],
        questions: vec![Question { name: qname, qtype, qclass: Class::In }],
        answers: vec![],
        authority: vec![],
        additional: vec![],
        trailing: vec![],
    }
}

fn web() -> Query {
    query(name(&["web", "shop"], NameEnd::Services), Type::A)
}

fn opt(options: Vec<EdnsOption>) -> Opt {
    Opt {
        owner: None,
        payload: Payload::P1232,
        ext_rcode: 0,
        version: Version::Zero,
        flags: 0,
        options,
        rdlength: None,
    }
}

fn with_opt(mut q: Query, o: Opt) -> Query {
    q.additional.push(Additional::Opt(o));
    q
}

fn option(code: OptionCode, data: OptionData) -> EdnsOption {
    EdnsOption { code, data, length: None }
}

fn bytes(b: &[u8]) -> OptionData {
    OptionData::Bytes(b.to_vec())
}

/// Option data of `len` bytes shaped for `code`.
fn data_of(code: OptionCode, len: usize) -> OptionData {
    match code {
        // As tests/it/hostile.rs: FAMILY 1, SOURCE 0, SCOPE 0, then address
        // bytes: valid at 4 bytes only.
        OptionCode::Subnet => {
            let all: Vec<u8> = [0u8, 1, 0, 0].into_iter().chain((1..=16u8).map(|b| b * 7)).collect();
            bytes(&all[..len])
        }
        OptionCode::Cookie if len >= 8 => {
            OptionData::Cookie { client: *b"client-c", server: (0..len - 8).map(|i| i as u8).collect() }
        }
        OptionCode::Padding => OptionData::Zeros(len as u8),
        _ => bytes(&b"nsid-keepalive-other"[..len]),
    }
}

/// Every (name, query) seed.
fn queries() -> Vec<(String, Query)> {
    let mut all: Vec<(String, Query)> = Vec::new();
    let mut add = |n: &str, q: Query| all.push((n.to_owned(), q));

    // The hand-written seeds of the raw target, as model values (the
    // generator checks they still give the same bytes).
    add("a", web());
    add("aaaa-edns", with_opt(query(name(&["api", "shop"], NameEnd::Services), Type::Aaaa), opt(vec![])));
    add("any", query(name(&["web", "shop"], NameEnd::Services), Type::Any));
    let mut apex = with_opt(query(name(&[], NameEnd::Apex), Type::Ns), opt(vec![]));
    if let Some(Additional::Opt(o)) = apex.additional.first_mut() {
        o.payload = Payload::P512;
    }
    add("apex-ns", apex);
    add("bare-srv", query(name(&["db", "shop"], NameEnd::Services), Type::Srv));
    add(
        "headless-host",
        query(
            Name {
                labels: vec![Label::Bytes(b"db-0".to_vec()), w("cluster-a"), w("db"), w("shop")],
                end: NameEnd::Services,
            },
            Type::A,
        ),
    );
    let mut notify = query(name(&[], NameEnd::Apex), Type::Soa);
    notify.opcode = Opcode::Other(4);
    add("notify", notify);
    add("nx", query(name(&["nope", "shop"], NameEnd::Services), Type::A));
    let mut pointer = query(Name { labels: vec![], end: NameEnd::Pointer(12) }, Type::A);
    (pointer.id, pointer.flags) = (1, 0);
    add("pointer", pointer);
    add("refused", query(name(&[], NameEnd::Outside), Type::A));
    let mut srv = with_opt(
        query(name(&["_postgres", "_tcp", "db", "shop"], NameEnd::Services), Type::Srv),
        opt(vec![]),
    );
    if let Some(Additional::Opt(o)) = srv.additional.first_mut() {
        o.payload = Payload::P4096;
    }
    add("srv", srv);

    // Every option code, data lengths 0..=20.
    let codes = [
        ("ecs", OptionCode::Subnet),
        ("cookie", OptionCode::Cookie),
        ("nsid", OptionCode::Nsid),
        ("padding", OptionCode::Padding),
        ("keepalive", OptionCode::Keepalive),
        ("unknown", OptionCode::Other(65001)),
    ];
    for (tag, code) in codes {
        for len in 0..=20 {
            add(
                &format!("edns-{tag}-len{len:02}"),
                with_opt(web(), opt(vec![option(code, data_of(code, len))])),
            );
        }
    }

    // Valid Client Subnets, and several options at once.
    let subnet = |family, source, address: &[u8]| {
        option(OptionCode::Subnet, OptionData::Subnet { family, source, scope: 0, address: address.to_vec() })
    };
    add("edns-ecs-v4-24", with_opt(web(), opt(vec![subnet(Family::V4, 24, &[198, 51, 100])])));
    add("edns-ecs-v6-56", with_opt(web(), opt(vec![subnet(Family::V6, 56, &[0x20, 1, 0xd, 0xb8, 0, 0, 1])])));
    add(
        "edns-many-options",
        with_opt(
            web(),
            opt(vec![
                subnet(Family::V4, 24, &[198, 51, 100]),
                option(OptionCode::Cookie, data_of(OptionCode::Cookie, 8)),
                option(OptionCode::Nsid, bytes(&[])),
                option(OptionCode::Keepalive, bytes(&[])),
                option(OptionCode::Padding, OptionData::Zeros(12)),
                subnet(Family::V4, 16, &[10, 1]),
            ]),
        ),
    );

    // The malformed shapes of tests/it/hostile.rs.
    add("hostile-ecs-3-bytes", with_opt(web(), opt(vec![option(OptionCode::Subnet, bytes(&[0, 1, 24]))])));
    let mut past = opt(vec![subnet(Family::V4, 24, &[198, 51, 100])]);
    past.rdlength = Some(200);
    add("hostile-opt-rdlength-past-end", with_opt(web(), past));
    let mut long = option(OptionCode::Subnet, bytes(&[]));
    long.length = Some(8);
    add("hostile-option-length-past-rdata", with_opt(web(), opt(vec![long])));
    let mut cut = with_opt(web(), Opt { rdlength: Some(3), ..opt(vec![]) });
    cut.trailing = vec![0, 8, 0];
    add("hostile-option-header-cut", cut);
    let mut fixed = web();
    fixed.counts[3] = Some(1);
    fixed.trailing = vec![0, 0, 41, 0x04, 0xd0, 0];
    add("hostile-opt-cut-in-fixed-part", fixed);
    add("hostile-ecs-family-3", with_opt(web(), opt(vec![subnet(Family::Other(3), 0, &[])])));
    add(
        "hostile-ecs-valid-then-family-0x2121",
        with_opt(
            web(),
            opt(vec![subnet(Family::V4, 24, &[198, 51, 100]), subnet(Family::Other(0x2121), 0, &[])]),
        ),
    );
    add("hostile-ecs-v4-33", with_opt(web(), opt(vec![subnet(Family::V4, 33, &[1, 2, 3, 4, 5])])));
    // Issue 40: the Client Subnet shapes RFC 7871 names (tests/it/hostile.rs,
    // `client_subnets_get_what_rfc_7871_says`).
    add("hostile-ecs-v6-129", with_opt(web(), opt(vec![subnet(Family::V6, 129, &[0x20; 17])])));
    add("hostile-ecs-v4-with-v6-address", with_opt(web(), opt(vec![subnet(Family::V4, 32, &[0x20; 16])])));
    add("hostile-ecs-family-0", with_opt(web(), opt(vec![subnet(Family::Other(0), 0, &[])])));
    let scoped = |family, source, scope, address: &[u8]| {
        option(OptionCode::Subnet, OptionData::Subnet { family, source, scope, address: address.to_vec() })
    };
    add("hostile-ecs-scope-in-query", with_opt(web(), opt(vec![scoped(Family::V4, 24, 24, &[198, 51, 100])])));
    add("hostile-ecs-source-0-scope-1", with_opt(web(), opt(vec![scoped(Family::V4, 0, 1, &[])])));
    add("edns-ecs-v4-0", with_opt(web(), opt(vec![subnet(Family::V4, 0, &[])])));
    add("edns-ecs-v6-0", with_opt(web(), opt(vec![subnet(Family::V6, 0, &[])])));
    add("edns-ecs-v6-24", with_opt(web(), opt(vec![subnet(Family::V6, 24, &[0x20, 1, 0xd])])));
    add(
        "hostile-label-past-end",
        query(Name { labels: vec![Label::Lying(63, b"web".to_vec())], end: NameEnd::Cut }, Type::A),
    );
    let mut no_qtype = web();
    no_qtype.counts[0] = Some(1);
    no_qtype.questions.clear();
    no_qtype.trailing = b"\x03web\x04shop\x03svc\x0aclusterset\x05local\x00\x00\x01".to_vec();
    add("hostile-qname-without-qtype", no_qtype);
    let a63 = Label::Bytes(vec![b'a'; 63]);
    add("hostile-qname-257-bytes", query(Name { labels: vec![a63; 4], end: NameEnd::Root }, Type::A));
    add("hostile-pointer-loop", query(Name { labels: vec![], end: NameEnd::Pointer(12) }, Type::A));
    add("hostile-pointer-past-end", query(Name { labels: vec![], end: NameEnd::Pointer(0xff) }, Type::A));
    let mut none = web();
    none.questions.clear();
    add("hostile-no-question", none);
    let mut two = web();
    two.counts[0] = Some(2);
    add("hostile-qdcount-2-one-question", two);
    let mut response = web();
    response.response = 0xFF;
    add("hostile-response", response);

    // Other shapes the RFCs give an answer for.
    let mut badvers = opt(vec![]);
    badvers.version = Version::Any(1);
    add("edns-badvers", with_opt(web(), badvers));
    add("edns-two-opts", with_opt(with_opt(web(), opt(vec![])), opt(vec![])));
    add(
        "edns-owner-not-root",
        with_opt(web(), Opt { owner: Some(name(&["web"], NameEnd::Root)), ..opt(vec![]) }),
    );
    add(
        "edns-do-small-payload",
        with_opt(web(), Opt { payload: Payload::Any(100), flags: 0x8000, ..opt(vec![]) }),
    );
    let mut upper =
        query(Name { labels: vec![Label::Upper(0), Label::Upper(7)], end: NameEnd::Services }, Type::Aaaa);
    upper.questions[0].qclass = Class::Ch;
    add("upper-case-chaos", upper);
    let mut two_questions = web();
    two_questions.questions.push(Question {
        name: name(&["api", "shop"], NameEnd::Services),
        qtype: Type::A,
        qclass: Class::In,
    });
    add("two-questions", two_questions);
    let mut with_answer = web();
    with_answer.answers.push(Record {
        name: name(&["web", "shop"], NameEnd::Services),
        rtype: Type::A,
        class: Class::In,
        ttl: 5,
        rdata: vec![10, 42, 0, 10],
        rdlength: None,
    });
    add("answer-section-in-query", with_answer);
    let mut garbage = web();
    garbage.trailing = vec![0xde, 0xad, 0xbe, 0xef];
    add("trailing-garbage", garbage);
    add("axfr", query(name(&[], NameEnd::Apex), Type::Axfr));
    all
}

/// Objects files: the embedded example, the unit tests' shapes, and the
/// documents the parser must refuse with a named document.
fn objects() -> Vec<(&'static str, String)> {
    let import = "apiVersion: multicluster.x-k8s.io/v1beta1\nkind: ServiceImport\nmetadata: {name: web, namespace: shop}\nspec: {type: ClusterSetIP, ips: [10.0.0.1], ports: [{name: http, protocol: TCP, port: 80}]}\n";
    let slice = "apiVersion: discovery.k8s.io/v1\nkind: EndpointSlice\naddressType: IPv4\nmetadata:\n  name: web-a\n  namespace: shop\n  labels: {multicluster.kubernetes.io/service-name: web, multicluster.kubernetes.io/source-cluster: cluster-a}\nendpoints:\n- addresses: [10.1.0.21]\n  hostname: web-0\n  conditions: {ready: true}\nports:\n- {name: http, port: 8080, protocol: TCP}\n";
    vec![
        ("shop.yaml", include_str!("../../zones/shop.yaml").to_owned()),
        ("infra.yaml", include_str!("../../zones/infra.yaml").to_owned()),
        ("import.yaml", import.to_owned()),
        ("slice.yaml", slice.to_owned()),
        ("list.yaml", format!("apiVersion: v1\nkind: List\nitems:\n- {}", import.trim_end().replace('\n', "\n  "))),
        (
            "import.json",
            r#"{"apiVersion":"multicluster.x-k8s.io/v1alpha1","kind":"ServiceImport","metadata":{"name":"web","namespace":"shop"},"spec":{"type":"Headless"}}"#.to_owned(),
        ),
        ("wrong-type.yaml", import.replace("port: 80", "port: eighty")),
        ("syntax-error.yaml", "kind: [unclosed".to_owned()),
        ("no-kind.yaml", "foo: bar\n".to_owned()),
        ("bad-ip.yaml", format!("{import}---\n{}", import.replace("10.0.0.1", "10.0.0.999"))),
        ("fqdn-slice.yaml", slice.replace("IPv4", "FQDN").replace("10.1.0.21", "web.example.com")),
        ("items-not-sequence.yaml", "apiVersion: v1\nkind: List\nitems: 3\n".to_owned()),
        ("other-kind.yaml", "apiVersion: v1\nkind: Service\nmetadata: {name: x}\n---\n".to_owned()),
        ("sequence-document.yaml", "[v1, List]\n".to_owned()),
        ("tagged-document.yaml", format!("!thing\n{import}")),
        ("anchors.yaml", "a: &x [*x]\n".to_owned()),
    ]
}

fn write(dir: &Path, file: &str, bytes: &[u8]) {
    std::fs::create_dir_all(dir).expect("seed directory");
    std::fs::write(dir.join(file), bytes).expect("seed file");
}

fn main() {
    let seeds = Path::new(env!("CARGO_MANIFEST_DIR")).join("seeds");
    let qs = queries();
    for (n, q) in &qs {
        let wire = q.wire();
        // The hand-written seeds must come out byte for byte.
        if let Ok(old) = std::fs::read(seeds.join("query").join(n)) {
            assert_eq!(old, wire, "seed {n} differs from the committed one");
        }
        write(&seeds.join("query"), n, &wire);
        let input = seed::bytes(q);
        write(&seeds.join("structured"), n, &input);
        write(&seeds.join("differential"), n, &input);
    }
    let texts = objects();
    for (n, text) in &texts {
        write(&seeds.join("objects"), n, text.as_bytes());
    }
    println!("{} queries, {} objects files", qs.len(), texts.len());
}
