//! Checks a request against an official API description: Forgejo's (`tests/fixtures/forgejo/
//! swagger.v1.json`, Swagger 2.0, v15.0.3) or GitHub's (`tests/fixtures/github/
//! api.github.com.subset.json`, OpenAPI 3.0.3): the method and path template exist, every
//! query parameter is declared with the right type (and value, for an enum), and the JSON
//! body fits the declared schema (required fields present, types and enum values right,
//! `oneOf` / `anyOf` / `allOf` followed, no field the description does not know).

use std::sync::OnceLock;

use serde_json::Value;

pub const SPEC_PATH: &str = concat!(
    env!("CARGO_MANIFEST_DIR"),
    "/../tests/fixtures/forgejo/swagger.v1.json"
);

struct Operation {
    method: String,
    template: String,
    segments: Vec<String>,
    /// Path and query parameters, each with its `type` (and `enum`, `maximum`) at the top.
    params: Vec<Value>,
    /// The JSON body's schema, and whether a body is required.
    body: Option<(Value, bool)>,
}

pub struct Spec {
    operations: Vec<Operation>,
    /// Where `$ref`s point: Swagger's `definitions`, OpenAPI's `components.schemas`.
    schemas: Value,
    ref_prefix: &'static str,
    base_path: String,
}

static SPEC: OnceLock<Result<Spec, String>> = OnceLock::new();

/// Forgejo's.
pub fn spec() -> Result<&'static Spec, String> {
    SPEC.get_or_init(|| Spec::load(SPEC_PATH))
        .as_ref()
        .map_err(Clone::clone)
}

fn type_fits(kind: &str, value: &str) -> bool {
    match kind {
        "integer" => value.parse::<i64>().is_ok(),
        "number" => value.parse::<f64>().is_ok(),
        "boolean" => value == "true" || value == "false",
        _ => true,
    }
}

impl Spec {
    /// A Swagger 2.0 or OpenAPI 3 description in JSON.
    pub fn load(path: &str) -> Result<Self, String> {
        let text = std::fs::read_to_string(path).map_err(|e| format!("{path}: {e}"))?;
        let doc: Value = serde_json::from_str(&text).map_err(|e| format!("{path}: {e}"))?;
        let openapi = doc.get("openapi").is_some();
        // An OpenAPI parameter may be a `$ref` into `components.parameters`, and keeps its
        // type under `schema`: both are brought to Swagger's shape here.
        let param = |p: &Value| -> Value {
            let p = match p["$ref"].as_str() {
                Some(r) => {
                    doc["components"]["parameters"][r.rsplit('/').next().unwrap_or("")].clone()
                }
                None => p.clone(),
            };
            if !openapi {
                return p;
            }
            let mut flat = p.clone();
            for key in ["type", "enum", "maximum"] {
                if !p["schema"][key].is_null() {
                    flat[key] = p["schema"][key].clone();
                }
            }
            flat
        };
        let mut operations = Vec::new();
        for (template, item) in doc["paths"].as_object().into_iter().flatten() {
            let shared: Vec<Value> = item["parameters"]
                .as_array()
                .into_iter()
                .flatten()
                .map(param)
                .collect();
            for (method, op) in item.as_object().into_iter().flatten() {
                if method == "parameters" {
                    continue;
                }
                let mut params = shared.clone();
                params.extend(op["parameters"].as_array().into_iter().flatten().map(param));
                let body = if openapi {
                    let schema = &op["requestBody"]["content"]["application/json"]["schema"];
                    (!schema.is_null())
                        .then(|| (schema.clone(), op["requestBody"]["required"] == true))
                } else {
                    params
                        .iter()
                        .find(|p| p["in"] == "body")
                        .map(|p| (p["schema"].clone(), p["required"] == true))
                };
                operations.push(Operation {
                    method: method.to_ascii_uppercase(),
                    template: template.clone(),
                    segments: template
                        .trim_matches('/')
                        .split('/')
                        .map(str::to_owned)
                        .collect(),
                    params,
                    body,
                });
            }
        }
        Ok(if openapi {
            Spec {
                operations,
                schemas: doc["components"]["schemas"].clone(),
                ref_prefix: "#/components/schemas/",
                base_path: String::new(),
            }
        } else {
            Spec {
                operations,
                schemas: doc["definitions"].clone(),
                ref_prefix: "#/definitions/",
                base_path: doc["basePath"].as_str().unwrap_or("/api/v1").to_owned(),
            }
        })
    }

    /// The path template a request matches, or why none does. `path` is below the base path
    /// and already percent-decoded per segment.
    pub fn check(
        &self,
        method: &str,
        path: &str,
        query: &[(String, String)],
        body: Option<&Value>,
    ) -> Result<&str, String> {
        let path = path.strip_prefix(&self.base_path).unwrap_or(path);
        let segments: Vec<String> = path
            .trim_matches('/')
            .split('/')
            .map(str::to_owned)
            .collect();
        self.check_segments(method, &segments, query, body)
    }

