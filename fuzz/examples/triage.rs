//! Shows what a fuzz input is, for triage: `cargo run --example triage --
//! <target> <file>`. For the query targets it prints the model value (for
//! `structured` and `differential`), the wire bytes, hickory-proto's reading
//! of the query, and our responses over UDP and TCP; for `objects`, the
//! text and what the parser made of it.

use arbitrary::{Arbitrary, Unstructured};
use clusterset_dns::source::objects;
use clusterset_dns_fuzz::query::Query;
use clusterset_dns_fuzz::server::answer_both;
use hickory_proto::op::Message;

fn hex(b: &[u8]) -> String {
    b.iter().map(|x| format!("{x:02x}")).collect()
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let [_, target, file] = args.as_slice() else {
        eprintln!("usage: triage <query|structured|differential|objects> <file>");
        std::process::exit(2);
    };
    let data = std::fs::read(file).expect("input file");
    if target == "objects" {
        let text = String::from_utf8_lossy(&data);
        println!("text: {text:?}");
        match objects::parse(&text, "fuzz.yaml") {
            Ok(p) => {
                println!("ok: {} objects, skipped {:?}, ignored {:?}", p.objects.len(), p.skipped, p.ignored)
            }
            Err(e) => println!("error: {e}\n{e:?}"),
        }
        return;
    }
    let packet = if target == "query" {
        data
    } else {
        let q = Query::arbitrary_take_rest(Unstructured::new(&data)).expect("a model value");
        println!("model: {q:#?}");
        q.wire()
    };
    println!("wire: {}", hex(&packet));
    match Message::from_vec(&packet) {
        Ok(m) => println!("hickory reads:\n{m}\nedns: {:?}", m.edns),
        Err(e) => println!("hickory rejects: {e}"),
    }
    for a in answer_both(&packet) {
        match a.response {
            None => println!("{:?}: no response", a.transport),
            Some(out) => {
                println!("{:?}: {} bytes {}", a.transport, out.len(), hex(&out));
                match Message::from_vec(&out) {
                    Ok(m) => println!("{m}"),
                    Err(e) => println!("does not decode: {e}"),
                }
            }
        }
    }
}
