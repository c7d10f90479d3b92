//! Reads Kubernetes objects from text: multi-document YAML or JSON, exactly
//! as `kubectl get -o yaml` writes it, `kind: List` included.
//!
//! Two kinds of failure are kept apart on purpose:
//! - a document that is not what it claims (YAML syntax, a field of the wrong
//!   type) fails the whole text with a [`ParseError`] naming the document and
//!   field, so a half-saved file never replaces a good one;
//! - a well-formed object that cannot be served (an invalid IP, name or port)
//!   is skipped with a [`ConvertError`] naming it, and the rest is served.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::Service;
use k8s_openapi::api::discovery::v1::EndpointSlice;
use serde::Deserialize;

use crate::k8s::convert::{self, ConvertError, SliceOutcome};
use crate::k8s::mcs::{LABEL_SERVICE_NAME, MCS_GROUP, MCS_VERSIONS};
use crate::k8s::{crd, interop};
use crate::model::Interop;
use crate::store::Object;

/// What a text held.
#[derive(Debug, Default)]
pub struct Parsed {
    /// Objects to serve.
    pub objects: Vec<Object>,
    /// Objects skipped because they cannot be served, each naming the object.
    pub skipped: Vec<ConvertError>,
    /// Objects of other kinds, counted by `apiVersion/kind`; they are ignored.
    pub ignored: BTreeMap<String, usize>,
}

/// A text that could not be read as Kubernetes objects.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{origin}: document {document}{}: {message}", field_suffix(.field))]
pub struct ParseError {
    /// Where the text came from (a file path).
    pub origin: String,
    /// 1-based index of the document in a multi-document text.
    pub document: usize,
    /// The failing field as a path (`items[2].spec.ports[0].port`), when known.
    pub field: Option<String>,
    /// What is wrong.
    pub message: String,
}

