//! DNS-safe names: a single label (`DnsLabel`) and a cluster id, which the
//! contract allows to span several labels (`cluster-c.eu`).

use std::fmt;

/// Why a string is not usable as a DNS name part.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum LabelError {
    /// The string is empty.
    #[error("is empty")]
    Empty,
    /// A label is longer than the 63 bytes DNS allows.
    #[error("label {0:?} is longer than 63 characters")]
    TooLong(String),
    /// A character outside `a-z`, `0-9`, `-` (upper case is accepted and folded).
    #[error("{0:?} has a character other than letters, digits and '-'")]
    BadCharacter(String),
    /// RFC 1123: labels neither start nor end with a hyphen.
    #[error("{0:?} starts or ends with '-'")]
    EdgeHyphen(String),
}

/// One lower-case DNS label, as Kubernetes object names (RFC 1123 labels),
/// endpoint hostnames and port names use.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct DnsLabel(Box<str>);

impl DnsLabel {
    /// Validates an RFC 1123 label and folds it to lower case.
    pub fn parse(s: &str) -> Result<Self, LabelError> {
        check_label(s, false)?;
        Ok(Self(s.to_ascii_lowercase().into()))
    }

    /// Builds the label that stands for an endpoint without a `hostname`:
    /// its address with `.` and `:` replaced by `-` (`10-3-0-10`, `fd00-2--10`).
    /// IPv6 addresses may start or end with `-` here (`--1`); DNS allows that.
    pub fn from_address(addr: std::net::IpAddr) -> Self {
        Self(addr.to_string().replace(['.', ':'], "-").into())
    }

    /// The label text (lower case).
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl fmt::Display for DnsLabel {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

/// A member cluster's id, from the EndpointSlice label
/// `multicluster.kubernetes.io/source-cluster`. It may contain dots, each part
/// a DNS label; in a name it stands between the hostname and the service.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct ClusterId(Box<str>);

impl ClusterId {
    /// Validates every dot-separated part as a label and folds to lower case.
    pub fn parse(s: &str) -> Result<Self, LabelError> {
        if s.is_empty() {
            return Err(LabelError::Empty);
        }
        for part in s.split('.') {
            check_label(part, false)?;
        }
        Ok(Self(s.to_ascii_lowercase().into()))
    }

    /// The id text (lower case).
    pub fn as_str(&self) -> &str {
        &self.0
    }

    /// The id's labels, left to right.
    pub fn labels(&self) -> impl Iterator<Item = &str> {
        self.0.split('.')
    }
}

impl fmt::Display for ClusterId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

fn check_label(s: &str, allow_edge_hyphen: bool) -> Result<(), LabelError> {
    if s.is_empty() {
        return Err(LabelError::Empty);
    }
    if s.len() > 63 {
        return Err(LabelError::TooLong(s.to_owned()));
    }
    if !s.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'-') {
        return Err(LabelError::BadCharacter(s.to_owned()));
    }
    if !allow_edge_hyphen && (s.starts_with('-') || s.ends_with('-')) {
        return Err(LabelError::EdgeHyphen(s.to_owned()));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn labels_fold_case_and_reject_what_dns_names_cannot_hold() {
        assert_eq!(DnsLabel::parse("Web-0").map(|l| l.to_string()), Ok("web-0".into()));
        assert_eq!(DnsLabel::parse(""), Err(LabelError::Empty));
        assert!(matches!(DnsLabel::parse("a.b"), Err(LabelError::BadCharacter(_))));
        assert!(matches!(DnsLabel::parse("a_b"), Err(LabelError::BadCharacter(_))));
        assert!(matches!(DnsLabel::parse("-a"), Err(LabelError::EdgeHyphen(_))));
        assert!(matches!(DnsLabel::parse(&"a".repeat(64)), Err(LabelError::TooLong(_))));
        assert!(DnsLabel::parse(&"a".repeat(63)).is_ok());
    }

    #[test]
    fn address_labels_replace_separators_with_hyphens() {
        let v4: std::net::IpAddr = "10.3.0.10".parse().unwrap();
        let v6: std::net::IpAddr = "fd00:2::10".parse().unwrap();
        assert_eq!(DnsLabel::from_address(v4).as_str(), "10-3-0-10");
        assert_eq!(DnsLabel::from_address(v6).as_str(), "fd00-2--10");
    }

    #[test]
    fn cluster_ids_may_span_labels() {
        let id = ClusterId::parse("Cluster-C.eu").unwrap();
        assert_eq!(id.as_str(), "cluster-c.eu");
        assert_eq!(id.labels().collect::<Vec<_>>(), ["cluster-c", "eu"]);
        assert!(ClusterId::parse("a..b").is_err());
        assert!(ClusterId::parse("").is_err());
    }
}
