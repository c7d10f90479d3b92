//! The `check` command: reads objects files the way `serve` does and reports
//! what would be served, so a change can be validated before it is applied.

use std::collections::BTreeMap;

use crate::cli::CheckArgs;
use crate::source::files::FileSource;
use crate::source::objects;
use crate::store::Object;

/// Checks every file; returns the report and whether everything was usable.
pub fn run(args: &CheckArgs) -> (String, bool) {
    let mut report = String::new();
    let mut ok = true;
    let interop = args.interop;
    for path in &args.objects {
        // The same files `serve` reads (hidden ConfigMap entries left out).
        let files = match FileSource::new(0, path.clone()).files() {
            Ok(files) => files,
            Err(e) => {
                ok = false;
                report += &format!("{}: {e}\n", path.display());
                continue;
            }
        };
        for file in files {
            let name = file.display().to_string();
            let text = match std::fs::read_to_string(&file) {
                Ok(t) => t,
                Err(e) => {
                    ok = false;
                    report += &format!("{name}: {e}\n");
                    continue;
                }
            };
            match objects::parse_with(&text, &name, interop) {
                Err(e) => {
                    ok = false;
                    report += &format!("{e}\n");
                }
                Ok(p) => {
                    let imports = p.objects.iter().filter(|o| matches!(o, Object::Import(_))).count();
                    let services = p.objects.iter().filter(|o| matches!(o, Object::Service(_))).count();
                    let slices = p.objects.len() - imports - services;
                    report += &format!("{name}: {imports} ServiceImports, {slices} EndpointSlices");
                    if interop.any() {
                        report += &format!(", {services} Services");
                    }
                    let ignored: usize = p.ignored.values().sum();
                    if ignored > 0 {
                        let kinds: BTreeMap<_, _> = p.ignored;
                        report += &format!(
                            ", {ignored} ignored ({})",
                            kinds
                                .into_iter()
                                .map(|(k, n)| format!("{k} ×{n}"))
                                .collect::<Vec<_>>()
                                .join(", ")
                        );
                    }
                    report += "\n";
                    for e in &p.skipped {
                        ok = false;
                        report += &format!("  skipped: {e}\n");
                    }
                }
            }
        }
    }
    (report, ok)
}
