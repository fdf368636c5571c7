//! Printing benchmark figures: a table for people, one JSON object for
//! scripts.

use comfy_table::{Table, presets::UTF8_BORDERS_ONLY};

/// Prints `fields` as one JSON object (`json`) or as a two-column table.
pub fn print_figures<K: AsRef<str>>(title: &str, fields: &[(K, f64)], json: bool) {
    if json {
        let map: serde_json::Map<String, serde_json::Value> = fields
            .iter()
            .map(|(k, v)| {
                let value = if v.fract() == 0.0 && v.abs() < 1e15 {
                    serde_json::Value::from(*v as i64)
                } else {
                    serde_json::Number::from_f64((v * 100.0).round() / 100.0)
                        .map_or(serde_json::Value::Null, serde_json::Value::Number)
                };
                (k.as_ref().to_owned(), value)
            })
            .collect();
        println!("{}", serde_json::Value::Object(map));
        return;
    }
    let mut table = Table::new();
    table.load_preset(UTF8_BORDERS_ONLY).set_header(vec![title, ""]);
    for (k, v) in fields {
        let shown = if v.fract() == 0.0 { format!("{v:.0}") } else { format!("{v:.2}") };
        table.add_row(vec![k.as_ref().to_owned(), shown]);
    }
    println!("{table}");
}
