//! What an update adds to the store, kind by kind: what the memory budget
//! weighs before the writer applies it.

use crate::store::input::Object;

/// Objects of each kind: what an update adds to the store
/// ([`Writer::growth`](super::Writer::growth)), what a source holds.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Kinds {
    /// ServiceImports.
    pub imports: usize,
    /// EndpointSlices.
    pub slices: usize,
    /// Services backing an import (`--interop`).
    pub services: usize,
    /// Endpoints in those EndpointSlices (not an object). In a growth, only
    /// those of slices the source does not hold: a list's are counted by
    /// identity ([`Writer::growth`](super::Writer::growth)).
    pub endpoints: usize,
}

impl Kinds {
    /// The objects of `objects`, by kind.
    pub(super) fn of<'a>(objects: impl IntoIterator<Item = &'a Object>) -> Self {
        let mut kinds = Self::default();
        for object in objects {
            match object {
                Object::Import(_) => kinds.imports += 1,
                Object::Slice(set) => {
                    kinds.slices += 1;
                    kinds.endpoints += set.endpoints.len();
                }
                Object::Service(_) => kinds.services += 1,
            }
        }
        kinds
    }

    /// What `self` has beyond `held`, kind by kind.
    pub(super) fn beyond(self, held: Self) -> Self {
        Self {
            imports: self.imports.saturating_sub(held.imports),
            slices: self.slices.saturating_sub(held.slices),
            services: self.services.saturating_sub(held.services),
            endpoints: self.endpoints.saturating_sub(held.endpoints),
        }
    }

    pub(super) fn add(&mut self, other: Self) {
        self.imports += other.imports;
        self.slices += other.slices;
        self.services += other.services;
        self.endpoints += other.endpoints;
    }

    /// Objects of every kind (endpoints are not objects).
    pub fn total(self) -> usize {
        self.imports.saturating_add(self.slices).saturating_add(self.services)
    }
}

impl std::fmt::Display for Kinds {
    /// `2 ServiceImports, 1 EndpointSlice with 40 new endpoints`; `no
    /// objects`.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let kinds =
            [(self.imports, "ServiceImport"), (self.slices, "EndpointSlice"), (self.services, "Service")];
        let mut first = true;
        for (n, kind) in kinds.into_iter().filter(|(n, _)| *n > 0) {
            let plural = if n == 1 { "" } else { "s" };
            write!(f, "{}{n} {kind}{plural}", if first { "" } else { ", " })?;
            first = false;
        }
        if first {
            f.write_str("no objects")?;
        }
        if self.endpoints > 0 {
            let plural = if self.endpoints == 1 { "" } else { "s" };
            write!(f, " with {} new endpoint{plural}", self.endpoints)?;
        }
        Ok(())
    }
}

/// What an update would add to the store: what the memory budget weighs
/// before the writer applies it ([`Writer::growth`](super::Writer::growth)).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Growth {
    /// Objects its source does not hold yet, by kind. A list counts what it
    /// brings beyond what its source held; an edit of an object the source
    /// holds, and a removal, add none.
    Adds(Kinds),
    /// Part of a list a refusal already cut short: refused with it,
    /// whatever it holds (see [`Writer::refused`](super::Writer::refused)).
    CutShort,
}
