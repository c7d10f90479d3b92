//! DNS programming latency: how long after its trigger time a slice's
//! change is answered. The writer notes each slice that changes what it
//! answers (its content, not its annotations) in a source that has listed
//! once, with the slice's [`ChangeTrigger`]; when the publish that makes
//! the change visible to queries is stored, each note is judged here: an
//! observation of publish − trigger, by the service's kind, or a cause
//! for not observing it. The writer's caller hands them on to `/metrics`
//! (`clusterset_dns_programming_duration_seconds`).
//!
//! What is not a change to measure: a source's first list (the server
//! starting, not a change), a removed slice (a deletion carries the
//! trigger of the change before it), a slice whose annotations alone
//! changed (nothing answered changed). What is judged and not observed, by
//! cause ([`Unmeasured`]): no trigger time, one that does not parse, one
//! in the future (the clock of the cluster that wrote it is ahead of
//! ours), one more than [`STALE_AFTER`] old, one the slice's previous
//! version carried too (the change was made by a writer that set no time
//! of its own: a repair, a rewrite), and a change of a service not
//! answered (no ServiceImport yet).

use std::time::{Duration, SystemTime};

use crate::model::{ChangeTrigger, ImportType};

/// A trigger time older than this is not observed ([`Unmeasured::Stale`]):
/// a change is answered within seconds, or else its member was cut off,
/// which `serve` and `sync` say in their own metrics; an hour-old time is
/// an annotation carried by a writer that did not make the change.
pub const STALE_AFTER: Duration = Duration::from_secs(3600);

/// Why a slice change was not observed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Unmeasured {
    /// No trigger time: a slice no EndpointSlice controller wrote.
    Missing,
    /// A trigger time that is not an RFC 3339 time.
    Unparsable,
    /// A trigger time after the publish: clock skew between the cluster
    /// that wrote it and this server.
    Future,
    /// A trigger time more than [`STALE_AFTER`] old.
    Stale,
    /// The same trigger time as the slice's previous version: whoever
    /// changed it said nothing of when the change began.
    Repeated,
    /// The service has no ServiceImport: the change is not answered.
    Unserved,
}

impl Unmeasured {
    /// Every cause, in the order `/metrics` shows them.
    pub const ALL: [Self; 6] =
        [Self::Missing, Self::Unparsable, Self::Future, Self::Stale, Self::Repeated, Self::Unserved];

    /// The `cause` label.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Missing => "missing",
            Self::Unparsable => "unparsable",
            Self::Future => "future",
            Self::Stale => "stale",
            Self::Repeated => "repeated",
            Self::Unserved => "unserved",
        }
    }
}

/// The `service_kind` label of an import type, in CoreDNS's style.
pub fn kind_label(kind: ImportType) -> &'static str {
    match kind {
        ImportType::ClusterSetIp => "clusterset_ip",
        ImportType::Headless => "headless",
    }
}

/// A slice change waiting for the publish that answers it.
#[derive(Debug, Clone)]
pub(crate) struct Pending {
    pub(crate) trigger: ChangeTrigger,
    /// The slice's previous version carried the same trigger time.
    pub(crate) repeated: bool,
}

/// What the publishes since the last [`super::Writer::take_programmed`]
/// measured.
#[derive(Debug, Default, Clone, PartialEq)]
pub struct Programmed {
    /// Publish − trigger, by the service's kind.
    pub observed: Vec<(ImportType, Duration)>,
    /// Changes not observed, by cause.
    pub unmeasured: Vec<Unmeasured>,
}

impl Programmed {
    /// True when nothing was measured.
    pub fn is_empty(&self) -> bool {
        self.observed.is_empty() && self.unmeasured.is_empty()
    }

    /// Judges one change published at `published`, of a service answered
    /// as `kind` (`None`: not answered).
    pub(crate) fn judge(&mut self, change: &Pending, kind: Option<ImportType>, published: SystemTime) {
        match judge(change, kind, published) {
            Ok((kind, took)) => self.observed.push((kind, took)),
            Err(cause) => self.unmeasured.push(cause),
        }
    }
}

/// One change's latency, or why it has none.
fn judge(
    change: &Pending,
    kind: Option<ImportType>,
    published: SystemTime,
) -> Result<(ImportType, Duration), Unmeasured> {
    let at = match change.trigger {
        ChangeTrigger::Missing => return Err(Unmeasured::Missing),
        ChangeTrigger::Unparsable => return Err(Unmeasured::Unparsable),
        ChangeTrigger::At(at) => at,
    };
    if change.repeated {
        return Err(Unmeasured::Repeated);
    }
    let kind = kind.ok_or(Unmeasured::Unserved)?;
    let took = published.duration_since(at).map_err(|_| Unmeasured::Future)?;
    if took > STALE_AFTER {
        return Err(Unmeasured::Stale);
    }
    Ok((kind, took))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pending(trigger: ChangeTrigger, repeated: bool) -> Pending {
        Pending { trigger, repeated }
    }

    #[test]
    fn a_change_is_observed_from_its_trigger_or_skipped_by_cause() {
        let now = SystemTime::now();
        let at = |back: Duration| ChangeTrigger::At(now - back);
        let ms = Duration::from_millis;
        let kind = Some(ImportType::Headless);
        assert_eq!(judge(&pending(at(ms(64)), false), kind, now), Ok((ImportType::Headless, ms(64))));
        assert_eq!(
            judge(&pending(at(Duration::ZERO), false), Some(ImportType::ClusterSetIp), now),
            Ok((ImportType::ClusterSetIp, Duration::ZERO))
        );
        assert_eq!(judge(&pending(ChangeTrigger::Missing, false), kind, now), Err(Unmeasured::Missing));
        assert_eq!(judge(&pending(ChangeTrigger::Unparsable, false), kind, now), Err(Unmeasured::Unparsable));
        let ahead = ChangeTrigger::At(now + ms(5));
        assert_eq!(judge(&pending(ahead, false), kind, now), Err(Unmeasured::Future));
        assert_eq!(judge(&pending(at(STALE_AFTER + ms(1)), false), kind, now), Err(Unmeasured::Stale));
        assert_eq!(
            judge(&pending(at(STALE_AFTER), false), kind, now),
            Ok((ImportType::Headless, STALE_AFTER))
        );
        assert_eq!(judge(&pending(at(ms(64)), true), kind, now), Err(Unmeasured::Repeated));
        assert_eq!(judge(&pending(at(ms(64)), false), None, now), Err(Unmeasured::Unserved));
        // A time years old is stale; one that does not parse says so first.
        let years = Duration::from_secs(3 * 365 * 86_400);
        assert_eq!(judge(&pending(at(years), false), kind, now), Err(Unmeasured::Stale));
    }

    #[test]
    fn every_cause_has_its_own_label() {
        let labels: std::collections::HashSet<&str> = Unmeasured::ALL.iter().map(|c| c.as_str()).collect();
        assert_eq!(labels.len(), Unmeasured::ALL.len());
        assert_ne!(kind_label(ImportType::Headless), kind_label(ImportType::ClusterSetIp));
    }
}
