//! `clusterset-dns doctor`: one service diagnosed across the members, read
//! only. What each member holds for it is read with list requests
//! (`read`), each member's DNS is asked (`dns`), and a pure function of
//! those observations (`checks`) says what is inconsistent and what to do;
//! `report` renders both for people or scripts.
//!
//! It judges the members' objects by the rules the sync controller writes
//! them by (`fleet::merge` for the import, `controller::desired` for the
//! internal names), so a verdict names the same winner and the same
//! conflict the controller would.
//!
//! - `observed`: what was seen, per member (plain values, no API types).
//! - `read`: one member's objects of one service (list requests only).
//! - `dns`: one member's DNS answers for the name (hickory's client).
//! - `checks`: observations → verdicts (pure).
//! - `report`: text and JSON.

pub mod checks;
pub mod dns;
pub mod observed;
pub mod read;
pub mod report;
