//! Members from the cluster inventory (`sync --cluster-profiles NS`): the
//! ClusterProfiles of one namespace of a hub cluster, watched, each turned
//! into a member (`k8s::inventory::access`: its cluster, the exec plugin of
//! the provider file). [`follow`] publishes the whole set whenever a member
//! joins, leaves, changes how it is reached or its `ControlPlaneHealthy`;
//! [`join`] connects the members of each set (and marks them for the last)
//! and publishes the connected ones, on which `cmd::sync` restarts its
//! controller. Joining runs in a task of its own: a member that takes its
//! whole connect timeout to answer delays nothing else.

use std::collections::BTreeMap;
use std::sync::Arc;

use kube::Client;
use kube::api::{Api, DynamicObject};
use kube::runtime::watcher;
use tokio::sync::{mpsc, watch};
use tracing::{info, warn};

use super::member::{CONNECT_TIMEOUT, Member, MemberConfig, connect};
use crate::k8s::client::Connection;
use crate::k8s::inventory::{self, Health, ProfileError, Providers};
use crate::k8s::throttle::Limits;
use crate::k8s::watch::{Lists, Reporter, Translate, WatchHealth, relist};

/// Where the profiles are and how their members are reached.
#[derive(Debug, Clone)]
pub struct InventoryConfig {
    /// The hub cluster holding the profiles (`--hub-kubeconfig`).
    pub hub: Connection,
    /// Their namespace (`--cluster-profiles`), labelled
    /// `multicluster.x-k8s.io/clusterset` by the fleet manager.
    pub namespace: String,
    /// The access providers (`--cluster-profile-providers`).
    pub providers: Providers,
}

/// A member as its profile gives it.
#[derive(Debug, Clone)]
pub struct ProfileMember {
    /// Its name (the profile's) and how to reach it.
    pub config: MemberConfig,
    /// The provider used.
    pub provider: String,
    /// The fleet manager's word on its control plane.
    pub health: Health,
    /// The kubeconfig as JSON: equal when the member is reached the same
    /// way (it holds no secret: credentials come from the plugin).
    access: String,
}

impl ProfileMember {
    /// Whether `other` reaches the member the same way (same server, CA,
    /// plugin): a change of anything else needs no new client.
    pub fn same_access(&self, other: &Self) -> bool {
        self.access == other.access
    }
}

impl PartialEq for ProfileMember {
    fn eq(&self, other: &Self) -> bool {
        self.config.name == other.config.name && self.access == other.access && self.health == other.health
    }
}

/// The members of the inventory, by name.
pub type Inventory = BTreeMap<String, ProfileMember>;

/// Profile `object` of `namespace` as a member, or why it is none.
pub fn member_of(
    namespace: &str,
    object: &DynamicObject,
    providers: &Providers,
) -> Option<(String, Result<ProfileMember, ProfileError>)> {
    let name = object.metadata.name.clone()?;
    let member = inventory::status_of(object)
        .and_then(|status| inventory::access(&name, &status, providers))
        .map(|access| ProfileMember {
            access: serde_json::to_string(&access.kubeconfig).unwrap_or_default(),
            config: MemberConfig {
                name: name.clone(),
                connection: Connection::Inline {
                    origin: format!("ClusterProfile {namespace}/{name}"),
                    kubeconfig: Box::new(access.kubeconfig),
                },
            },
            provider: access.provider,
            health: access.health,
        });
    Some((name, member))
}

/// What the profile watch sends.
enum Event {
    Listed(Vec<Entry>),
    Applied(Entry),
    Deleted(String),
}

type Entry = (String, Result<ProfileMember, ProfileError>);

struct Profiles {
    namespace: String,
    providers: Providers,
}

impl Translate<DynamicObject> for Profiles {
    type Item = Entry;
    type Message = Event;

    fn item(&self, o: &DynamicObject) -> Option<Entry> {
        member_of(&self.namespace, o, &self.providers)
    }

    fn listed(&self, items: Vec<Entry>, _: std::time::Instant) -> Event {
        Event::Listed(items)
    }

    fn applied(&self, o: &DynamicObject) -> Option<Event> {
        self.item(o).map(Event::Applied)
    }

    fn deleted(&self, o: &DynamicObject) -> Option<Event> {
        o.metadata.name.clone().map(Event::Deleted)
    }
}

/// Watches the profiles of `cfg` through `client` and publishes the
/// inventory on `out` (`None` until the first complete list) whenever it
/// changes. A profile that gives no member is skipped with a warning naming
/// it and why, once per distinct reason; the others are not held up. Never
/// returns (unless `out` has no receiver left).
pub async fn follow(
    cfg: InventoryConfig,
    client: Client,
    health: Arc<WatchHealth>,
    out: watch::Sender<Option<Inventory>>,
) {
    let (tx, mut rx) = mpsc::channel(64);
    let api: Api<DynamicObject> =
        Api::namespaced_with(client, &cfg.namespace, &inventory::profile_resource());
    let translate = Profiles { namespace: cfg.namespace.clone(), providers: cfg.providers.clone() };
    let lists = Lists::default();
    let watching = relist(api, watcher::Config::default(), &lists, Reporter::new(health), translate, tx);
    let keeping = async {
        let mut known: BTreeMap<String, Result<ProfileMember, ProfileError>> = BTreeMap::new();
        while let Some(event) = rx.recv().await {
            let before = known.clone();
            match event {
                Event::Listed(all) => known = all.into_iter().collect(),
                Event::Applied((name, m)) => {
                    known.insert(name, m);
                }
                Event::Deleted(name) => {
                    known.remove(&name);
                }
            }
            report(&cfg.namespace, &before, &known);
            let now: Inventory =
                known.iter().filter_map(|(n, m)| Some((n.clone(), m.as_ref().ok()?.clone()))).collect();
            let changed = out.send_if_modified(|current| {
                let differs = current.as_ref() != Some(&now);
                if differs {
                    *current = Some(now);
                }
                differs
            });
            if changed && out.is_closed() {
                return;
            }
        }
    };
    tokio::join!(watching, keeping);
}