    /// The same for a path already split into percent-decoded segments (a segment may hold
    /// a `/`). A last `{ref}` or `{path}` parameter takes the rest of the path.
    pub fn check_segments(
        &self,
        method: &str,
        segments: &[String],
        query: &[(String, String)],
        body: Option<&Value>,
    ) -> Result<&str, String> {
        let path = format!("/{}", segments.join("/"));
        let mut best: Option<(&Operation, usize)> = None;
        for op in self.operations.iter().filter(|o| o.method == method) {
            let greedy = op
                .segments
                .last()
                .is_some_and(|l| l == "{ref}" || l == "{path}");
            let fits_len = if greedy {
                segments.len() >= op.segments.len()
            } else {
                segments.len() == op.segments.len()
            };
            if !fits_len {
                continue;
            }
            let mut literal = 0;
            let fits = op.segments.iter().zip(segments).all(|(t, s)| {
                if let Some(name) = t.strip_prefix('{').and_then(|t| t.strip_suffix('}')) {
                    let kind = op
                        .params
                        .iter()
                        .find(|p| p["in"] == "path" && p["name"] == name)
                        .and_then(|p| p["type"].as_str())
                        .unwrap_or("string");
                    !s.is_empty() && type_fits(kind, s)
                } else {
                    literal += 1;
                    t == s
                }
            });
            if fits && best.is_none_or(|(_, l)| literal > l) {
                best = Some((op, literal));
            }
        }
        let (op, _) =
            best.ok_or_else(|| format!("{method} {path}: no such operation in the spec"))?;
        let at = format!("{method} {}", op.template);
        for (name, value) in query {
            let param = op
                .params
                .iter()
                .find(|p| p["in"] == "query" && p["name"] == name.as_str())
                .ok_or_else(|| format!("{at}: undeclared query parameter `{name}`"))?;
            let kind = param["type"].as_str().unwrap_or("string");
            if !type_fits(kind, value) {
                return Err(format!("{at}: query `{name}={value}` is not {kind}"));
            }
            if let Some(allowed) = param["enum"].as_array()
                && !allowed.iter().any(|a| a.as_str() == Some(value))
            {
                return Err(format!(
                    "{at}: query `{name}={value}` is not one of {allowed:?}"
                ));
            }
            if let Some(max) = param["maximum"].as_i64()
                && value.parse::<i64>().is_ok_and(|v| v > max)
            {
                return Err(format!("{at}: query `{name}={value}` is over {max}"));
            }
        }
        for p in op
            .params
            .iter()
            .filter(|p| p["in"] == "query" && p["required"] == true)
        {
            let name = p["name"].as_str().unwrap_or_default();
            if !query.iter().any(|(n, _)| n == name) {
                return Err(format!("{at}: required query parameter `{name}` missing"));
            }
        }
        match (&op.body, body) {
            (None, Some(_)) => return Err(format!("{at}: takes no body")),
            (Some((_, true)), None) => return Err(format!("{at}: body required")),
            (Some((schema, _)), Some(body)) => self.fits(schema, body, &format!("{at} body"))?,
            _ => {}
        }
        Ok(&op.template)
    }

    fn resolve<'a>(&'a self, schema: &'a Value) -> &'a Value {
        match schema["$ref"]
            .as_str()
            .and_then(|r| r.strip_prefix(self.ref_prefix))
        {
            Some(name) => &self.schemas[name],
            None => schema,
        }
    }