fn field_suffix(field: &Option<String>) -> String {
    field.as_ref().map(|f| format!(", field {f}")).unwrap_or_default()
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct TypeMeta {
    #[serde(default)]
    api_version: String,
    #[serde(default)]
    kind: String,
}

/// Parses every document of `text` (MCS objects only). `origin` names the
/// text in errors.
pub fn parse(text: &str, origin: &str) -> Result<Parsed, ParseError> {
    parse_with(text, origin, Interop::NONE)
}

/// Parses every document of `text`, reading the fleet managers' shapes
/// `interop` names too (Services, slices without MCS labels, Kosmos's
/// disconnected addresses), as `serve --interop` reads them from a cluster.
pub fn parse_with(text: &str, origin: &str, interop: Interop) -> Result<Parsed, ParseError> {
    if let Some(parsed) = json_documents(text).and_then(|docs| parse_json(&docs, interop)) {
        return Ok(parsed);
    }
    parse_yaml(text, origin, interop)
}

/// The documents of `text` when every one is a JSON object (as `kubectl get
/// -o json` and generators write them, split by `---` lines); `None` when
/// any is not, and the text is read as YAML.
fn json_documents(text: &str) -> Option<Vec<&str>> {
    let mut bounds = vec![0];
    for at in memchr::memmem::find_iter(text.as_bytes(), b"---") {
        let line_start = at == 0 || text.as_bytes()[at - 1] == b'\n';
        let rest = &text[at + 3..];
        if line_start && (rest.is_empty() || rest.starts_with('\n') || rest.starts_with("\r\n")) {
            bounds.extend([at, at + 3]);
        }
    }
    bounds.push(text.len());
    let mut docs = Vec::new();
    for pair in bounds.chunks(2) {
        let doc = text[pair[0]..pair[1]].trim();
        // Empty documents are skipped, as the YAML reader skips them.
        if !doc.is_empty() {
            (doc.starts_with('{') && doc.ends_with('}')).then_some(())?;
            docs.push(doc);
        }
    }
    Some(docs)
}

/// JSON documents read in parallel: JSON is a subset of YAML, so the result
/// is what [`parse_yaml`] gives, several times faster (no YAML events, no
/// value tree: each document is read straight into its type). `None` on
/// any error, so the YAML reader reports it the same way for every text.
fn parse_json(docs: &[&str], interop: Interop) -> Option<Parsed> {
    let threads = std::thread::available_parallelism().map_or(1, |n| n.get()).clamp(1, 8);
    let per = docs.len().div_ceil(threads).max(1);
    let parts: Vec<Option<Parsed>> = std::thread::scope(|scope| {
        let handles: Vec<_> = docs
            .chunks(per)
            .map(|chunk| {
                scope.spawn(move || {
                    let mut parsed = Parsed::default();
                    for doc in chunk {
                        add_object(&mut parsed, Doc::Json(doc), "", interop).ok()?;
                    }
                    Some(parsed)
                })
            })
            .collect();
        handles.into_iter().map(|h| h.join().ok().flatten()).collect()
    });
    let mut all = Parsed::default();
    for part in parts {
        let part = part?;
        all.objects.extend(part.objects);
        all.skipped.extend(part.skipped);
        for (kind, n) in part.ignored {
            *all.ignored.entry(kind).or_default() += n;
        }
    }
    Some(all)
}

/// Every document of `text`, read as YAML.
fn parse_yaml(text: &str, origin: &str, interop: Interop) -> Result<Parsed, ParseError> {
    let mut parsed = Parsed::default();
    for (i, doc) in serde_yaml_ng::Deserializer::from_str(text).enumerate() {
        let document = i + 1;
        let fail = |field: Option<String>, message: String| ParseError {
            origin: origin.to_owned(),
            document,
            field,
            message,
        };
        let value = serde_yaml_ng::Value::deserialize(doc).map_err(|e| fail(None, e.to_string()))?;
        if value.is_null() {
            continue; // an empty document, e.g. a trailing `---`
        }
        add_object(&mut parsed, Doc::Yaml(value), "", interop)
            .map_err(|(field, message)| fail(field, message))?;
    }
    Ok(parsed)
}

/// One object's text: a YAML value, or a JSON document read straight into
/// its type.
enum Doc<'a> {
    Yaml(serde_yaml_ng::Value),
    Json(&'a str),
}

impl Doc<'_> {
    fn meta(&self) -> Result<TypeMeta, String> {
        match self {
            Self::Yaml(value) => TypeMeta::deserialize(value).map_err(|e| e.to_string()),
            Self::Json(text) => serde_json::from_str(text).map_err(|e| e.to_string()),
        }
    }

    fn into_value(self) -> Result<serde_yaml_ng::Value, String> {
        match self {
            Self::Yaml(value) => Ok(value),
            Self::Json(text) => serde_yaml_ng::from_str(text).map_err(|e| e.to_string()),
        }
    }
}

