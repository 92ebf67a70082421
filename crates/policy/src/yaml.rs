//! YAML documents read into JSON values, with yaml-rust2's event parser (pure Rust; no copy of
//! libyaml in the binary).
//!
//! A policy file is data, so only data is accepted: anchors and aliases (`&a`, `*a`), which
//! can make a few lines expand to gigabytes, are refused, as are tags other than the core
//! schema's (`!!str`, `!!int`, `!!float`, `!!bool`, `!!null`, `!!map`, `!!seq`), mapping
//! keys that are not scalars, keys given twice in one mapping (one of them would be dropped
//! without a word) and nesting deeper than [`MAX_DEPTH`]. Plain scalars are typed as YAML
//! 1.2's core schema types them (`null`, `~`, booleans, integers, floats; everything else a
//! string); quoted and block scalars are strings.

use serde_json::{Map, Number, Value};
use yaml_rust2::parser::{Event, MarkedEventReceiver, Parser, Tag};
use yaml_rust2::scanner::{Marker, TScalarStyle};
use yaml_rust2::Yaml;

/// Deepest nesting of mappings and sequences accepted (a NetworkPolicy needs 7).
pub const MAX_DEPTH: usize = 64;

/// A document that is not YAML, or YAML this reader refuses: the message names what and where.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{message}")]
pub struct YamlError {
    /// 1-based document number.
    pub doc: usize,
    pub message: String,
}

/// Every document of `input`, in order (an empty document is `null`).
pub fn documents(input: &str) -> Result<Vec<Value>, YamlError> {
    let mut b = Builder::default();
    let mut parser = Parser::new_from_str(input);
    let parsed = parser.load(&mut b, true);
    if let Some(e) = b.error {
        return Err(e);
    }
    parsed.map_err(|e| YamlError {
        doc: b.docs.len() + 1,
        message: e.to_string(),
    })?;
    Ok(b.docs)
}

enum Open {
    Seq(Vec<Value>),
    Map(Map<String, Value>, Option<String>),
}

#[derive(Default)]
struct Builder {
    docs: Vec<Value>,
    /// Documents started so far.
    started: usize,
    stack: Vec<Open>,
    error: Option<YamlError>,
}

impl Builder {
    fn fail(&mut self, mark: Marker, message: String) {
        if self.error.is_none() {
            self.error = Some(YamlError {
                doc: self.docs.len() + 1,
                message: format!(
                    "{message} (line {}, column {})",
                    mark.line(),
                    mark.col() + 1
                ),
            });
        }
    }

    /// Puts a finished value into what is open (or ends the document with it).
    fn put(&mut self, v: Value, mark: Marker) {
        match self.stack.last_mut() {
            None => self.docs.push(v),
            Some(Open::Seq(items)) => items.push(v),
            Some(Open::Map(m, key)) => match key.take() {
                Some(k) => {
                    m.insert(k, v);
                }
                None => {
                    let k = match v {
                        Value::String(s) => s,
                        Value::Number(n) => n.to_string(),
                        Value::Bool(b) => b.to_string(),
                        Value::Null => "null".to_string(),
                        _ => {
                            return self.fail(
                                mark,
                                "a mapping key must be a scalar, not a mapping or sequence".into(),
                            )
                        }
                    };
                    if m.contains_key(&k) {
                        return self.fail(mark, format!("key {k:?} appears twice in one mapping"));
                    }
                    *key = Some(k);
                }
            },
        }
    }

    fn open(&mut self, o: Open, anchor: usize, tag: Option<Tag>, want: &str, mark: Marker) {
        if anchor != 0 {
            return self.fail(mark, "YAML anchors (&name) are not accepted".into());
        }
        if let Some(t) = tag {
            if !is_core(&t, want) {
                return self.fail(mark, format!("YAML tag {} is not accepted here", show(&t)));
            }
        }
        if self.stack.len() >= MAX_DEPTH {
            return self.fail(mark, format!("nested deeper than {MAX_DEPTH} levels"));
        }
        self.stack.push(o);
    }

    fn scalar(
        &mut self,
        s: String,
        style: TScalarStyle,
        tag: Option<Tag>,
    ) -> Result<Value, String> {
        let core = |n: &str| tag.as_ref().is_some_and(|t| is_core(t, n));
        if let Some(t) = &tag {
            if !["str", "int", "float", "bool", "null"]
                .iter()
                .any(|n| is_core(t, n))
            {
                return Err(format!("YAML tag {} is not accepted here", show(t)));
            }
        }
        if core("str") || (tag.is_none() && style != TScalarStyle::Plain) {
            return Ok(Value::String(s));
        }
        let v = match Yaml::from_str(&s) {
            Yaml::Null => Value::Null,
            Yaml::Boolean(b) => Value::Bool(b),
            Yaml::Integer(i) => Value::Number(i.into()),
            Yaml::Real(r) => {
                let f = r
                    .parse::<f64>()
                    .ok()
                    .or(match r.as_str() {
                        ".inf" | ".Inf" | ".INF" | "+.inf" => Some(f64::INFINITY),
                        _ => None,
                    })
                    .unwrap_or(f64::NAN);
                Value::Number(
                    Number::from_f64(f).ok_or_else(|| format!("{s:?} is not a finite number"))?,
                )
            }
            _ => Value::String(s.clone()),
        };
        let fits = match &v {
            Value::Null => !core("int") && !core("float") && !core("bool"),
            Value::Bool(_) => !core("int") && !core("float") && !core("null"),
            Value::Number(n) => !core("bool") && !core("null") && (!core("int") || n.is_i64()),
            _ => tag.is_none(),
        };
        if !fits {
            return Err(format!(
                "{s:?} is not a {}",
                tag.as_ref().map(show).unwrap_or_default()
            ));
        }
        Ok(v)
    }
}

