//! A deserializer wrapper under which a struct decodes only from a JSON
//! object, at every depth.
//!
//! serde's derived `Deserialize` for a struct also accepts a sequence of
//! its field values in declaration order, and serde_json offers it one:
//! `["orders-x"]` would be a topic create of `orders-x`. Narad (Go's
//! `encoding/json`) refuses any non-object where an object is expected.
//! [`ObjectsOnly`] forwards every call to the wrapped deserializer
//! unchanged, except that `deserialize_struct` becomes `deserialize_map`
//! (which serde_json refuses for anything but `{`), and it wraps every
//! visitor, map, sequence, enum and seed it hands on, so the nested
//! deserializers (each element of a batch's `messages`, each grant) are
//! wrapped too. Borrowing (`&'de RawValue`, `&'de str`) is preserved: the
//! borrowed `visit_*` calls are forwarded as such.

use std::fmt;

use serde::de::{
    self, DeserializeSeed, Deserializer, EnumAccess, MapAccess, SeqAccess, VariantAccess, Visitor,
};

/// Wraps a deserializer: structs from objects only, at every depth.
#[derive(Debug)]
pub struct ObjectsOnly<D>(pub D);

/// What a struct's error says it expected.
const OBJECT: &str = "a JSON object";

macro_rules! forward {
    ($($method:ident)*) => {
        $(
            fn $method<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, D::Error> {
                self.0.$method(Wrap(visitor))
            }
        )*
    };
}

impl<'de, D: Deserializer<'de>> Deserializer<'de> for ObjectsOnly<D> {
    type Error = D::Error;

    forward! {
        deserialize_any deserialize_bool deserialize_i8 deserialize_i16 deserialize_i32
        deserialize_i64 deserialize_i128 deserialize_u8 deserialize_u16 deserialize_u32
        deserialize_u64 deserialize_u128 deserialize_f32 deserialize_f64 deserialize_char
        deserialize_str deserialize_string deserialize_bytes deserialize_byte_buf
        deserialize_option deserialize_unit deserialize_seq deserialize_map
        deserialize_identifier deserialize_ignored_any
    }

    fn deserialize_unit_struct<V: Visitor<'de>>(
        self,
        name: &'static str,
        visitor: V,
    ) -> Result<V::Value, D::Error> {
        self.0.deserialize_unit_struct(name, Wrap(visitor))
    }

    fn deserialize_newtype_struct<V: Visitor<'de>>(
        self,
        name: &'static str,
        visitor: V,
    ) -> Result<V::Value, D::Error> {
        self.0.deserialize_newtype_struct(name, Wrap(visitor))
    }

    fn deserialize_tuple<V: Visitor<'de>>(
        self,
        len: usize,
        visitor: V,
    ) -> Result<V::Value, D::Error> {
        self.0.deserialize_tuple(len, Wrap(visitor))
    }

    fn deserialize_tuple_struct<V: Visitor<'de>>(
        self,
        name: &'static str,
        len: usize,
        visitor: V,
    ) -> Result<V::Value, D::Error> {
        self.0.deserialize_tuple_struct(name, len, Wrap(visitor))
    }

    /// The one change: a struct is read as a map, so a sequence (or any
    /// other non-object) is an `invalid type` error.
    fn deserialize_struct<V: Visitor<'de>>(
        self,
        _name: &'static str,
        _fields: &'static [&'static str],
        visitor: V,
    ) -> Result<V::Value, D::Error> {
        self.0.deserialize_map(Struct(Wrap(visitor)))
    }

    fn deserialize_enum<V: Visitor<'de>>(
        self,
        name: &'static str,
        variants: &'static [&'static str],
        visitor: V,
    ) -> Result<V::Value, D::Error> {
        self.0.deserialize_enum(name, variants, Wrap(visitor))
    }

    fn is_human_readable(&self) -> bool {
        self.0.is_human_readable()
    }
}

/// A visitor, map, sequence, enum, variant or seed whose nested
/// deserializers are wrapped in [`ObjectsOnly`].
struct Wrap<T>(T);

/// A struct's visitor: says it expected an object (not `struct Name`, a
/// Rust type name the client knows nothing of).
struct Struct<V>(Wrap<V>);