/// Adds one object (or a List's items) to `parsed`; errors are (field, message).
fn add_object(
    parsed: &mut Parsed,
    doc: Doc<'_>,
    path: &str,
    interop: Interop,
) -> Result<(), (Option<String>, String)> {
    let at = |f: &str| {
        if path.is_empty() { f.to_owned() } else { format!("{path}.{f}") }
    };
    let meta = doc.meta().map_err(|e| (Some(at("kind")), e))?;
    if meta.kind.is_empty() || meta.api_version.is_empty() {
        return Err((Some(at("kind")), "not a Kubernetes object: apiVersion and kind are required".into()));
    }
    let (group, version) = meta.api_version.rsplit_once('/').unwrap_or(("", &meta.api_version));
    match (group, version, meta.kind.as_str()) {
        (_, _, "List") | (_, _, "ServiceImportList") | (_, _, "EndpointSliceList") => {
            let serde_yaml_ng::Value::Mapping(mut map) = doc.into_value().map_err(|e| (None, e))? else {
                return Err((None, "a List must be a mapping".into()));
            };
            let items = map.remove("items").unwrap_or(serde_yaml_ng::Value::Null);
            let items = match items {
                serde_yaml_ng::Value::Sequence(items) => items,
                serde_yaml_ng::Value::Null => Vec::new(),
                _ => {
                    return Err((Some(at("items")), "a List's items must be a sequence".into()));
                }
            };
            for (i, item) in items.into_iter().enumerate() {
                add_object(parsed, Doc::Yaml(item), &at(&format!("items[{i}]")), interop)?;
            }
        }
        (MCS_GROUP, v, "ServiceImport") if MCS_VERSIONS.contains(&v) => {
            let obj: crd::ServiceImport = typed(doc, path)?;
            match interop::service_import(&obj, interop) {
                Ok(import) => parsed.objects.push(Object::Import(import)),
                Err(e) => parsed.skipped.push(e),
            }
        }
        ("", "v1", "Service") if interop.any() => {
            let obj: Service = typed(doc, path)?;
            match interop::backing_service(&obj, interop) {
                Ok(Some(service)) => parsed.objects.push(Object::Service(service)),
                Ok(None) => *parsed.ignored.entry("v1/Service".into()).or_default() += 1,
                Err(e) => parsed.skipped.push(e),
            }
        }
        ("discovery.k8s.io", "v1", "EndpointSlice") => {
            let obj: EndpointSlice = typed(doc, path)?;
            let mcs = obj.metadata.labels.as_ref().is_some_and(|l| l.contains_key(LABEL_SERVICE_NAME));
            let converted = if mcs || !interop.any() {
                convert::endpoint_slice(&obj).map(Some)
            } else {
                interop::foreign_slice(&obj, interop)
            };
            match converted {
                Ok(None) => *parsed.ignored.entry("EndpointSlice (not MCS)".into()).or_default() += 1,
                Ok(Some(SliceOutcome::Endpoints(set))) => parsed.objects.push(Object::Slice(set)),
                Ok(Some(SliceOutcome::Fqdn)) => {
                    *parsed.ignored.entry("EndpointSlice (FQDN)".into()).or_default() += 1
                }
                Err(e) => parsed.skipped.push(e),
            }
        }
        _ => *parsed.ignored.entry(format!("{}/{}", meta.api_version, meta.kind)).or_default() += 1,
    }
    Ok(())
}