/// Logs what changed between two views of the profiles: a profile skipped
/// (or skipped for a new reason), usable again, joined or gone.
fn report(
    namespace: &str,
    before: &BTreeMap<String, Result<ProfileMember, ProfileError>>,
    now: &BTreeMap<String, Result<ProfileMember, ProfileError>>,
) {
    for (name, m) in now {
        let profile = format!("{namespace}/{name}");
        match (before.get(name), m) {
            (Some(Err(was)), Err(e)) if was == e => {}
            (_, Err(e)) => warn!(profile, reason = %e, "ClusterProfile skipped: no member from it"),
            (Some(Ok(_)), Ok(_)) => {}
            (_, Ok(m)) => info!(profile, provider = %m.provider, "ClusterProfile: member"),
        }
    }
    for name in before.keys().filter(|n| !now.contains_key(*n)) {
        info!(profile = format!("{namespace}/{name}"), "ClusterProfile deleted: member leaves");
    }
}

/// Follows the profiles of `cfg` (as [`follow`]) and connects their
/// members ([`Joined::update`], skipping names in `taken`), publishing the
/// connected members on `out` (`None` until the first list has been joined)
/// whenever they change. Never returns (unless `out` has no receiver left).
pub async fn join(
    cfg: InventoryConfig,
    client: Client,
    health: Arc<WatchHealth>,
    how: JoinAs,
    out: watch::Sender<Option<Vec<Member>>>,
) {
    let (tx, mut profiles) = watch::channel(None);
    let following = follow(cfg, client, health, tx);
    let joining = async {
        let mut joined = Joined::default();
        while profiles.changed().await.is_ok() {
            let Some(now) = profiles.borrow_and_update().clone() else { continue };
            let changed = joined.update(&now, &how.taken, &how.agent, &how.namespaces, how.limits).await;
            if changed || out.borrow().is_none() {
                out.send_replace(Some(joined.members().cloned().collect()));
            }
            if out.is_closed() {
                return;
            }
        }
    };
    tokio::select! {
        () = following => {}
        () = joining => {}
    }
}

/// How [`join`] connects members.
#[derive(Debug, Clone)]
pub struct JoinAs {
    /// Names of members configured otherwise (`--cluster`): a profile of one
    /// of these names is skipped.
    pub taken: Vec<String>,
    /// The User-Agent's agent part.
    pub agent: String,
    /// The namespaces watched.
    pub namespaces: Vec<String>,
    /// The members' client rate limit.
    pub limits: Option<Limits>,
}

/// The members of the inventory that are connected, each with the mark of
/// its profile's `ControlPlaneHealthy`.
#[derive(Default)]
pub struct Joined {
    members: BTreeMap<String, JoinedMember>,
}

struct JoinedMember {
    profile: ProfileMember,
    member: Member,
    /// Reports the profile's `ControlPlaneHealthy` into `member.inventory`.
    mark: Reporter,
}

impl Joined {
    /// The connected members, by name.
    pub fn members(&self) -> impl Iterator<Item = &Member> {
        self.members.values().map(|j| &j.member)
    }

    /// Brings the members to `inventory`: connects those that joined or are
    /// now reached another way (all at once, each waiting for its cluster id
    /// at most [`CONNECT_TIMEOUT`]), drops those gone, and marks every one
    /// as its profile's `ControlPlaneHealthy` says, which needs no restart:
    /// the controller reads the mark through the member's staleness.
    /// Returns whether the members changed (the controller must restart).
    /// A profile named like a member of `taken` (`--cluster`), or whose
    /// member cannot be connected, is skipped with a warning.
    pub async fn update(
        &mut self,
        inventory: &Inventory,
        taken: &[String],
        agent: &str,
        namespaces: &[String],
        limits: Option<Limits>,
    ) -> bool {
        let before = self.members.len();
        self.members.retain(|name, j| inventory.get(name).is_some_and(|p| p.same_access(&j.profile)));
        let mut changed = self.members.len() != before;
        let new: Vec<&ProfileMember> = inventory
            .iter()
            .filter(|(name, _)| !self.members.contains_key(*name))
            .filter(|(name, _)| {
                let clash = taken.contains(name);
                if clash {
                    warn!(profile = %name, "ClusterProfile skipped: a --cluster member has its name");
                }
                !clash
            })
            .map(|(_, p)| p)
            .collect();
        let connects = new.iter().map(|p| connect(&p.config, agent, CONNECT_TIMEOUT, namespaces, limits));
        for (p, connected) in new.iter().zip(futures::future::join_all(connects).await) {
            match connected {
                Ok(member) => {
                    let mark = Reporter::new(member.inventory.clone());
                    let profile = (*p).clone();
                    self.members.insert(p.config.name.clone(), JoinedMember { profile, member, mark });
                    changed = true;
                }
                Err(e) => {
                    warn!(profile = %p.config.name, error = %e, "ClusterProfile skipped: cannot connect its member")
                }
            }
        }
        for (name, j) in &mut self.members {
            let Some(p) = inventory.get(name) else { continue };
            match &p.health {
                Health::Unhealthy(why) => {
                    if j.profile.health != p.health || j.member.inventory.stale_seconds() == 0.0 {
                        warn!(member = %name, reason = %why, "marked unreachable by its ClusterProfile");
                    }
                    j.mark.failed(why);
                }
                Health::NotUnhealthy => j.mark.ok(),
            }
            j.profile.health = p.health.clone();
        }
        changed
    }
}
