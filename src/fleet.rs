//! The fleet: what each member cluster exports, and the one ServiceImport
//! KEP-1645's rules derive from it. Pure code shared by centralized `serve`
//! (answers straight from the members' exports) and `sync` (writes the
//! merged import into every member).
//!
//! - `export`: one cluster's export of a service (ServiceExport + Service).
//! - `merge`: conflict resolution and the ServiceExport conditions.
//! - `inventory`: members from ClusterProfiles (`sync --cluster-profiles`).
//! - `objects`: a member's Service, ServiceExport and EndpointSlices → the above.

pub mod export;
pub mod inventory;
pub mod member;
pub mod merge;
pub mod objects;
pub mod state;