/// Deserializes a typed object, naming the failing field.
fn typed<T: serde::de::DeserializeOwned>(doc: Doc<'_>, path: &str) -> Result<T, (Option<String>, String)> {
    let result = match doc {
        Doc::Yaml(value) => serde_path_to_error::deserialize(value)
            .map_err(|e| (e.path().to_string(), e.into_inner().to_string())),
        // No path here: a JSON text with any error is read again as YAML
        // (see `parse_json`), which names the field. Tracking the path of
        // every value cost about a sixth of the CPU of reading a large text.
        Doc::Json(text) => serde_json::from_str(text).map_err(|e| (".".to_owned(), e.to_string())),
    };
    result.map_err(|(inner, message)| {
        let field = match (path.is_empty(), inner.as_str()) {
            (_, ".") => path.to_owned(),
            (true, _) => inner,
            (false, _) => format!("{path}.{inner}"),
        };
        (Some(field).filter(|f| !f.is_empty()), message)
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    const IMPORT: &str = "apiVersion: multicluster.x-k8s.io/v1beta1
kind: ServiceImport
metadata: {name: web, namespace: shop}
spec: {type: ClusterSetIP, ips: [10.0.0.1], ports: [{name: http, protocol: TCP, port: 80}]}
";

    #[test]
    fn multi_document_text_with_lists_and_other_kinds() {
        let text = format!(
            "{IMPORT}---\napiVersion: v1\nkind: List\nitems:\n- apiVersion: v1\n  kind: Service\n  metadata: {{name: x}}\n- {}\n---\n",
            IMPORT.replace("v1beta1", "v1alpha1").replace("web", "api").replace('\n', "\n  ").trim_end()
        );
        let p = parse(&text, "t.yaml").unwrap();
        assert_eq!(p.objects.len(), 2);
        assert_eq!(p.ignored.get("v1/Service"), Some(&1));
        assert!(p.skipped.is_empty());
    }

    #[test]
    fn json_documents_read_as_json_give_what_yaml_gives() {
        let slice = r#"{"apiVersion":"discovery.k8s.io/v1","kind":"EndpointSlice","metadata":{"name":"web-a","namespace":"shop","labels":{"multicluster.kubernetes.io/service-name":"web","multicluster.kubernetes.io/source-cluster":"a"}},"addressType":"IPv4","ports":[{"name":"http","protocol":"TCP","port":8080}],"endpoints":[{"addresses":["10.1.0.1"],"conditions":{"ready":true},"hostname":"w-0"}]}"#;
        let import = r#"{"apiVersion":"multicluster.x-k8s.io/v1alpha1","kind":"ServiceImport","metadata":{"name":"web","namespace":"shop"},"spec":{"type":"ClusterSetIP","ips":["10.0.0.1"],"ports":[{"name":"http","protocol":"TCP","port":80}]}}"#;
        let other = r#"{"apiVersion":"v1","kind":"ConfigMap","metadata":{"name":"x"}}"#;
        let text = format!("---\n{slice}\n---\n{import}\n---\n\n---\n{other}\n");
        let docs = json_documents(&text).expect("every document is JSON");
        assert_eq!(docs.len(), 3);
        let fast = parse_json(&docs, Interop::NONE).expect("valid JSON");
        let yaml = parse_yaml(&text, "t", Interop::NONE).unwrap();
        assert_eq!(fast.objects, yaml.objects);
        assert_eq!(fast.ignored, yaml.ignored);
        assert_eq!(fast.objects.len(), 2);
        // One YAML document among them: all of it is read as YAML.
        assert!(json_documents(&format!("{text}---\n{IMPORT}")).is_none());
        assert_eq!(parse(&format!("{text}---\n{IMPORT}"), "t").unwrap().objects.len(), 3);
    }

    #[test]
    fn a_json_document_with_an_error_is_reported_as_yaml_reports_it() {
        let bad = r#"{"apiVersion":"multicluster.x-k8s.io/v1alpha1","kind":"ServiceImport","metadata":{"name":"web","namespace":"shop"},"spec":{"type":"Headless","ports":[{"port":"eighty"}]}}"#;
        let good = r#"{"apiVersion":"v1","kind":"ConfigMap","metadata":{"name":"x"}}"#;
        let text = format!("{good}\n---\n{bad}\n");
        let e = parse(&text, "t.json").unwrap_err();
        assert_eq!(e, parse_yaml(&text, "t.json", Interop::NONE).unwrap_err());
        assert_eq!((e.document, e.field.as_deref()), (2, Some("spec.ports[0].port")), "{e}");
    }

    #[test]
    fn json_documents_parse_too() {
        let json = r#"{"apiVersion":"multicluster.x-k8s.io/v1alpha1","kind":"ServiceImport","metadata":{"name":"web","namespace":"shop"},"spec":{"type":"Headless"}}"#;
        assert_eq!(parse(json, "t.json").unwrap().objects.len(), 1);
    }

    #[test]
    fn a_wrongly_typed_field_fails_the_text_naming_document_and_field() {
        let text = format!("{IMPORT}---\n{}", IMPORT.replace("port: 80", "port: eighty"));
        let e = parse(&text, "t.yaml").unwrap_err();
        assert_eq!(e.document, 2);
        assert_eq!(e.field.as_deref(), Some("spec.ports[0].port"));
        assert!(e.to_string().starts_with("t.yaml: document 2, field spec.ports[0].port: "), "{e}");
    }

    #[test]
    fn yaml_syntax_errors_fail_the_text() {
        let e = parse("kind: [unclosed", "t.yaml").unwrap_err();
        assert_eq!(e.document, 1);
    }

    #[test]
    fn an_invalid_object_is_skipped_and_the_rest_served() {
        let text = format!("{IMPORT}---\n{}", IMPORT.replace("web", "bad").replace("10.0.0.1", "10.0.0.999"));
        let p = parse(&text, "t.yaml").unwrap();
        assert_eq!(p.objects.len(), 1);
        assert_eq!(p.skipped.len(), 1);
        assert!(p.skipped[0].to_string().contains("shop/bad"));
    }

    #[test]
    fn documents_without_kind_are_errors() {
        let e = parse("foo: bar\n", "t.yaml").unwrap_err();
        assert_eq!(e.field.as_deref(), Some("kind"));
    }
}
