//! Leases in memory, with resourceVersions as an API server keeps them,
//! and the faults a real one has: writes refused or never answered,
//! lists answered late, Leases edited or deleted by hand.

use std::sync::Mutex;

use super::*;

/// The fake.
#[derive(Default)]
pub struct FakeLeases {
    stored: Mutex<(u64, HashMap<String, Lease>)>,
    /// Leases whose writes are refused (as by an admission webhook, or
    /// RBAC on one name).
    pub refused: Mutex<Vec<String>>,
    /// Leases whose writes are never answered (and not stored).
    pub hung: Mutex<Vec<String>>,
    /// How long a list takes; its items are read when it answers.
    pub list_delay: Mutex<Duration>,
    /// With one, each list takes a time of its own, up to `list_delay`.
    pub list_jitter: Mutex<Option<fastrand::Rng>>,
}

impl FakeLeases {
    fn has(list: &Mutex<Vec<String>>, lease: &Lease) -> bool {
        list.lock().unwrap().iter().any(|r| r == name(lease))
    }

    /// The stored Lease `name`.
    pub fn get(&self, name: &str) -> Option<Lease> {
        self.stored.lock().unwrap().1.get(name).cloned()
    }

    /// Who holds `name`.
    pub fn holder(&self, name: &str) -> String {
        self.get(name).map(|l| super::holder(&l).to_owned()).unwrap_or_default()
    }

    /// Edits `name` by hand (a new resourceVersion, as `kubectl edit`).
    pub fn edit(&self, name: &str, f: impl FnOnce(&mut Lease)) {
        let mut s = self.stored.lock().unwrap();
        s.0 += 1;
        let v = s.0.to_string();
        let l = s.1.get_mut(name).unwrap();
        f(l);
        l.metadata.resource_version = Some(v);
    }

    /// Deletes `name` by hand.
    pub fn remove(&self, name: &str) {
        self.stored.lock().unwrap().1.remove(name);
    }

    fn store(&self, lease: &Lease, create: bool) -> Result<Lease, CallError> {
        let mut s = self.stored.lock().unwrap();
        let fits = match s.1.get(name(lease)) {
            None => create,
            Some(old) => !create && old.metadata.resource_version == lease.metadata.resource_version,
        };
        if !fits {
            return Err(CallError::Conflict);
        }
        s.0 += 1;
        let mut l = lease.clone();
        l.metadata.resource_version = Some(s.0.to_string());
        s.1.insert(name(lease).to_owned(), l.clone());
        Ok(l)
    }

    fn write<'a>(&'a self, lease: &'a Lease, create: bool) -> BoxFuture<'a, Result<Lease, CallError>> {
        Box::pin(async move {
            if Self::has(&self.hung, lease) {
                return std::future::pending().await;
            }
            if Self::has(&self.refused, lease) {
                return Err(CallError::Api("refused".into()));
            }
            self.store(lease, create)
        })
    }
}

impl LeaseApi for FakeLeases {
    fn list<'a>(&'a self, selector: &'a str) -> BoxFuture<'a, Result<Vec<Lease>, CallError>> {
        Box::pin(async move {
            let mut delay = *self.list_delay.lock().unwrap();
            if let Some(rng) = self.list_jitter.lock().unwrap().as_mut() {
                delay = delay.mul_f64(rng.f64());
            }
            tokio::time::sleep(delay).await;
            let (k, v) = selector.split_once('=').unwrap();
            Ok(self
                .stored
                .lock()
                .unwrap()
                .1
                .values()
                .filter(|l| l.metadata.labels.as_ref().and_then(|m| m.get(k)).is_some_and(|x| x == v))
                .cloned()
                .collect())
        })
    }

    fn create<'a>(&'a self, lease: &'a Lease) -> BoxFuture<'a, Result<Lease, CallError>> {
        self.write(lease, true)
    }

    fn replace<'a>(&'a self, lease: &'a Lease) -> BoxFuture<'a, Result<Lease, CallError>> {
        self.write(lease, false)
    }

    fn delete<'a>(&'a self, lease: &'a str, version: &'a str) -> BoxFuture<'a, Result<(), CallError>> {
        let mut s = self.stored.lock().unwrap();
        let r = match s.1.get(lease) {
            Some(old) if old.metadata.resource_version.as_deref() == Some(version) => {
                s.1.remove(lease);
                Ok(())
            }
            _ => Err(CallError::Conflict),
        };
        Box::pin(async move { r })
    }
}