    fn fits(&self, schema: &Value, value: &Value, at: &str) -> Result<(), String> {
        let schema = self.resolve(schema);
        for (key, any) in [("oneOf", true), ("anyOf", true), ("allOf", false)] {
            if let Some(options) = schema[key].as_array() {
                let results: Vec<Result<(), String>> =
                    options.iter().map(|o| self.fits(o, value, at)).collect();
                let ok = if any {
                    results.iter().any(Result::is_ok)
                } else {
                    results.iter().all(Result::is_ok)
                };
                return if ok {
                    Ok(())
                } else {
                    Err(results
                        .into_iter()
                        .find_map(Result::err)
                        .unwrap_or_else(|| format!("{at}: fits no `{key}` option")))
                };
            }
        }
        if value.is_null() && (schema["nullable"] == true || schema["x-nullable"] == true) {
            return Ok(());
        }
        let kind = schema["type"].as_str().unwrap_or("");
        let ok = match kind {
            "object" => value.is_object(),
            "array" => value.is_array(),
            "string" => value.is_string(),
            "integer" => value.is_i64() || value.is_u64(),
            "number" => value.is_number(),
            "boolean" => value.is_boolean(),
            _ => true,
        };
        if !ok {
            return Err(format!("{at}: expected {kind}, got {value}"));
        }
        if let (Some(allowed), Some(v)) = (schema["enum"].as_array(), value.as_str())
            && !allowed.iter().any(|a| a.as_str() == Some(v))
        {
            return Err(format!("{at}: `{v}` is not one of {allowed:?}"));
        }
        if let (Some(obj), Some(props)) = (value.as_object(), schema["properties"].as_object()) {
            for (key, v) in obj {
                let prop = props
                    .get(key)
                    .ok_or_else(|| format!("{at}: unknown field `{key}`"))?;
                self.fits(prop, v, &format!("{at}.{key}"))?;
            }
        }
        if let Some(obj) = value.as_object() {
            for req in schema["required"].as_array().into_iter().flatten() {
                let name = req.as_str().unwrap_or_default();
                if !obj.contains_key(name) {
                    return Err(format!("{at}: required field `{name}` missing"));
                }
            }
        }
        if let (Some(items), Some(arr)) = (schema.get("items"), value.as_array()) {
            for (i, v) in arr.iter().enumerate() {
                self.fits(items, v, &format!("{at}[{i}]"))?;
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn q(pairs: &[(&str, &str)]) -> Vec<(String, String)> {
        pairs
            .iter()
            .map(|(a, b)| (a.to_string(), b.to_string()))
            .collect()
    }

    #[test]
    fn real_requests_fit_and_wrong_ones_do_not() {
        let spec = spec().expect("spec loads");
        assert_eq!(
            spec.check(
                "GET",
                "/api/v1/repos/a/b/issues",
                &q(&[("labels", "x"), ("page", "2")]),
                None
            ),
            Ok("/repos/{owner}/{repo}/issues")
        );
        assert_eq!(
            spec.check(
                "PATCH",
                "/api/v1/repos/a/b/issues/comments/5",
                &[],
                Some(&json!({"body": "x"}))
            ),
            Ok("/repos/{owner}/{repo}/issues/comments/{id}")
        );
        assert!(
            spec.check(
                "GET",
                "/api/v1/repos/a/b/issues",
                &q(&[("page", "two")]),
                None
            )
            .is_err()
        );
        assert!(
            spec.check(
                "GET",
                "/api/v1/repos/a/b/issues",
                &q(&[("labelz", "x")]),
                None
            )
            .is_err()
        );
        assert!(
            spec.check("GET", "/api/v1/repos/a/b/issues/x", &[], None)
                .is_err()
        );
        assert!(spec.check("PUT", "/api/v1/user", &[], None).is_err());
        assert!(
            spec.check(
                "POST",
                "/api/v1/repos/a/b/labels",
                &[],
                Some(&json!({"name": "x"}))
            )
            .is_err(),
            "color is required"
        );
        assert!(
            spec.check(
                "POST",
                "/api/v1/repos/a/b/labels",
                &[],
                Some(&json!({"name": "x", "color": "#fff", "colour": 1}))
            )
            .is_err()
        );
        assert!(
            spec.check(
                "POST",
                "/api/v1/repos/a/b/issues/1/comments",
                &[],
                Some(&json!({"body": 5}))
            )
            .is_err()
        );
    }

    #[test]
    fn github_s_openapi_description_is_read_too() {
        let spec = Spec::load(concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/../tests/fixtures/github/api.github.com.subset.json"
        ))
        .expect("loads");
        let seg = |p: &str| -> Vec<String> { p.split('/').map(str::to_owned).collect() };
        assert_eq!(
            spec.check_segments(
                "POST",
                &seg("repos/a/b/issues/1/labels"),
                &[],
                Some(&json!({"labels": ["x"]}))
            ),
            Ok("/repos/{owner}/{repo}/issues/{issue_number}/labels")
        );
        assert!(
            spec.check_segments(
                "POST",
                &seg("app/installations/7/access_tokens"),
                &[],
                Some(&json!({"permissions": {"contents": "writ"}}))
            )
            .is_err(),
            "an enum value GitHub does not know"
        );
        assert!(
            spec.check_segments(
                "POST",
                &seg("app/installations/7/access_tokens"),
                &[],
                Some(&json!({"repositories": ["w"], "permissions": {"contents": "write"}}))
            )
            .is_ok()
        );
        // A branch name with slashes, as one segment or as the rest of a ref.
        assert!(
            spec.check_segments(
                "GET",
                &[
                    "repos".into(),
                    "a".into(),
                    "b".into(),
                    "branches".into(),
                    "x/y".into()
                ],
                &[],
                None
            )
            .is_ok()
        );
        assert!(
            spec.check_segments("GET", &seg("repos/a/b/git/ref/heads/x/y"), &[], None)
                .is_ok()
        );
        assert!(
            spec.check_segments(
                "GET",
                &seg("repos/a/b/issues"),
                &q(&[("labelz", "x")]),
                None
            )
            .is_err()
        );
        assert!(
            spec.check_segments("GET", &seg("repos/a/b/issues/x"), &[], None)
                .is_err()
        );
    }
}
