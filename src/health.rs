//! Health that does not come from the objects: active probes of endpoints
//! (`probe`). Cluster liveness of centralized members lives beside their
//! watches (`source::centralized::liveness`); the sync controller's verdict on
//! members arrives as an annotation on each ServiceImport.
//!
//! Both only produce `store::Update`s (`EndpointHealth`,
//! `ClusterLiveness`); the writer turns them into a new health overlay of
//! the services concerned without re-encoding a record.

pub mod probe;