impl MarkedEventReceiver for Builder {
    fn on_event(&mut self, ev: Event, mark: Marker) {
        if self.error.is_some() {
            return;
        }
        match ev {
            Event::Alias(_) => self.fail(mark, "YAML aliases (*name) are not accepted".into()),
            Event::Scalar(s, style, anchor, tag) => {
                if anchor != 0 {
                    return self.fail(mark, "YAML anchors (&name) are not accepted".into());
                }
                match self.scalar(s, style, tag) {
                    Ok(v) => self.put(v, mark),
                    Err(m) => self.fail(mark, m),
                }
            }
            Event::SequenceStart(anchor, tag) => {
                self.open(Open::Seq(Vec::new()), anchor, tag, "seq", mark)
            }
            Event::MappingStart(anchor, tag) => {
                self.open(Open::Map(Map::new(), None), anchor, tag, "map", mark)
            }
            Event::SequenceEnd | Event::MappingEnd => match self.stack.pop() {
                Some(Open::Seq(items)) => self.put(Value::Array(items), mark),
                Some(Open::Map(m, _)) => self.put(Value::Object(m), mark),
                None => self.fail(mark, "unbalanced YAML events".into()),
            },
            Event::DocumentEnd => {
                // A document with no node at all (`---` alone) is null.
                if self.docs.len() < self.started {
                    self.docs.push(Value::Null);
                }
            }
            Event::DocumentStart => self.started += 1,
            Event::Nothing | Event::StreamStart | Event::StreamEnd => {}
        }
    }
}

/// Whether `t` is the core schema's tag `name` (`!!name`).
fn is_core(t: &Tag, name: &str) -> bool {
    (t.handle == "tag:yaml.org,2002:" || t.handle == "!!") && t.suffix == name
}

fn show(t: &Tag) -> String {
    if t.handle == "tag:yaml.org,2002:" {
        format!("!!{}", t.suffix)
    } else {
        format!("{}{}", t.handle, t.suffix)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn one(s: &str) -> Value {
        let mut d = documents(s).unwrap();
        assert_eq!(d.len(), 1, "{d:?}");
        d.remove(0)
    }

    fn refused(s: &str) -> String {
        documents(s).unwrap_err().message
    }

    #[test]
    fn core_schema_scalars_and_documents() {
        assert_eq!(
            one("a: 1\nb: -2\nc: 1.5\nd: true\ne: null\nf: ~\ng: '80'\nh: \"x\"\ni: abc\nj: 0x10\nk:\n"),
            json!({"a": 1, "b": -2, "c": 1.5, "d": true, "e": null, "f": null, "g": "80",
                   "h": "x", "i": "abc", "j": 16, "k": null})
        );
        assert_eq!(
            one("- [1, two]\n- {x: y}\n- |\n  text\n"),
            json!([[1, "two"], {"x": "y"}, "text\n"])
        );
        assert_eq!(one("p: !!str 80\nq: !!int 3\n"), json!({"p": "80", "q": 3}));
        assert_eq!(
            documents("a: 1\n---\nb: 2\n---\n").unwrap(),
            vec![json!({"a": 1}), json!({"b": 2}), Value::Null]
        );
        assert_eq!(documents("").unwrap(), Vec::<Value>::new());
        assert_eq!(one("1: x\ntrue: y\n"), json!({"1": "x", "true": "y"}));
    }

    #[test]
    fn refuses_what_a_policy_file_never_needs() {
        assert!(
            refused("a: &x [1]\nb: *x\n").contains("anchors"),
            "{}",
            refused("a: &x [1]\nb: *x\n")
        );
        assert!(refused("a: *x\n").contains("alias") || refused("a: *x\n").contains("anchor"));
        assert!(refused("a: !custom 1\n").contains("tag !custom"));
        assert!(refused("a: !!int abc\n").contains("not a !!int"));
        assert!(refused("a: 1\na: 2\n").contains("\"a\" appears twice"));
        assert!(refused("? [1]\n: x\n").contains("must be a scalar"));
        assert!(refused("a: .nan\n").contains("finite"));
        let deep = format!(
            "{}1{}",
            "[".repeat(MAX_DEPTH + 1),
            "]".repeat(MAX_DEPTH + 1)
        );
        assert!(refused(&deep).contains("deeper than 64"));
        let ok = format!("{}1{}", "[".repeat(MAX_DEPTH), "]".repeat(MAX_DEPTH));
        documents(&ok).unwrap();
    }

    #[test]
    fn errors_name_the_document_and_the_place() {
        let e = documents("a: 1\n---\nb: [1\n").unwrap_err();
        assert_eq!(e.doc, 2, "{e:?}");
        let e = documents("a: 1\n---\nb: 1\nb: 2\n").unwrap_err();
        assert_eq!(e.doc, 2, "{e:?}");
        assert!(e.message.contains("line 4"), "{e:?}");
    }
}
