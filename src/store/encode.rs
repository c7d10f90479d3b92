//! Pre-encoding: hickory-proto writes every record; this module only places
//! each one behind a question for its owner so that compression points into
//! the question (see `snapshot` module docs).

use hickory_proto::op::Query;
use hickory_proto::rr::rdata::TXT;
use hickory_proto::rr::{DNSClass, Name, RData, Record, RecordType};
use hickory_proto::serialize::binary::{BinEncodable, BinEncoder, NameEncoding};

use super::records::Records;

/// Length of the DNS header in front of the question.
const HEADER_LEN: usize = 12;

/// Encodes `records` as answers to the question `owner`/`qtype`, each
/// independent of the others. Returns `None` when hickory-proto refuses one
/// (a name over 255 bytes, which validation upstream should have prevented).
pub(crate) fn records(owner: &Name, qtype: RecordType, records: &[Record]) -> Option<Records> {
    let mut bytes = Vec::new();
    let mut ends = Vec::with_capacity(records.len());
    let mut scratch = Vec::with_capacity(512);
    let question = Query::query(owner.clone(), qtype);
    // One encoder (and one written question, whose labels each cost the
    // encoder an allocation) per batch of records rather than per record.
    // hickory compresses only the first 120 names an encoder writes (a
    // guard against costly messages): a batch writes at most 3 names per
    // record (an SOA's three), so 32 records stay well inside it.
    for batch in records.chunks(32) {
        scratch.clear();
        let mut enc = BinEncoder::new(&mut scratch);
        enc.emit_vec(&[0; HEADER_LEN]).ok()?;
        question.emit(&mut enc).ok()?;
        let start = enc.offset();
        for record in batch {
            // Back to just after the question: `trim` also forgets the
            // compression pointers into the previous record, so each record
            // is written against the question alone, as the read path
            // sends it.
            enc.set_offset(start);
            enc.trim();
            record.emit(&mut enc).ok()?;
            if enc.offset() <= start {
                return None; // a record is at least 11 bytes; `slice_of` asserts this
            }
            bytes.extend_from_slice(enc.slice_of(start, enc.offset()));
            ends.push(u32::try_from(bytes.len()).ok()?);
        }
    }
    Some(Records::new(&bytes, &ends))
}

/// Encodes a record from its TYPE field on, with every name in it written in
/// full: used for the negative-answer SOA, whose owner pointer depends on
/// where the apex sits in each query.
pub(crate) fn without_owner(record: &Record) -> Option<Box<[u8]>> {
    let mut buf = Vec::with_capacity(128);
    let mut enc = BinEncoder::new(&mut buf);
    enc.set_name_encoding(NameEncoding::Uncompressed);
    record.emit(&mut enc).ok()?;
    let owner_len = wire_len(&record.name);
    Some(buf[owner_len..].into())
}

/// Length of an uncompressed name in wire format: each label with its length
/// byte, then the root label.
pub(crate) fn wire_len(name: &Name) -> usize {
    name.iter().map(|l| l.len() + 1).sum::<usize>() + 1
}

/// A CHAOS-class TXT record (RFC 4892) holding `text`, TTL 0, encoded as an
/// answer to a question for its own name: its owner is `C0 0C`, so the same
/// bytes answer any of the names that ask for it. Text over 255 bytes is
/// cut (one character-string).
pub(crate) fn chaos_txt(text: &str) -> Records {
    let owner = Name::from_ascii("id.server.").unwrap_or_default();
    chaos_txt_lines(&owner, &[text.to_owned()])
}

/// One CHAOS TXT record per line, for `owner`.
pub(crate) fn chaos_txt_lines(owner: &Name, lines: &[String]) -> Records {
    let txt: Vec<Record> = lines
        .iter()
        .map(|line| {
            let cut = line.char_indices().take_while(|(i, c)| i + c.len_utf8() <= 255).map(|(_, c)| c);
            let mut record = Record::from_rdata(owner.clone(), 0, RData::TXT(TXT::new(vec![cut.collect()])));
            record.dns_class = DNSClass::CH;
            record
        })
        .collect();
    records(owner, RecordType::TXT, &txt).unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use std::str::FromStr;

    use hickory_proto::rr::RData;
    use hickory_proto::rr::rdata::{A, SRV};

    use super::*;

    #[test]
    fn owner_is_a_pointer_to_the_question() {
        let owner = Name::from_str("web.shop.svc.clusterset.local.").unwrap();
        let rec = Record::from_rdata(owner.clone(), 5, RData::A(A::new(10, 0, 0, 1)));
        let r = records(&owner, RecordType::A, &[rec.clone(), rec]).unwrap();
        assert_eq!(r.len(), 2);
        assert_eq!(r.get(0), &[0xC0, 0x0C, 0, 1, 0, 1, 0, 0, 0, 5, 0, 4, 10, 0, 0, 1]);
        assert_eq!(r.get(0), r.get(1));
    }

    #[test]
    fn each_record_is_compressed_against_the_question_only() {
        // The read path sends any subset of the records in any order, so a
        // pointer into an earlier record would point at whatever is there.
        let question = Name::from_str("web.shop.svc.clusterset.local.").unwrap();
        let owner = Name::from_str("a.web.shop.svc.clusterset.local.").unwrap();
        let rec = |o: u8| Record::from_rdata(owner.clone(), 5, RData::A(A::new(10, 0, 0, o)));
        let r = records(&question, RecordType::SRV, &[rec(1), rec(2), rec(3)]).unwrap();
        for (i, o) in [1u8, 2, 3].into_iter().enumerate() {
            assert_eq!(r.get(i), &[1, b'a', 0xC0, 0x0C, 0, 1, 0, 1, 0, 0, 0, 5, 0, 4, 10, 0, 0, o]);
        }
    }

    #[test]
    fn hundreds_of_records_are_all_compressed() {
        // hickory stops compressing after an encoder's 120th name.
        let owner = Name::from_str("big.ns1.svc.clusterset.local.").unwrap();
        let rec = |i: u16| {
            Record::from_rdata(owner.clone(), 5, RData::A(A::from(std::net::Ipv4Addr::from(u32::from(i)))))
        };
        let all: Vec<Record> = (0..300).map(rec).collect();
        let r = records(&owner, RecordType::A, &all).unwrap();
        assert_eq!(r.len(), 300);
        for i in 0..300 {
            assert_eq!(r.get(i).len(), 16, "record {i}: owner a pointer");
            assert_eq!(&r.get(i)[..2], &[0xC0, 0x0C]);
        }
    }

    #[test]
    fn srv_targets_are_written_in_full() {
        // RFC 2782: "name compression is not to be used for this field".
        let owner = Name::from_str("_http._tcp.web.shop.svc.clusterset.local.").unwrap();
        let target = Name::from_str("web.shop.svc.clusterset.local.").unwrap();
        let rec = Record::from_rdata(owner.clone(), 5, RData::SRV(SRV::new(0, 100, 80, target.clone())));
        let r = records(&owner, RecordType::SRV, &[rec]).unwrap();
        assert_eq!(r.get(0).len(), 2 + 10 + 6 + wire_len(&target));
    }

    #[test]
    fn owner_less_encoding_drops_exactly_the_owner() {
        let owner = Name::from_str("clusterset.local.").unwrap();
        let rec = Record::from_rdata(owner, 5, RData::A(A::new(10, 0, 0, 1)));
        assert_eq!(&*without_owner(&rec).unwrap(), &[0, 1, 0, 1, 0, 0, 0, 5, 0, 4, 10, 0, 0, 1]);
    }
}
