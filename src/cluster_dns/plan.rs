//! Which DNS layout a cluster has and what to change in it: a pure
//! function from what was read to the edits, so every layout is unit
//! tested and the diff shown is exactly what is written.
//!
//! Layouts, in the order they are recognised:
//! - OpenShift: the DNS operator's `dns.operator.openshift.io/default`
//!   (`spec.servers`, one entry named `clusterset-dns`);
//! - CoreDNS that imports `custom/*.server` (AKS's and k3s's `coredns`
//!   Corefile): a key `clusterset.server` of ConfigMap
//!   `kube-system/coredns-custom`, created when missing;
//! - CoreDNS with a plain Corefile (kubeadm, EKS, most others): a marked
//!   block in `kube-system/coredns`'s `Corefile`;
//! - RKE2 (`kube-system/rke2-coredns-rke2-coredns`): Helm owns that
//!   ConfigMap and reverts edits, so nothing is written; the report says
//!   what to add to its HelmChartConfig;
//! - kube-dns (GKE): `stubDomains` of ConfigMap `kube-system/kube-dns`.
//!
//! With NodeLocal DNSCache (`kube-system/node-local-dns`), whose own
//! Corefile sends only cluster.local and the reverse zones to the cluster
//! DNS, a marked block there too, with the `bind` line of its other blocks.

use std::collections::BTreeMap;

use serde_json::{Value, json};

/// First line of a block this command wrote.
pub const BEGIN: &str = "# BEGIN clusterset-dns: written by `clusterset-dns setup-dns` (run it again to change, --remove to take out)";
/// Its last line.
pub const END: &str = "# END clusterset-dns";
/// The key of ours in `coredns-custom`.
pub const CUSTOM_KEY: &str = "clusterset.server";
/// The entry of ours in OpenShift's `spec.servers`.
pub const OPENSHIFT_SERVER: &str = "clusterset-dns";

/// What was found in the cluster (`None`: absent).
#[derive(Debug, Clone, Default)]
pub struct Observed {
    /// `kube-system/coredns` `data.Corefile`.
    pub coredns: Option<String>,
    /// `kube-system/coredns-custom` `data`, when the ConfigMap exists.
    pub coredns_custom: Option<BTreeMap<String, String>>,
    /// `kube-system/rke2-coredns-rke2-coredns` exists.
    pub rke2: bool,
    /// Deployment `kube-system/kube-dns` exists: the ConfigMap
    /// `kube-system/kube-dns`'s `stubDomains` (`Some(None)`: no such key or
    /// no ConfigMap).
    pub kube_dns: Option<Option<String>>,
    /// OpenShift's `dns.operator.openshift.io/default` `spec.servers`.
    pub openshift: Option<Vec<Value>>,
    /// `kube-system/node-local-dns` `data.Corefile`.
    pub nodelocal: Option<String>,
}

/// What to point the cluster DNS at.
#[derive(Debug, Clone)]
pub struct Want {
    /// The zone, e.g. `clusterset.local` (no final dot).
    pub zone: String,
    /// clusterset-dns's address, `IP` or `IP:PORT`.
    pub upstream: String,
    /// Take our change out instead.
    pub remove: bool,
}

/// The layouts `plan` knows.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Layout {
    /// OpenShift's DNS operator.
    OpenShift,
    /// CoreDNS importing `coredns-custom` (AKS, k3s).
    CorednsCustom,
    /// CoreDNS with one Corefile (kubeadm, EKS).
    Corefile,
    /// RKE2's Helm-managed CoreDNS.
    Rke2,
    /// kube-dns (GKE).
    KubeDns,
}

impl Layout {
    /// The short name in metrics (`clusterset_dns_wiring_ok{layout}`).
    pub fn label(self) -> &'static str {
        match self {
            Self::OpenShift => "openshift",
            Self::CorednsCustom => "coredns-custom",
            Self::Corefile => "corefile",
            Self::Rke2 => "rke2",
            Self::KubeDns => "kube-dns",
        }
    }
}

impl std::fmt::Display for Layout {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Self::OpenShift => "OpenShift DNS operator (dns.operator.openshift.io/default)",
            Self::CorednsCustom => "CoreDNS importing kube-system/coredns-custom (AKS, k3s)",
            Self::Corefile => "CoreDNS Corefile in kube-system/coredns (kubeadm, EKS)",
            Self::Rke2 => "RKE2 CoreDNS managed by Helm (kube-system/rke2-coredns-rke2-coredns)",
            Self::KubeDns => "kube-dns stubDomains in kube-system/kube-dns (GKE)",
        })
    }
}

