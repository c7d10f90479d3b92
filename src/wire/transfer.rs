//! Zone transfer over TCP (RFC 5936): every record of one snapshot, in as
//! many messages as it takes, the apex SOA first and last. IXFR is answered
//! the same way: RFC 1995 §4 lets a server send the whole zone instead of
//! increments, and this server keeps no history to take them from.
//!
//! Who may ask, and what UDP gets, is decided in [`super::respond_from`];
//! the TCP connection then streams the messages from here, one at a time,
//! so a large zone never sits in memory as bytes.

use std::collections::VecDeque;
use std::sync::Arc;

use hickory_proto::op::{Edns, Message, OpCode, Query};
use hickory_proto::rr::Record;
use hickory_proto::serialize::binary::{BinEncodable, BinEncoder, NameEncoding};

use crate::store::{Snapshot, ZoneWalk};

/// Most bytes of records in one message, counted uncompressed (each
/// message is then smaller, compressed by hickory-proto): well under the
/// 65,535 a TCP message can hold, with room for header and question.
const BUDGET: usize = 60_000;

/// One transfer in progress.
pub struct Transfer {
    walk: ZoneWalk,
    id: u16,
    query: Query,
    edns: Option<Edns>,
    soa: Record,
    pending: VecDeque<Record>,
    group: Vec<Record>,
    state: State,
    scratch: Vec<u8>,
    /// Records and messages written so far.
    pub records: usize,
    /// Messages written so far.
    pub messages: usize,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum State {
    /// Nothing written yet: the first message carries the question and the SOA.
    Start,
    /// Listing the zone's names.
    Names,
    /// Every name listed and the closing SOA queued.
    Closing,
    /// The closing SOA was written.
    Done,
}

impl Transfer {
    /// A transfer of `snap` answering `query` (the AXFR or IXFR message as
    /// received); each message carries an OPT offering `payload` when the
    /// query had one (RFC 6891 §7). `None` when the query cannot be read
    /// back or the zone has no SOA, neither of which a query that got this
    /// far should cause.
    /// The transfer lists what `peer`'s queries would find: services
    /// restricted to consumer clusters only to their clients.
    pub fn new(snap: Arc<Snapshot>, query: &[u8], payload: u16, peer: std::net::IpAddr) -> Option<Self> {
        let msg = Message::from_vec(query).ok()?;
        let edns = msg.edns.as_ref().map(|_| {
            let mut e = Edns::new();
            e.set_max_payload(payload.max(512));
            e
        });
        let question = msg.queries.first()?.clone();
        let cluster = snap.zone().localities.client_at(peer).cluster;
        let walk = ZoneWalk::new(snap, cluster);
        let soa = walk.soa()?;
        Some(Self {
            walk,
            id: msg.metadata.id,
            query: question,
            edns,
            soa,
            pending: VecDeque::new(),
            group: Vec::new(),
            state: State::Start,
            scratch: Vec::with_capacity(512),
            records: 0,
            messages: 0,
        })
    }

    /// The serial of the snapshot being transferred.
    pub fn serial(&self) -> u32 {
        self.walk.snapshot().serial()
    }

    /// Writes the next message into `out` (cleared first); false, with
    /// `out` empty, once the message with the closing SOA has been written.
    /// Fails only if hickory-proto cannot write a record it read.
    pub fn next_message(&mut self, out: &mut Vec<u8>) -> std::io::Result<bool> {
        out.clear();
        if self.state == State::Done {
            return Ok(false);
        }
        let mut msg = Message::response(self.id, OpCode::Query);
        msg.metadata.authoritative = true;
        let mut size = 12;
        if let Some(e) = &self.edns {
            msg.set_edns(e.clone());
            size += 11;
        }
        if self.state == State::Start {
            // RFC 5936 §2.2.1: the question in the first message only.
            msg.add_query(self.query.clone());
            size += self.query.name().len() + 6;
            self.pending.push_back(self.soa.clone());
            self.state = State::Names;
        }
        loop {
            if self.pending.is_empty() {
                match self.state {
                    State::Names => {
                        self.group.clear();
                        if self.walk.next_group(&mut self.group) {
                            self.pending.extend(self.group.drain(..));
                        } else {
                            self.pending.push_back(self.soa.clone());
                            self.state = State::Closing;
                        }
                        continue;
                    }
                    _ => {
                        self.state = State::Done;
                        break;
                    }
                }
            }
            let Some(next) = self.pending.front() else { continue };
            let len = uncompressed_len(next, &mut self.scratch);
            if size + len > BUDGET && !msg.answers.is_empty() {
                break;
            }
            size += len;
            if let Some(record) = self.pending.pop_front() {
                msg.add_answer(record);
            }
        }
        self.records += msg.answers.len();
        self.messages += 1;
        out.extend_from_slice(&msg.to_vec().map_err(std::io::Error::other)?);
        Ok(true)
    }
}

/// The record's size with every name written in full: an upper bound of
/// what it takes in a compressed message.
fn uncompressed_len(record: &Record, scratch: &mut Vec<u8>) -> usize {
    scratch.clear();
    let mut enc = BinEncoder::new(scratch);
    enc.set_name_encoding(NameEncoding::Uncompressed);
    match record.emit(&mut enc) {
        Ok(()) => scratch.len(),
        Err(_) => BUDGET, // alone in its message, where hickory-proto says why
    }
}
