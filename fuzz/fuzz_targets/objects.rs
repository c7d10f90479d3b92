//! Any text as an objects file (YAML or JSON), read the way `check` and
//! `serve` read one: `source::objects::parse`, which converts each object
//! and skips those that cannot be served, then (as `serve` does) the store
//! takes the objects and publishes a snapshot. Never a panic. An error
//! names its document and field as `ParseError` promises
//! (`<origin>: document <n>[, field <path>]: <message>`), and a skipped
//! object names its kind and field as `ConvertError` promises.
#![no_main]

use clusterset_dns::source::objects;
use clusterset_dns::store::{self, SourceId, Update};
use clusterset_dns_fuzz::server::zone;
use libfuzzer_sys::fuzz_target;

const ORIGIN: &str = "fuzz.yaml";

fuzz_target!(|data: &[u8]| {
    // `check` reads files with `read_to_string`: text that is not UTF-8
    // fails there, naming the file, before the parser sees it.
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    match objects::parse(text, ORIGIN) {
        Err(e) => {
            let shown = e.to_string();
            let prefix = format!("{ORIGIN}: document {}", e.document);
            assert!(shown.starts_with(&prefix), "{shown:?} does not start with {prefix:?}");
            // Documents start after `---` (or `...`), so a document's index
            // cannot exceed their count plus the first. A syntax error right
            // after the last document names the one the YAML parser expected
            // next (`&a ]`: "document 2: did not find expected <document
            // start> at line 1 column 4"): one more, and its message has the
            // line and column.
            let starts = text.matches("---").count() + text.matches("...").count() + 1;
            let most = if e.field.is_some() { starts } else { starts + 1 };
            assert!((1..=most).contains(&e.document), "document {} of at most {most}", e.document);
            if let Some(field) = &e.field {
                assert!(!field.is_empty(), "an empty field path: {shown:?}");
                assert!(shown.contains(&format!(", field {field}: ")), "{shown:?} does not name {field}");
            }
        }
        Ok(parsed) => {
            for skipped in &parsed.skipped {
                assert!(["ServiceImport", "EndpointSlice"].contains(&skipped.kind), "{skipped}");
                assert!(!skipped.field.is_empty(), "a skipped object without its field: {skipped}");
            }
            let (reader, mut writer) = store::new(zone());
            writer.apply(Update::Replace { source: SourceId::Example, objects: parsed.objects });
            writer.publish();
            drop(reader.load());
        }
    }
});