/// One write.
#[derive(Debug, Clone, PartialEq)]
pub enum Edit {
    /// Set (or, `None`, delete) `key` of ConfigMap `kube-system/<name>`,
    /// which exists unless `create`.
    ConfigMapKey {
        /// The ConfigMap.
        name: &'static str,
        /// The key.
        key: &'static str,
        /// Its new value.
        value: Option<String>,
        /// The ConfigMap must be created.
        create: bool,
    },
    /// Replace OpenShift's `spec.servers`.
    OpenShiftServers(Value),
}

/// A planned change: the write and how it looks as a diff.
#[derive(Debug, Clone)]
pub struct Change {
    /// The write.
    pub edit: Edit,
    /// What changes, for people: `-`/`+` lines.
    pub diff: String,
}

/// What `plan` decided.
#[derive(Debug, Clone)]
pub struct Plan {
    /// The layout found.
    pub layout: Layout,
    /// The writes; empty when everything is already as wanted.
    pub changes: Vec<Change>,
    /// A step only a person can do (RKE2), in words.
    pub manual: Option<String>,
}

/// No layout was recognised: what was found, and what to add by hand.
#[derive(Debug, Clone, thiserror::Error)]
#[error("no DNS layout recognised ({found}); nothing was changed. Add by hand to the cluster DNS:\n{block}")]
pub struct Unrecognised {
    /// What was looked for and found.
    pub found: String,
    /// The server block to add.
    pub block: String,
}

/// The server block forwarding `want.zone` to clusterset-dns, without
/// markers; `bind`: a `bind` line to repeat (NodeLocal DNSCache).
pub fn server_block(want: &Want, bind: Option<&str>) -> String {
    let bind = bind.map(|b| format!("    {}\n", b.trim())).unwrap_or_default();
    format!(
        "{zone}:53 {{\n{bind}    errors\n    cache {{\n        success 9984 5\n        denial 9984 5\n    }}\n    forward . {up}\n}}\n",
        zone = want.zone,
        up = want.upstream
    )
}

/// `corefile` with our marked block replaced by `block` (appended when
/// there was none; taken out when `None`). Everything else is kept byte
/// for byte, so applying the same block twice changes nothing.
pub fn with_block(corefile: &str, block: Option<&str>) -> String {
    let mut out = String::with_capacity(corefile.len() + 256);
    let mut inside = false;
    let mut placed = false;
    for line in corefile.split_inclusive('\n') {
        if line.trim_end() == BEGIN {
            inside = true;
            if let Some(b) = block.filter(|_| !placed) {
                out.push_str(&marked(b));
                placed = true;
            }
            continue;
        }
        if inside {
            if line.trim_end() == END {
                inside = false;
            }
            continue;
        }
        out.push_str(line);
    }
    if let (Some(b), false) = (block, placed) {
        if !out.is_empty() && !out.ends_with('\n') {
            out.push('\n');
        }
        out.push_str(&marked(b));
    }
    out
}

fn marked(block: &str) -> String {
    format!("{BEGIN}\n{block}{END}\n")
}

/// `-`/`+` lines between two texts: the unchanged head and tail are left
/// out (our edits are one contiguous block).
pub fn diff(what: &str, before: &str, after: &str) -> String {
    let a: Vec<&str> = before.lines().collect();
    let b: Vec<&str> = after.lines().collect();
    let head = a.iter().zip(&b).take_while(|(x, y)| x == y).count();
    let tail = a[head..].iter().rev().zip(b[head..].iter().rev()).take_while(|(x, y)| x == y).count();
    let mut out = format!("--- {what}\n+++ {what}\n@@ line {} @@\n", head + 1);
    for l in &a[head..a.len() - tail] {
        out.push_str(&format!("-{l}\n"));
    }
    for l in &b[head..b.len() - tail] {
        out.push_str(&format!("+{l}\n"));
    }
    out
}

/// True when a Corefile imports `custom/*.server` files (AKS, k3s).
fn imports_custom(corefile: &str) -> bool {
    corefile
        .lines()
        .map(str::trim)
        .any(|l| l.starts_with("import ") && l.contains("custom/") && l.ends_with(".server"))
}

/// The first `bind` line of a Corefile (NodeLocal DNSCache's blocks bind
/// the link-local and the kube-dns addresses).
fn bind_line(corefile: &str) -> Option<&str> {
    corefile.lines().map(str::trim).find(|l| l.starts_with("bind "))
}

