//! The Leases' API behind a trait ([`LeaseApi`]), so the election is
//! tested in process (`fake`), and on a real API server ([`KubeLeases`]).

use std::time::Duration;

use futures::future::BoxFuture;
use k8s_openapi::api::coordination::v1::Lease;
use kube::api::{Api, DeleteParams, ListParams, PostParams, Preconditions};

/// A call to the Leases' API server that failed.
#[derive(Debug, thiserror::Error)]
pub enum CallError {
    /// Someone else wrote the Lease since it was read (409).
    #[error("changed since read")]
    Conflict,
    /// Not answered within the call deadline.
    #[error("not answered within {0:?}")]
    Timeout(Duration),
    /// The API server refused or could not be reached.
    #[error("{0}")]
    Api(String),
}

/// The Leases' API, behind a trait so the election is tested in process.
pub trait LeaseApi: Send + Sync {
    /// Every Lease labelled with `selector`.
    fn list<'a>(&'a self, selector: &'a str) -> BoxFuture<'a, Result<Vec<Lease>, CallError>>;
    /// Creates `lease`.
    fn create<'a>(&'a self, lease: &'a Lease) -> BoxFuture<'a, Result<Lease, CallError>>;
    /// Replaces `lease` if its resourceVersion is still the stored one.
    fn replace<'a>(&'a self, lease: &'a Lease) -> BoxFuture<'a, Result<Lease, CallError>>;
    /// Deletes `name` if its resourceVersion is still `version`.
    fn delete<'a>(&'a self, name: &'a str, version: &'a str) -> BoxFuture<'a, Result<(), CallError>>;
}

/// [`LeaseApi`] on a real API server.
pub struct KubeLeases(Api<Lease>);

impl KubeLeases {
    /// The Leases of `namespace`.
    pub fn new(client: kube::Client, namespace: &str) -> Self {
        Self(Api::namespaced(client, namespace))
    }
}

fn call_error(e: kube::Error) -> CallError {
    match e {
        kube::Error::Api(s) if s.code == 409 => CallError::Conflict,
        e => CallError::Api(e.to_string()),
    }
}

impl LeaseApi for KubeLeases {
    fn list<'a>(&'a self, selector: &'a str) -> BoxFuture<'a, Result<Vec<Lease>, CallError>> {
        Box::pin(async move {
            Ok(self.0.list(&ListParams::default().labels(selector)).await.map_err(call_error)?.items)
        })
    }

    fn create<'a>(&'a self, lease: &'a Lease) -> BoxFuture<'a, Result<Lease, CallError>> {
        Box::pin(async move { self.0.create(&PostParams::default(), lease).await.map_err(call_error) })
    }

    fn replace<'a>(&'a self, lease: &'a Lease) -> BoxFuture<'a, Result<Lease, CallError>> {
        Box::pin(async move {
            let name = lease.metadata.name.as_deref().unwrap_or_default();
            self.0.replace(name, &PostParams::default(), lease).await.map_err(call_error)
        })
    }

    fn delete<'a>(&'a self, name: &'a str, version: &'a str) -> BoxFuture<'a, Result<(), CallError>> {
        Box::pin(async move {
            let params = DeleteParams {
                preconditions: Some(Preconditions { resource_version: Some(version.to_owned()), uid: None }),
                ..DeleteParams::default()
            };
            self.0.delete(name, &params).await.map(|_| ()).map_err(call_error)
        })
    }
}
