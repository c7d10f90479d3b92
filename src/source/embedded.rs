//! The example fleet in `zones/`, compiled into the binary and served when
//! no source is given, so that a first run answers at once.

use super::objects::{self, ParseError, Parsed};
use crate::model::Interop;

/// The embedded files: (name, contents).
pub const FILES: &[(&str, &str)] = &[
    ("zones/shop.yaml", include_str!("../../zones/shop.yaml")),
    ("zones/infra.yaml", include_str!("../../zones/infra.yaml")),
];

/// Parses the embedded fleet, reading the shapes `interop` names as
/// `--objects` files would be.
pub fn parse(interop: Interop) -> Result<Parsed, ParseError> {
    let mut all = Parsed::default();
    for (name, text) in FILES {
        let p = objects::parse_with(text, name, interop)?;
        all.objects.extend(p.objects);
        all.skipped.extend(p.skipped);
    }
    Ok(all)
}
