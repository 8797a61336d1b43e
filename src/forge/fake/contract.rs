//! Checks a request against Forgejo's official API spec (`tests/fixtures/forgejo/
//! swagger.v1.json`, Swagger 2.0, v15.0.3): the method and path template exist, every query
//! parameter is declared with the right type, and the JSON body fits the declared schema
//! (required fields present, types right, no field the spec does not know).

use std::sync::OnceLock;

use serde_json::Value;

pub const SPEC_PATH: &str = concat!(
    env!("CARGO_MANIFEST_DIR"),
    "/tests/fixtures/forgejo/swagger.v1.json"
);

struct Operation {
    method: String,
    template: String,
    segments: Vec<String>,
    params: Vec<Value>,
}

pub struct Spec {
    operations: Vec<Operation>,
    definitions: Value,
    base_path: String,
}

static SPEC: OnceLock<Result<Spec, String>> = OnceLock::new();

pub fn spec() -> Result<&'static Spec, String> {
    SPEC.get_or_init(load).as_ref().map_err(Clone::clone)
}

fn load() -> Result<Spec, String> {
    let text = std::fs::read_to_string(SPEC_PATH).map_err(|e| format!("{SPEC_PATH}: {e}"))?;
    let doc: Value = serde_json::from_str(&text).map_err(|e| format!("{SPEC_PATH}: {e}"))?;
    let mut operations = Vec::new();
    for (template, item) in doc["paths"].as_object().into_iter().flatten() {
        let shared: Vec<Value> = item["parameters"].as_array().cloned().unwrap_or_default();
        for (method, op) in item.as_object().into_iter().flatten() {
            if method == "parameters" {
                continue;
            }
            let mut params = shared.clone();
            params.extend(op["parameters"].as_array().cloned().unwrap_or_default());
            operations.push(Operation {
                method: method.to_ascii_uppercase(),
                template: template.clone(),
                segments: template
                    .trim_matches('/')
                    .split('/')
                    .map(str::to_owned)
                    .collect(),
                params,
            });
        }
    }
    Ok(Spec {
        operations,
        definitions: doc["definitions"].clone(),
        base_path: doc["basePath"].as_str().unwrap_or("/api/v1").to_owned(),
    })
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
        let segments: Vec<&str> = path.trim_matches('/').split('/').collect();
        let mut best: Option<(&Operation, usize)> = None;
        for op in self.operations.iter().filter(|o| o.method == method) {
            if op.segments.len() != segments.len() {
                continue;
            }
            let mut literal = 0;
            let fits = op.segments.iter().zip(&segments).all(|(t, s)| {
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
        let body_param = op.params.iter().find(|p| p["in"] == "body");
        match (body_param, body) {
            (None, Some(_)) => return Err(format!("{at}: takes no body")),
            (Some(p), None) if p["required"] == true => return Err(format!("{at}: body required")),
            (Some(p), Some(body)) => self.fits(&p["schema"], body, &format!("{at} body"))?,
            _ => {}
        }
        Ok(&op.template)
    }

    fn resolve<'a>(&'a self, schema: &'a Value) -> &'a Value {
        match schema["$ref"]
            .as_str()
            .and_then(|r| r.strip_prefix("#/definitions/"))
        {
            Some(name) => &self.definitions[name],
            None => schema,
        }
    }

    fn fits(&self, schema: &Value, value: &Value, at: &str) -> Result<(), String> {
        let schema = self.resolve(schema);
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
        if let (Some(obj), Some(props)) = (value.as_object(), schema["properties"].as_object()) {
            for (key, v) in obj {
                let prop = props
                    .get(key)
                    .ok_or_else(|| format!("{at}: unknown field `{key}`"))?;
                self.fits(prop, v, &format!("{at}.{key}"))?;
            }
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
}