macro_rules! forward_visits {
    ($($method:ident($ty:ty))*) => {
        $(
            fn $method<E: de::Error>(self, v: $ty) -> Result<Self::Value, E> {
                self.0.$method(v)
            }
        )*
    };
}

impl<'de, V: Visitor<'de>> Visitor<'de> for Wrap<V> {
    type Value = V::Value;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.0.expecting(f)
    }

    forward_visits! {
        visit_bool(bool) visit_i8(i8) visit_i16(i16) visit_i32(i32) visit_i64(i64)
        visit_i128(i128) visit_u8(u8) visit_u16(u16) visit_u32(u32) visit_u64(u64)
        visit_u128(u128) visit_f32(f32) visit_f64(f64) visit_char(char)
        visit_str(&str) visit_borrowed_str(&'de str) visit_string(String)
        visit_bytes(&[u8]) visit_borrowed_bytes(&'de [u8]) visit_byte_buf(Vec<u8>)
    }

    fn visit_none<E: de::Error>(self) -> Result<Self::Value, E> {
        self.0.visit_none()
    }

    fn visit_unit<E: de::Error>(self) -> Result<Self::Value, E> {
        self.0.visit_unit()
    }

    fn visit_some<D: Deserializer<'de>>(self, d: D) -> Result<Self::Value, D::Error> {
        self.0.visit_some(ObjectsOnly(d))
    }

    fn visit_newtype_struct<D: Deserializer<'de>>(self, d: D) -> Result<Self::Value, D::Error> {
        self.0.visit_newtype_struct(ObjectsOnly(d))
    }

    fn visit_seq<A: SeqAccess<'de>>(self, seq: A) -> Result<Self::Value, A::Error> {
        self.0.visit_seq(Wrap(seq))
    }

    fn visit_map<A: MapAccess<'de>>(self, map: A) -> Result<Self::Value, A::Error> {
        self.0.visit_map(Wrap(map))
    }

    fn visit_enum<A: EnumAccess<'de>>(self, data: A) -> Result<Self::Value, A::Error> {
        self.0.visit_enum(Wrap(data))
    }
}

impl<'de, V: Visitor<'de>> Visitor<'de> for Struct<V> {
    type Value = V::Value;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(OBJECT)
    }

    fn visit_map<A: MapAccess<'de>>(self, map: A) -> Result<Self::Value, A::Error> {
        self.0.visit_map(map)
    }
}

impl<'de, S: DeserializeSeed<'de>> DeserializeSeed<'de> for Wrap<S> {
    type Value = S::Value;

    fn deserialize<D: Deserializer<'de>>(self, d: D) -> Result<Self::Value, D::Error> {
        self.0.deserialize(ObjectsOnly(d))
    }
}

impl<'de, A: SeqAccess<'de>> SeqAccess<'de> for Wrap<A> {
    type Error = A::Error;

    fn next_element_seed<T: DeserializeSeed<'de>>(
        &mut self,
        seed: T,
    ) -> Result<Option<T::Value>, A::Error> {
        self.0.next_element_seed(Wrap(seed))
    }

    fn size_hint(&self) -> Option<usize> {
        self.0.size_hint()
    }
}

impl<'de, A: MapAccess<'de>> MapAccess<'de> for Wrap<A> {
    type Error = A::Error;

    fn next_key_seed<K: DeserializeSeed<'de>>(
        &mut self,
        seed: K,
    ) -> Result<Option<K::Value>, A::Error> {
        self.0.next_key_seed(Wrap(seed))
    }

    fn next_value_seed<T: DeserializeSeed<'de>>(&mut self, seed: T) -> Result<T::Value, A::Error> {
        self.0.next_value_seed(Wrap(seed))
    }

    fn size_hint(&self) -> Option<usize> {
        self.0.size_hint()
    }
}

impl<'de, A: EnumAccess<'de>> EnumAccess<'de> for Wrap<A> {
    type Error = A::Error;
    type Variant = Wrap<A::Variant>;

    fn variant_seed<T: DeserializeSeed<'de>>(
        self,
        seed: T,
    ) -> Result<(T::Value, Self::Variant), A::Error> {
        let (value, variant) = self.0.variant_seed(Wrap(seed))?;
        Ok((value, Wrap(variant)))
    }
}

