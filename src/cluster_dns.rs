//! Wiring a cluster's own DNS to clusterset-dns (`clusterset-dns setup-dns`):
//! find how the cluster's DNS is configured, plan the smallest change that
//! forwards the clusterset zone to us, write it idempotently (a marked block
//! or a key of our own, taken out again with `--remove`), and prove it by
//! resolving `dns-version.<zone>` through the cluster's DNS Service.
//!
//! - `plan`: pure. What was found (`Observed`) → the layout and the edits,
//!   each shown as a diff before anything is written.
//! - `kube`: reads what `plan` needs and writes its edits (optimistic
//!   concurrency: a ConfigMap changed meanwhile is not overwritten).
//! - `verify`: the proof query.
//! - `repair`: `--watch`'s decision for one check (write, report, back
//!   off), pure.

pub mod kube;
pub mod plan;
pub mod repair;
pub mod verify;