/// The edit putting `block` into (or, `remove`, taking ours out of) the
/// `Corefile` of ConfigMap `kube-system/<name>`; `None` when it is already so.
fn corefile_change(name: &'static str, corefile: &str, block: &str, remove: bool) -> Option<Change> {
    let next = with_block(corefile, (!remove).then_some(block));
    (next != corefile).then(|| Change {
        diff: diff(&format!("kube-system/{name} Corefile"), corefile, &next),
        edit: Edit::ConfigMapKey { name, key: "Corefile", value: Some(next), create: false },
    })
}

/// Why the Pods' DNS cannot be changed by a plan, with the fix, when
/// NodeLocal DNSCache runs (`daemonset`: DaemonSet
/// `kube-system/node-local-dns`) but its ConfigMap, where the block would
/// go, is not there: Pods ask the node-local cache, which sends
/// `want.zone` to the nodes' resolvers whatever the cluster DNS says.
pub fn nodelocal_unwired(daemonset: bool, seen: &Observed, want: &Want) -> Option<String> {
    (daemonset && seen.nodelocal.is_none()).then(|| {
        format!(
            "NodeLocal DNSCache runs (DaemonSet kube-system/node-local-dns) but ConfigMap kube-system/node-local-dns has no Corefile, so Pods that ask the node-local cache do not get {zone} from the cluster DNS. Add the node-local block to the Corefile it runs, with the `bind` line of its other blocks:\n{block}",
            zone = want.zone,
            block = server_block(want, Some("bind __PILLAR__LOCAL__DNS__ __PILLAR__DNS__SERVER__")),
        )
    })
}

/// Decides the layout and the edits.
pub fn plan(seen: &Observed, want: &Want) -> Result<Plan, Unrecognised> {
    let block = server_block(want, None);
    let mut changes = Vec::new();
    let layout = if let Some(servers) = &seen.openshift {
        changes.extend(openshift_change(servers, want));
        Layout::OpenShift
    } else if let Some(corefile) = &seen.coredns {
        if imports_custom(corefile) {
            changes.extend(custom_change(seen.coredns_custom.as_ref(), &block, want));
            Layout::CorednsCustom
        } else {
            changes.extend(corefile_change("coredns", corefile, &block, want.remove));
            Layout::Corefile
        }
    } else if seen.rke2 {
        return Ok(Plan { layout: Layout::Rke2, changes, manual: Some(rke2_manual(want, &block)) });
    } else if let Some(stub) = &seen.kube_dns {
        changes.extend(stub_domains_change(stub.as_deref(), want));
        Layout::KubeDns
    } else {
        return Err(Unrecognised {
            found: "no ConfigMap kube-system/coredns, coredns-custom import, rke2-coredns-rke2-coredns, Deployment kube-system/kube-dns or dns.operator.openshift.io/default".into(),
            block,
        });
    };
    if let Some(corefile) = &seen.nodelocal {
        let local = server_block(want, bind_line(corefile));
        changes.extend(corefile_change("node-local-dns", corefile, &local, want.remove));
    }
    Ok(Plan { layout, changes, manual: None })
}

/// OpenShift's `spec.servers` with our entry put in (or taken out);
/// `None` when it is already so.
fn openshift_change(servers: &[Value], want: &Want) -> Option<Change> {
    let mut next: Vec<Value> = servers.iter().filter(|s| s["name"] != OPENSHIFT_SERVER).cloned().collect();
    if !want.remove {
        next.push(json!({"name": OPENSHIFT_SERVER, "zones": [want.zone],
                         "forwardPlugin": {"upstreams": [want.upstream]}}));
    }
    (next.as_slice() != servers).then(|| {
        let show = |v: &[Value]| serde_json::to_string_pretty(v).unwrap_or_default();
        Change {
            diff: diff("dns.operator.openshift.io/default spec.servers", &show(servers), &show(&next)),
            edit: Edit::OpenShiftServers(Value::Array(next)),
        }
    })
}

/// Our key of `kube-system/coredns-custom` (`custom`: its data, `None`
/// when the ConfigMap is missing) set to `block` or taken out.
fn custom_change(custom: Option<&BTreeMap<String, String>>, block: &str, want: &Want) -> Option<Change> {
    let old = custom.and_then(|d| d.get(CUSTOM_KEY));
    let new = (!want.remove).then(|| block.to_owned());
    (old != new.as_ref()).then(|| Change {
        diff: diff(
            &format!("kube-system/coredns-custom {CUSTOM_KEY}"),
            old.map_or("", String::as_str),
            new.as_deref().unwrap_or(""),
        ),
        edit: Edit::ConfigMapKey {
            name: "coredns-custom",
            key: CUSTOM_KEY,
            value: new,
            create: custom.is_none(),
        },
    })
}