impl<'de, A: VariantAccess<'de>> VariantAccess<'de> for Wrap<A> {
    type Error = A::Error;

    fn unit_variant(self) -> Result<(), A::Error> {
        self.0.unit_variant()
    }

    fn newtype_variant_seed<T: DeserializeSeed<'de>>(self, seed: T) -> Result<T::Value, A::Error> {
        self.0.newtype_variant_seed(Wrap(seed))
    }

    fn tuple_variant<V: Visitor<'de>>(self, len: usize, visitor: V) -> Result<V::Value, A::Error> {
        self.0.tuple_variant(len, Wrap(visitor))
    }

    /// A struct variant's body is an object too: its visitor only takes a
    /// map.
    fn struct_variant<V: Visitor<'de>>(
        self,
        fields: &'static [&'static str],
        visitor: V,
    ) -> Result<V::Value, A::Error> {
        self.0.struct_variant(fields, Struct(Wrap(visitor)))
    }
}

#[cfg(test)]
mod tests {
    use serde::Deserialize;
    use serde_json::value::RawValue;

    use super::*;

    #[derive(Debug, PartialEq, Deserialize)]
    #[serde(deny_unknown_fields)]
    struct Inner {
        a: i64,
        #[serde(default)]
        b: Option<String>,
    }

    #[derive(Debug, Deserialize)]
    #[serde(deny_unknown_fields)]
    struct Outer<'a> {
        #[serde(default)]
        items: Vec<Inner>,
        #[serde(default)]
        one: Option<Inner>,
        #[serde(borrow, default)]
        raw: Option<&'a RawValue>,
        #[serde(default)]
        boxed: Option<Box<RawValue>>,
        #[serde(borrow, default)]
        name: Option<&'a str>,
        #[serde(default)]
        kind: Option<Kind>,
    }

    #[derive(Debug, PartialEq, Deserialize)]
    #[serde(rename_all = "lowercase")]
    enum Kind {
        Plain,
        Point { x: i64 },
    }

    fn decode<'de, T: Deserialize<'de>>(s: &'de str) -> Result<T, String> {
        let mut de = serde_json::Deserializer::from_str(s);
        T::deserialize(ObjectsOnly(&mut de)).map_err(|e| e.to_string())
    }

    #[test]
    fn a_struct_decodes_only_from_an_object_at_every_depth() {
        for body in [
            r#"[[{"a":1}]]"#,
            r#"{"items":[[1]]}"#,
            r#"{"items":[{"a":1},[2,"x"]]}"#,
            r#"{"one":[1]}"#,
            r#"{"kind":{"point":[1]}}"#,
            r#""x""#,
            "null",
            "1",
            "true",
            "[]",
        ] {
            let e = decode::<Outer<'_>>(body).unwrap_err();
            assert!(e.contains("expected a JSON object"), "{body}: {e}");
        }
    }

    #[test]
    fn everything_else_decodes_as_without_the_wrapper_borrowing_included() {
        let body = r#"{"items":[{"a":1},{"a":2,"b":"x"}],"one":null,"raw":[1, {"k":2}],
            "boxed":{"z" : 1},"name":"plain","kind":{"point":{"x":3}}}"#;
        let o: Outer<'_> = decode(body).unwrap();
        assert_eq!(o.items, vec![Inner { a: 1, b: None }, Inner { a: 2, b: Some("x".into()) }]);
        assert_eq!(o.one, None);
        assert_eq!(o.raw.unwrap().get(), r#"[1, {"k":2}]"#);
        assert_eq!(o.boxed.unwrap().get(), r#"{"z" : 1}"#);
        assert_eq!(o.name, Some("plain"));
        assert_eq!(o.kind, Some(Kind::Point { x: 3 }));
        let o: Outer<'_> = decode(r#"{"kind":"plain","one":{"a":5}}"#).unwrap();
        assert_eq!((o.kind, o.one), (Some(Kind::Plain), Some(Inner { a: 5, b: None })));
        let e = decode::<Outer<'_>>(r#"{"x":1}"#).unwrap_err();
        assert!(e.starts_with("unknown field `x`"), "{e}");
    }
}
