//! JSON-schema validation of agent outputs and run inputs.

use serde_json::Value;

/// Validates `value` against `schema`; the error lists up to ten violations with their paths.
pub fn validate(schema: &Value, value: &Value) -> Result<(), String> {
    let validator =
        jsonschema::validator_for(schema).map_err(|e| format!("invalid schema: {e}"))?;
    let errors: Vec<String> = validator
        .iter_errors(value)
        .map(|e| format!("{} at `{}`", e, e.instance_path))
        .take(10)
        .collect();
    if errors.is_empty() {
        Ok(())
    } else {
        Err(format!("output breaks the schema: {}", errors.join("; ")))
    }
}

#[cfg(test)]
mod tests {
    use super::validate;
    use serde_json::json;

    #[test]
    fn schema_violations_are_listed() {
        let schema =
            json!({"type": "object", "required": ["a"], "properties": {"a": {"type": "string"}}});
        assert!(validate(&schema, &json!({"a": "x"})).is_ok());
        let err = validate(&schema, &json!({"a": 1})).unwrap_err();
        assert!(err.contains("/a"), "{err}");
    }
}