/// What to add to RKE2's HelmChartConfig by hand, since Helm reverts edits
/// to the ConfigMap it renders.
fn rke2_manual(want: &Want, block: &str) -> String {
    format!(
        "Helm owns kube-system/rke2-coredns-rke2-coredns and reverts edits to it. Add a server through the chart's values instead (HelmChartConfig kube-system/rke2-coredns, spec.valuesContent). The chart's `servers` list replaces its default one, so keep the default `.:53` entry and add:\n\nservers:\n- zones:\n  - zone: {zone}\n  port: 53\n  plugins:\n  - name: errors\n  - name: cache\n    parameters: 5\n  - name: forward\n    parameters: . {up}\n\nThe server block it must render:\n{block}",
        zone = want.zone,
        up = want.upstream,
    )
}

/// kube-dns's `stubDomains` (`stub`: its JSON text, `None` when the key is
/// missing) with our zone sent upstream (or taken out); `None` when the
/// JSON already says so.
fn stub_domains_change(stub: Option<&str>, want: &Want) -> Option<Change> {
    let mut domains: serde_json::Map<String, Value> =
        stub.and_then(|s| serde_json::from_str(s).ok()).unwrap_or_default();
    if want.remove {
        domains.remove(&want.zone);
    } else {
        domains.insert(want.zone.clone(), json!([want.upstream]));
    }
    let next = (!domains.is_empty()).then(|| Value::Object(domains).to_string());
    let same = match (stub.and_then(|s| serde_json::from_str::<Value>(s).ok()), &next) {
        (Some(old), Some(new)) => serde_json::from_str::<Value>(new).ok().as_ref() == Some(&old),
        (None, None) => true,
        _ => false,
    };
    (!same).then(|| Change {
        diff: diff("kube-system/kube-dns stubDomains", stub.unwrap_or(""), next.as_deref().unwrap_or("")),
        edit: Edit::ConfigMapKey {
            name: "kube-dns",
            key: "stubDomains",
            value: next,
            create: stub.is_none(),
        },
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    const KUBEADM: &str = ".:53 {\n    errors\n    kubernetes cluster.local in-addr.arpa ip6.arpa {\n       fallthrough in-addr.arpa ip6.arpa\n    }\n    forward . /etc/resolv.conf\n    cache 30\n    reload\n}\n";

    fn want(remove: bool) -> Want {
        Want { zone: "clusterset.local".into(), upstream: "10.96.0.53".into(), remove }
    }

    fn corefile_of(p: &Plan) -> String {
        match &p.changes[0].edit {
            Edit::ConfigMapKey { value: Some(v), .. } => v.clone(),
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn a_kubeadm_corefile_gets_one_marked_block_idempotently_and_loses_it_on_remove() {
        let seen = Observed { coredns: Some(KUBEADM.into()), ..Default::default() };
        let p = plan(&seen, &want(false)).unwrap();
        assert_eq!(p.layout, Layout::Corefile);
        let patched = corefile_of(&p);
        assert!(patched.starts_with(KUBEADM), "the rest is kept byte for byte");
        assert!(patched.contains("clusterset.local:53 {") && patched.contains("forward . 10.96.0.53"));
        let diff = &p.changes[0].diff;
        assert!(diff.contains("+clusterset.local:53 {"), "{diff}");
        assert!(
            !diff.lines().any(|l| l.starts_with('-') && !l.starts_with("--- ")),
            "only additions: {diff}"
        );
        // Twice: nothing to do.
        let again = Observed { coredns: Some(patched.clone()), ..Default::default() };
        assert!(plan(&again, &want(false)).unwrap().changes.is_empty());
        // Another upstream replaces the block in place.
        let moved = plan(&again, &Want { upstream: "10.96.0.54".into(), ..want(false) }).unwrap();
        let moved = corefile_of(&moved);
        assert_eq!(moved.matches(BEGIN).count(), 1);
        assert!(moved.contains("10.96.0.54") && !moved.contains("10.96.0.53"));
        // Removed: exactly the original.
        assert_eq!(corefile_of(&plan(&again, &want(true)).unwrap()), KUBEADM);
        assert!(plan(&seen, &want(true)).unwrap().changes.is_empty(), "nothing to remove");
    }

    #[test]
    fn aks_and_k3s_get_a_coredns_custom_key_and_the_corefile_is_left_alone() {
        let k3s = format!("{KUBEADM}import /etc/coredns/custom/*.server\n");
        let seen = Observed { coredns: Some(k3s), ..Default::default() };
        let p = plan(&seen, &want(false)).unwrap();
        assert_eq!(p.layout, Layout::CorednsCustom);
        let Edit::ConfigMapKey { name, key, value: Some(v), create } = &p.changes[0].edit else { panic!() };
        assert_eq!((*name, *key, *create), ("coredns-custom", CUSTOM_KEY, true));
        assert!(v.starts_with("clusterset.local:53 {"));
        let aks = Observed {
            coredns: Some(format!("{KUBEADM}    import custom/*.server\n")),
            coredns_custom: Some([(CUSTOM_KEY.to_owned(), v.clone())].into()),
            ..Default::default()
        };
        assert!(plan(&aks, &want(false)).unwrap().changes.is_empty());
        let gone = plan(&aks, &want(true)).unwrap();
        assert!(matches!(&gone.changes[0].edit, Edit::ConfigMapKey { value: None, create: false, .. }));
    }

    #[test]
    fn gke_stub_domains_keep_the_others_and_openshift_servers_keep_theirs() {
        let seen =
            Observed { kube_dns: Some(Some(r#"{"acme.local": ["1.2.3.4"]}"#.into())), ..Default::default() };
        let p = plan(&seen, &want(false)).unwrap();
        assert_eq!(p.layout, Layout::KubeDns);
        let Edit::ConfigMapKey { value: Some(v), .. } = &p.changes[0].edit else { panic!() };
        let v: Value = serde_json::from_str(v).unwrap();
        assert_eq!(v, json!({"acme.local": ["1.2.3.4"], "clusterset.local": ["10.96.0.53"]}));
        let done = Observed { kube_dns: Some(Some(v.to_string())), ..Default::default() };
        assert!(plan(&done, &want(false)).unwrap().changes.is_empty());
        let other =
            json!({"name": "corp", "zones": ["corp.example"], "forwardPlugin": {"upstreams": ["1.1.1.1"]}});
        let os = Observed {
            openshift: Some(vec![other.clone()]),
            coredns: Some(KUBEADM.into()),
            ..Default::default()
        };
        let p = plan(&os, &want(false)).unwrap();
        assert_eq!(p.layout, Layout::OpenShift, "the operator owns the Corefile");
        let Edit::OpenShiftServers(servers) = &p.changes[0].edit else { panic!() };
        assert_eq!(servers[0], other);
        assert_eq!(servers[1]["forwardPlugin"]["upstreams"][0], "10.96.0.53");
    }

    #[test]
    fn nodelocal_dns_gets_a_block_with_its_bind_line_and_unknown_layouts_change_nothing() {
        let nodelocal = "cluster.local:53 {\n    errors\n    bind 169.254.20.10 10.96.0.10\n    forward . __PILLAR__CLUSTER__DNS__\n}\n";
        let seen = Observed {
            coredns: Some(KUBEADM.into()),
            nodelocal: Some(nodelocal.into()),
            ..Default::default()
        };
        let p = plan(&seen, &want(false)).unwrap();
        assert_eq!(p.changes.len(), 2);
        let Edit::ConfigMapKey { name, value: Some(v), .. } = &p.changes[1].edit else { panic!() };
        assert_eq!(*name, "node-local-dns");
        assert!(v.contains("clusterset.local:53 {\n    bind 169.254.20.10 10.96.0.10\n"), "{v}");
        let e = plan(&Observed::default(), &want(false)).unwrap_err();
        assert!(e.to_string().contains("nothing was changed") && e.block.contains("forward . 10.96.0.53"));
        let rke2 = plan(&Observed { rke2: true, ..Default::default() }, &want(false)).unwrap();
        assert!(rke2.changes.is_empty() && rke2.manual.is_some_and(|m| m.contains("HelmChartConfig")));
    }

    #[test]
    fn nodelocal_dns_without_its_configmap_is_reported_with_the_node_local_block() {
        let seen = Observed { coredns: Some(KUBEADM.into()), ..Default::default() };
        let why = nodelocal_unwired(true, &seen, &want(false)).expect("reported");
        assert!(why.contains("DaemonSet kube-system/node-local-dns"), "{why}");
        assert!(why.contains("clusterset.local:53 {\n    bind __PILLAR__LOCAL__DNS__"), "{why}");
        assert_eq!(nodelocal_unwired(false, &seen, &want(false)), None, "no NodeLocal DNSCache");
        let wired = Observed { nodelocal: Some("cluster.local:53 {\n}\n".into()), ..seen };
        assert_eq!(nodelocal_unwired(true, &wired, &want(false)), None, "its ConfigMap takes the block");
    }
}
